"""The price catalog (data/prices.csv): every row dated and sourced, the paper's prices, user overrides."""

from __future__ import annotations

import re

import pytest

from tunecost.catalog.gpus import gpu_catalog
from tunecost.catalog.prices import load_prices, price_catalog, prices_for, providers
from tunecost.errors import TunecostError

HEADER = "provider,gpu,usd_per_gpu_hour,date,source_url,notes\n"


@pytest.mark.parametrize("price", price_catalog(), ids=lambda p: f"{p.provider}:{p.gpu}")
def test_every_price_row_has_date_and_source(price) -> None:
    assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", price.date)
    assert re.match(r"https?://\S+$", price.source_url)
    assert price.usd_per_gpu_hour > 0
    assert price.gpu in gpu_catalog()  # canonical GPU names only
    assert price.provider


def test_one_row_per_provider_gpu_and_rented_unit() -> None:
    """A provider may rent a GPU singly and as whole nodes: one row each."""
    keys = [(p.provider.lower(), p.gpu, p.gpus_per_unit) for p in price_catalog()]
    assert len(keys) == len(set(keys))
    assert len({(p.provider.lower(), p.gpu) for p in price_catalog() if p.gpus_per_unit == 1}) == sum(
        p.gpus_per_unit == 1 for p in price_catalog()
    )


def test_paper_prices() -> None:
    # Table IV (CUDO Compute, as provider paper-2024): A40 0.79, A100-80GB 1.67, H100 2.1 $/h
    paper = {p.gpu: p.usd_per_gpu_hour for p in price_catalog() if p.provider == "paper-2024"}
    assert paper == {"A40-48GB": 0.79, "A100-80GB-SXM": 1.67, "H100-80GB-SXM": 2.1}


def test_prices_for_sorted_and_filtered() -> None:
    rows = prices_for("H100-80GB-SXM", price_catalog())
    assert len(rows) > 1
    assert [p.usd_per_gpu_hour for p in rows] == sorted(p.usd_per_gpu_hour for p in rows)
    (paper,) = prices_for("H100-80GB-SXM", price_catalog(), "PAPER-2024")  # provider names: any case
    assert paper.usd_per_gpu_hour == 2.1 and paper.date == "2024-08-08"


def test_unknown_provider_lists_valid_names() -> None:
    with pytest.raises(TunecostError) as info:
        prices_for("A40-48GB", price_catalog(), "nocloud")
    message = str(info.value)
    assert message.startswith("unknown provider 'nocloud'.")
    for name in providers(price_catalog()):
        assert name in message


def test_user_file_overrides_and_extends(tmp_path) -> None:
    extra = tmp_path / "mine.csv"
    extra.write_text(
        "# my prices\n"
        + HEADER
        + "paper-2024,a40,0.55,2025-03-01,https://example.com/a40,renegotiated\n"
        + "myco,H100,1.23,2025-03,https://example.com/h100,\n"
    )
    merged = price_catalog(extra)
    assert len(merged) == len(price_catalog()) + 1  # one overridden, one added
    (a40,) = prices_for("A40-48GB", merged, "paper-2024")
    assert (a40.usd_per_gpu_hour, a40.date, a40.source_url) == (0.55, "2025-03-01", "https://example.com/a40")
    (mine,) = prices_for("H100-80GB-SXM", merged, "myco")
    assert (mine.usd_per_gpu_hour, mine.date) == (1.23, "2025-03")
    # the built-in catalog is unchanged
    assert prices_for("A40-48GB", price_catalog(), "paper-2024")[0].usd_per_gpu_hour == 0.79


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("p,A40,abc,2025-01-01,https://x.org", r"row 2: column 'usd_per_gpu_hour' is not a number: 'abc'"),
        ("p,A40,-1,2025-01-01,https://x.org", "row 2: usd_per_gpu_hour must be >= 0"),  # 0 is owned hardware
        ("p,A40,1.0,01/02/2025,https://x.org", "row 2: date must be YYYY-MM-DD"),
        ("p,A40,1.0,,https://x.org", "row 2: date must be YYYY-MM-DD"),
        ("p,A40,1.0,2025-01-01,", "row 2: every price needs a source_url"),
        (",A40,1.0,2025-01-01,https://x.org", "row 2: empty provider"),
        ("p,TPU-v5e,1.0,2025-01-01,https://x.org", "row 2: unknown GPU 'TPU-v5e'"),
        ("p,A40,nan,2025-01-01,https://x.org", "row 2"),  # a NaN price must not slip through
    ],
)
def test_bad_price_row_is_named(tmp_path, row: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "p,A40,1.0,2025-01-01,https://x.org\n" + row + "\n")
    with pytest.raises(TunecostError, match=message) as info:
        price_catalog(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_price_file_missing_column_and_missing_file(tmp_path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("provider,gpu,usd_per_gpu_hour\np,A40,1\n")
    with pytest.raises(TunecostError, match=r"missing column\(s\) date, source_url"):
        load_prices(path)
    with pytest.raises(TunecostError, match="catalog file not found"):
        price_catalog(tmp_path / "nope.csv")
