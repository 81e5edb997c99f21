"""Sequence lengths as the throughput model sees them (tunecost.estimate.throughput.lengths)."""

from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate.throughput.lengths import (
    PAPER_CUTOFF_TOKENS,
    dataset_lengths,
    empirical_lengths,
    expected_max_of_sample,
    fixed_lengths,
    lognormal_lengths,
)


def test_expected_max_by_hand() -> None:
    # lengths {1, 2}, two draws with replacement: max is 1 with probability 1/4, else 2 -> 1.75
    assert expected_max_of_sample([1, 2], 2) == pytest.approx(1.75)
    assert expected_max_of_sample([3, 5, 10], 1) == pytest.approx(6.0)  # one draw: the mean
    # padded up to multiples of 8 first: {8, 16} -> 8/4 + 16 * 3/4 = 14
    assert expected_max_of_sample([1, 9], 2, pad_to_multiple_of=8) == pytest.approx(14.0)


def test_empirical_lengths_pad_to_the_longest_and_cut() -> None:
    lens = empirical_lengths([10, 20, 30, 5000], 4)
    assert lens.mean_len_tokens == pytest.approx((10 + 20 + 30 + PAPER_CUTOFF_TOKENS) / 4)
    assert lens.padded_len_tokens <= PAPER_CUTOFF_TOKENS
    assert lens.tokens_per_step == pytest.approx(4 * lens.padded_len_tokens)


def test_lognormal_padding_grows_with_batch_and_saturates_at_the_cutoff() -> None:
    padded = [lognormal_lengths(174, b).padded_len_tokens for b in (1, 2, 4, 8, 32)]
    assert padded == sorted(padded)
    assert padded[0] >= 174  # E[max of 1] = mean >= median for a log-normal
    assert lognormal_lengths(900, 64, log_sigma=1.0).padded_len_tokens <= PAPER_CUTOFF_TOKENS
    # no spread: every query is the median, padded up to a multiple of 8
    assert lognormal_lengths(79, 8, log_sigma=0.0).padded_len_tokens == pytest.approx(80)


def test_dataset_lengths_use_the_paper_medians() -> None:
    cs, math = dataset_lengths("commonsense_15k", 1), dataset_lengths("math_14k", 1)
    assert math.mean_len_tokens > 2 * cs.mean_len_tokens * 0.9  # medians 174 vs 79
    assert "79" in cs.source and "174" in math.source


def test_fixed_lengths_and_bad_input() -> None:
    assert fixed_lengths(128, 3).tokens_per_step == 384
    with pytest.raises(TunecostError):
        fixed_lengths(128, 0)
    with pytest.raises(TunecostError):
        empirical_lengths([], 2)
    with pytest.raises(TunecostError, match="unknown dataset"):
        dataset_lengths("nope", 1)
