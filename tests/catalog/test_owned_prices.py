"""Owned hardware in the price catalog: a --prices row at 0 $/GPU-hour, or from provider "owned" at what running
the GPU costs (electricity), is priced like a rented GPU and labelled "owned" (catalog/prices.py)."""

from __future__ import annotations

import pytest

from tunecost.catalog.prices import (
    Price,
    billed_gpus,
    cheapest_for,
    cheapest_price,
    price_catalog,
    price_label,
    prices_for,
)
from tunecost.errors import TunecostError
from tunecost.estimate.paper import cost_usd, usd_for_hours

HEADER = "provider,gpu,usd_per_gpu_hour,date,source_url,notes\n"
# Two 4090s at home: one free (already paid for), one at its electricity (450 W x $0.11/kWh ~ $0.05/GPU-hour).
OWNED_ROWS = (
    "owned,RTX4090,0,2025-06-01,https://example.com/receipt,bought in 2023\n"
    "home,H100,0,2025-06-01,https://example.com/lab,lab GPU\n"
    "Owned,A40,0.05,2025-06-01,https://example.com/bill,electricity\n"
)


@pytest.fixture
def owned_file(write_file):
    return write_file("owned.csv", HEADER + OWNED_ROWS)


def _price(provider: str, usd: float, gpus_per_unit: int = 1) -> Price:
    return Price(
        provider=provider,
        gpu="H100-80GB-SXM",
        usd_per_gpu_hour=usd,
        date="2025-06-01",
        source_url="https://example.com",
        gpus_per_unit=gpus_per_unit,
    )


def test_owned_rows_are_accepted_and_labelled(owned_file) -> None:
    merged = price_catalog(owned_file)
    assert len(merged) == len(price_catalog()) + 3
    (free,) = prices_for("RTX4090-24GB", merged, "owned")
    (lab,) = prices_for("H100-80GB-SXM", merged, "home")
    (power,) = prices_for("A40-48GB", merged, "OWNED")  # provider names: any case
    assert len([p for p in merged if p.owned]) == 3
    assert {p.gpu for name in ("owned", "Owned") for p in merged if p.provider == name} == {"RTX4090-24GB", "A40-48GB"}
    assert (free.usd_per_gpu_hour, lab.usd_per_gpu_hour, power.usd_per_gpu_hour) == (0.0, 0.0, 0.05)
    assert free.owned and lab.owned and power.owned  # provider "owned", or a price of exactly 0
    assert price_label(free) == "owned"
    assert price_label(lab) == "owned"  # a $0 row is owned whatever its provider is called
    assert price_label(power) == "owned ($0.05/GPU-h electricity)"
    assert not any(p.owned for p in price_catalog())  # every bundled price is rented, > 0


@pytest.mark.parametrize(
    ("provider", "usd", "owned", "label"),
    [
        ("owned", 0.0, True, "owned"),
        ("OWNED", 0.12, True, "owned ($0.12/GPU-h electricity)"),
        ("owned", 0.001, True, "owned ($0.001/GPU-h electricity)"),  # under half a cent: not "$0.00"
        ("mylab", 0.0, True, "owned"),
        ("runpod", 2.5, False, "runpod"),
        ("owned-cloud", 1.0, False, "owned-cloud"),  # only the exact name "owned" marks owned GPUs
    ],
)
def test_owned_and_price_label(provider: str, usd: float, owned: bool, label: str) -> None:
    price = _price(provider, usd)
    assert price.owned is owned
    assert price_label(price) == label


def test_minus_zero_is_zero(write_file) -> None:
    path = write_file("p.csv", HEADER + "owned,A40,-0,2025-06-01,https://example.com/a,\n")
    (row,) = prices_for("A40-48GB", price_catalog(path), "owned")
    assert row.owned and price_label(row) == "owned" and f"{row.usd_per_gpu_hour:.2f}" == "0.00"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-0.05", r"row 2: usd_per_gpu_hour must be >= 0 \(0: owned hardware\), got -0.05"),
        ("-1", "row 2: usd_per_gpu_hour must be >= 0"),
        ("nan", "row 2: column 'usd_per_gpu_hour' must be a finite number"),
        ("inf", "row 2: column 'usd_per_gpu_hour' must be a finite number"),
        ("-inf", "row 2: column 'usd_per_gpu_hour' must be a finite number"),
    ],
)
def test_negative_or_infinite_price_is_still_an_error(write_file, value: str, message: str) -> None:
    path = write_file(
        "bad.csv", HEADER + "owned,A40,0,2025-06-01,https://x.org,\n" + f"p,L4,{value},2025-06-01,https://x.org,\n"
    )
    with pytest.raises(TunecostError, match=message) as info:
        price_catalog(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_cheapest_picks_the_owned_row(owned_file) -> None:
    merged = price_catalog(owned_file)
    (free,) = prices_for("H100-80GB-SXM", merged, "home")
    assert prices_for("H100-80GB-SXM", merged)[0] == free  # $0 sorts first
    assert prices_for("H100-80GB-SXM", merged, whole_nodes=True)[0] == free
    assert cheapest_price("h100", prices_file=owned_file) == free
    assert cheapest_price("4090", prices_file=owned_file).provider == "owned"
    for num_gpus in (1, 2, 8, 16):
        assert cheapest_for(num_gpus, prices_for("H100-80GB-SXM", merged, whole_nodes=True)) == free


def test_owned_cost_is_zero_or_electricity() -> None:
    free = _price("owned", 0.0)
    assert billed_gpus(2, free) == 2
    assert usd_for_hours(hours=10.0, usd_per_gpu_hour=free.usd_per_gpu_hour, num_gpus=2) == 0.0
    # 1000 queries / 1 query/s = 1000 s; 2 GPUs x 1000/3600 h x $0.05 = $0.02778
    power = _price("owned", 0.05)
    got = cost_usd(num_queries=1000, epochs=1, queries_per_s=1.0, usd_per_gpu_hour=power.usd_per_gpu_hour, num_gpus=2)
    assert got == pytest.approx(2 * 1000 / 3600 * 0.05)
    with pytest.raises(TunecostError, match=r"price must be >= 0 \$/GPU-hour"):
        usd_for_hours(hours=1.0, usd_per_gpu_hour=-0.01)
    # a free row beats a cheaper-per-GPU node row whatever the GPU count
    assert cheapest_for(3, [_price("cloud", 0.5, gpus_per_unit=8), free]) == free


def test_cost_cli_at_zero_dollars(cli_ok) -> None:
    out = cli_ok("cost", queries=1000, epochs=1, throughput=1, usd_per_hour=0).stdout
    assert "0.28 h" in out  # 1000 queries / 1 query/s = 1000 s
    assert "$0.00" in out


def test_cost_cli_takes_the_owned_price(cli_ok, owned_file) -> None:
    out = cli_ok("cost", queries=1000, epochs=1, throughput=1, gpu="4090", prices=owned_file).stdout
    assert "owned" in out and "$0.00" in out


def test_prices_cli_shows_owned(cli_ok, owned_file) -> None:
    out = cli_ok("prices", prices=owned_file).stdout
    rows = {line.split("│")[6].strip(): line for line in out.splitlines() if "example.com/" in line}
    assert set(rows) == {"https://example.com/receipt", "https://example.com/lab", "https://example.com/bill"}
    assert all("│ owned" in line for line in rows.values())
    assert "owned ($0.05/GPU-h" in rows["https://example.com/bill"]
    assert "│ home" not in out  # a $0 row reads "owned", not its provider's name
