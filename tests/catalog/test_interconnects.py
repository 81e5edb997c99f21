"""The interconnect catalog: every row sourced and dated, names and aliases resolve, bad files are one-line errors."""

from __future__ import annotations

import pytest

from tunecost.catalog.interconnects import interconnect_catalog, load_interconnects, resolve_interconnect
from tunecost.errors import TunecostError


def test_catalog_rows_are_sourced_and_ordered_by_link_class():
    links = {link.name: link for link in interconnect_catalog()}
    assert {"NVLink3", "NVLink4", "PCIe4", "PCIe5", "InfiniBand-HDR", "InfiniBand-NDR"} <= set(links)
    assert all(link.source and link.as_of for link in links.values())
    assert links["NVLink4"].bus_bandwidth_bytes_per_s > links["NVLink3"].bus_bandwidth_bytes_per_s
    assert links["InfiniBand-NDR"].bus_bandwidth_bytes_per_s == 2 * links["InfiniBand-HDR"].bus_bandwidth_bytes_per_s
    assert links["InfiniBand-NDR"].scope == "nic"


def test_resolve_by_alias_and_unknown_name():
    assert resolve_interconnect("NDR").name == "InfiniBand-NDR"
    with pytest.raises(TunecostError, match="unknown interconnect 'nvlink6'.*Did you mean"):
        resolve_interconnect("nvlink6")


def test_bad_row_names_the_file_and_row(tmp_path):
    path = tmp_path / "links.csv"
    path.write_text(
        "name,aliases,scope,bus_bandwidth_gb_s,latency_us,setup,as_of,source,uncertain,notes\n"
        "X,,rack,10,1,,2026-01-01,somewhere,no,\n"
    )
    with pytest.raises(TunecostError, match="row 1: scope"):
        load_interconnects(path)
