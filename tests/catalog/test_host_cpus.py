"""The host CPU catalog: sourced rows, speeds from clocks and per-clock factors, names and aliases, each GPU's
default host, and one-line errors for bad files and unknown CPUs."""

from __future__ import annotations

import pytest

from tunecost.catalog.gpu_achieved import achieved_catalog
from tunecost.catalog.host_cpus import (
    REFERENCE_HOST,
    gpu_host,
    host_cpu_catalog,
    load_host_cpus,
    reference_system_hosts,
    resolve_host_cpu,
)
from tunecost.errors import TunecostError


def test_every_cpu_is_sourced_and_the_reference_host_has_speed_one():
    cpus, _ = host_cpu_catalog()
    assert all(c.sources.get("clock") and c.sources.get("per_clock") and c.as_of for c in cpus.values())
    assert cpus[REFERENCE_HOST].speed == pytest.approx(1.0)
    # speed = turbo clock ratio x per-clock factor
    spr = cpus["Xeon Platinum 8480C"]
    assert spr.speed == pytest.approx(3.8 / 3.4 * 1.19)
    assert cpus["EPYC 7763"].per_clock == pytest.approx(cpus["EPYC 7742"].per_clock * 1.19, rel=1e-3)
    # memory bandwidth = sockets x channels x MT/s x 8 bytes: Ice Lake 2 x 8 x DDR4-3200, Genoa 2 x 12 x DDR5-4800,
    # a Ryzen 9 7950X desktop 1 x 2 x DDR5-5200
    assert all(c.sources.get("memory") for c in cpus.values())
    assert cpus[REFERENCE_HOST].memory_bytes_per_s == pytest.approx(2 * 204.8e9)
    assert cpus["EPYC 9654"].memory_bytes_per_s == pytest.approx(2 * 460.8e9)
    assert cpus["Ryzen 9 7950X"].memory_bytes_per_s == pytest.approx(83.2e9)


def test_names_and_aliases_resolve_and_unknown_lists_the_known():
    assert resolve_host_cpu("8480C").name == "Xeon Platinum 8480C"
    assert resolve_host_cpu("AMD EPYC 7742").name == "EPYC 7742"
    assert resolve_host_cpu("intel xeon platinum 8380").name == REFERENCE_HOST
    with pytest.raises(TunecostError, match="unknown host CPU 'Xeon 9999'; known: .*EPYC 7742"):
        resolve_host_cpu("Xeon 9999")


def test_default_hosts_named_or_reference_system_or_reference():
    assert gpu_host("H100-80GB-SXM").cpu.name == "Xeon Platinum 8480C"  # DGX H100
    assert "assumed" in gpu_host("H100-80GB-SXM").origin
    assert gpu_host("A40-48GB").cpu.name == REFERENCE_HOST  # no reference system: the reference host
    assert gpu_host("A100-80GB-SXM").cpu.name == REFERENCE_HOST  # see gpu_hosts.csv: the data contradict EPYC 7742
    named = gpu_host("H100-80GB-SXM", "EPYC 9654")
    assert named.cpu.name == "EPYC 9654" and "named" in named.origin
    assert set(reference_system_hosts()) <= set(achieved_catalog())  # every listed GPU is a catalog GPU


def test_bad_rows_name_the_file_and_row(tmp_path):
    path = tmp_path / "cpus.csv"
    header = "name,aliases,max_turbo_ghz,source_clock,core,per_clock,source_per_clock,"
    header += "memory_channels,memory_mt_s,sockets,as_of\n"
    path.write_text(header + f"{REFERENCE_HOST},,fast,x,Sunny Cove,1,x,8,3200,2,2026-01-01\n")
    with pytest.raises(TunecostError, match="row 1: column 'max_turbo_ghz' is not a number"):
        load_host_cpus(path)
    path.write_text(header + f"{REFERENCE_HOST},,3.4,x,Sunny Cove,0,x,8,3200,2,2026-01-01\n")
    with pytest.raises(
        TunecostError, match="row 1: max_turbo_ghz, per_clock, memory_channels, memory_mt_s, sockets must be > 0"
    ):
        load_host_cpus(path)
    path.write_text(header + f"{REFERENCE_HOST},,3.4,x,Sunny Cove,1,x,0,3200,2,2026-01-01\n")
    with pytest.raises(TunecostError, match="row 1: .* memory_channels, .* must be > 0"):
        load_host_cpus(path)
    row = "3.4,x,c,1,x,8,3200,2,2026-01-01"
    path.write_text(header + f"{REFERENCE_HOST},8380,{row}\nOther,8380,{row}\n")
    with pytest.raises(TunecostError, match="row 2: '8380' already names"):
        load_host_cpus(path)
    path.write_text(header + f"Other,,{row}\n")
    with pytest.raises(TunecostError, match="reference host .* is missing"):
        load_host_cpus(path)


@pytest.mark.parametrize(
    ("model_name", "expected"),
    [
        ("Intel(R) Xeon(R) Platinum 8480C", "Xeon Platinum 8480C"),
        ("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", "Xeon Platinum 8380"),
        ("AMD EPYC 7742 64-Core Processor", "EPYC 7742"),
        ("Intel(R) Xeon(R) Platinum 8480+", "Xeon Platinum 8480+"),
        ("AMD Ryzen 9 7950X 16-Core Processor", "Ryzen 9 7950X"),
        ("AMD Ryzen 7 5800X3D 8-Core Processor", None),
        ("", None),
    ],
)
def test_a_cpuinfo_model_name_finds_its_catalog_cpu(model_name, expected):
    from tunecost.catalog.host_cpus import host_cpu_from_model_name

    found = host_cpu_from_model_name(model_name)
    assert (found.name if found else None) == expected
