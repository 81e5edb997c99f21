"""Node-granular prices: a price row that rents whole nodes of K GPUs bills N GPUs rounded up to whole nodes,
per-GPU rows stay as they were, and the multi-GPU estimate picks the row with the lowest bill for each count."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_jobs import tiny_job

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.catalog.prices import Price, billed_gpus, cheapest_for, load_prices, price_catalog, prices_for
from tunecost.errors import TunecostError
from tunecost.estimate.gpu_search import estimate_multi_gpu
from tunecost.workload.job import LoraConfig

NODE_PRICES = Path(__file__).parents[1] / "fixtures" / "distributed" / "node_prices.csv"
H100 = "H100-80GB-SXM"


def _price(usd: float, unit: int) -> Price:
    return Price(provider="p", gpu=H100, usd_per_gpu_hour=usd, date="2026-11-25", source_url="u", gpus_per_unit=unit)


@pytest.mark.parametrize(("num_gpus", "billed"), [(1, 8), (7, 8), (8, 8), (9, 16), (16, 16), (17, 24)])
def test_whole_nodes_are_billed(num_gpus, billed):
    assert billed_gpus(num_gpus, _price(2.0, 8)) == billed
    assert billed_gpus(num_gpus, _price(2.0, 1)) == num_gpus


def test_the_lowest_bill_wins_for_each_count():
    """8 GPUs at $3.99 in nodes of 8 vs $4.29 singly (Lambda's H100 rows): 6 GPUs cost 6 x 4.29 = 25.74 singly,
    8 x 3.99 = 31.92 as a node; 8 GPUs cost 31.92 as a node, 34.32 singly."""
    single, node = _price(4.29, 1), _price(3.99, 8)
    assert cheapest_for(6, [node, single]) is single
    assert cheapest_for(8, [node, single]) is node
    assert cheapest_for(8, []) is None


def test_catalog_node_rows_are_kept_apart_from_per_gpu_rows():
    catalog = price_catalog()
    lambda_h100 = prices_for(H100, catalog, "lambda", whole_nodes=True)
    assert sorted((p.usd_per_gpu_hour, p.gpus_per_unit) for p in lambda_h100) == [(3.99, 8), (4.29, 1)]
    assert [p.gpus_per_unit for p in prices_for(H100, catalog, "lambda")] == [1]  # one GPU: per-GPU rows only
    aws = next(p for p in prices_for(H100, catalog, "aws", whole_nodes=True) if p.gpus_per_unit == 8)
    assert aws.usd_per_unit_hour == pytest.approx(55.04)  # p5.48xlarge's hourly price


def test_a_prices_file_adds_node_rows():
    (row,) = load_prices(NODE_PRICES)
    assert (row.provider, row.gpus_per_unit, row.usd_per_gpu_hour) == ("nodes-only", 8, 2.0)


def test_a_bad_unit_is_an_error(tmp_path):
    bad = tmp_path / "prices.csv"
    bad.write_text(NODE_PRICES.read_text().replace("fixture,8", "fixture,0"), encoding="utf-8")
    with pytest.raises(TunecostError, match="gpus_per_unit must be a whole number >= 1"):
        load_prices(bad)


def test_the_multi_gpu_cost_rounds_up_to_whole_nodes():
    """Two H100s from a provider that rents nodes of 8: billed for 8, so the dollars are hours x 8 x $2."""
    job = tiny_job("tiny-mixtral-2l", "lora", LoraConfig(rank=8, targets=("attention",)))
    answer = estimate_multi_gpu(
        job,
        gpus=[resolve_gpu_name("H100").gpu],
        strategies=["ddp"],
        num_gpus=2,
        provider="nodes-only",
        prices_file=NODE_PRICES,
        num_queries=100,
        epochs=1,
    )
    (setup,) = answer.setups
    assert setup.cost is not None and setup.cost.billed_gpus == 8
    assert setup.usd == pytest.approx(setup.cost.hours * 8 * 2.0)
