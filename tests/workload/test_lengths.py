from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.datasets import load_dataset
from tunecost.workload.lengths import LengthDistribution, length_distribution
from tunecost.workload.templates import template_by_name
from tunecost.workload.tokenizers import tokenizer_by_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def dist(*lengths: int) -> LengthDistribution:
    return LengthDistribution(lengths=tuple(lengths), dataset="d", tokenizer="t", template="none")


def test_statistics_by_hand():
    d = dist(3, 1, 4, 1, 5)
    assert d.sorted_lengths == (1, 1, 3, 4, 5)
    assert (d.num_queries, d.total_tokens, d.min_tokens, d.max_tokens) == (5, 14, 1, 5)
    assert d.median_tokens == 3 and d.mean_tokens == pytest.approx(2.8)
    assert d.percentile(0) == 1 and d.percentile(100) == 5
    assert d.percentile(90) == pytest.approx(4.6)  # numpy's linear interpolation: 4 + 0.6 * (5 - 4)
    assert dist(10, 20).median_tokens == 15


def test_padding_by_hand():
    d = dist(3, 1, 4, 1, 5)
    # dataset order, batch 2: [3,1] -> 2x3, [4,1] -> 2x4, [5] -> 1x5
    assert d.padded_tokens(2, "dataset") == 6 + 8 + 5
    # sorted: [1,1] -> 2, [3,4] -> 8, [5] -> 5
    assert d.padded_tokens(2, "sorted") == 2 + 8 + 5
    assert d.padding_waste(2, "dataset") == pytest.approx(1 - 14 / 19)
    assert d.padding_waste(1) == 0.0
    assert d.padded_tokens(5) == 25
    assert d.worst_batch_length(2) == 5
    shuffled = d.padded_tokens(2, "shuffled", seed=3)
    assert 15 <= shuffled <= 25 and shuffled == d.padded_tokens(2, "shuffled", seed=3)


def test_histogram_covers_every_query():
    d = dist(*range(1, 101))
    bins = d.histogram(num_bins=10)
    assert sum(b.count for b in bins) == 100
    assert bins[0].lo <= 1 and bins[-1].hi > 100
    assert all(b.hi - b.lo == bins[0].hi - bins[0].lo for b in bins)
    assert [b.count for b in d.histogram(bin_width=50)] == [49, 50, 1]  # [0,50) [50,100) [100,150)


def test_bad_input():
    with pytest.raises(TunecostError):
        dist()
    with pytest.raises(TunecostError):
        dist(0, 3)
    with pytest.raises(TunecostError):
        dist(1, 2).padded_tokens(0)
    with pytest.raises(TunecostError):
        dist(1, 2).percentile(101)
    with pytest.raises(TunecostError):
        dist(1, 2).padded_tokens(1, "random")  # type: ignore[arg-type]


def test_length_distribution_counts_bos_prompt_and_response():
    tok = tokenizer_by_name("mistral")
    ds = load_dataset(str(FIXTURES / "llm_adapters_math.json"))
    d = length_distribution(ds, tok, template_by_name("none"))
    expected = [1 + len(tok.encode(e.prompt + e.response)) for e in ds.examples]
    assert list(d.lengths) == expected
    assert d.dataset == "llm_adapters_math" and d.tokenizer == tok.name and d.template == "none"
    # The mistral template adds "[INST] ", " [/INST]" and EOS to every query.
    longer = length_distribution(ds, tok, template_by_name("mistral"))
    assert all(b > a for a, b in zip(d.lengths, longer.lengths))
