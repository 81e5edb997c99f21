"""Sequence-length distributions of a dataset: what the simulator and the estimator consume (paper Fig. 2).

`LengthDistribution` is small and pure: token lengths (in dataset order; `sorted_lengths` ascending), the names of
the dataset, tokenizer and template that produced them, summary statistics, a histogram, and the padding cost of
batching (every batch is padded to its longest query, as LLaMA-Factory / HF collators do without packing).
`length_distribution(dataset, tokenizer, template)` measures one.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tunecost.errors import TunecostError
from tunecost.workload.templates import encode_queries

if TYPE_CHECKING:
    from tunecost.workload.datasets import Dataset
    from tunecost.workload.templates import Template
    from tunecost.workload.tokenizers import Tokenizer

BatchOrder = Literal["dataset", "sorted", "shuffled"]

PAD_TO_MULTIPLE_OF = 8  # the collators' pad_to_multiple_of (LLaMA-Factory's; the paper's transformers 4.40 stack)


def padded_length(tokens: int) -> int:
    """A batch's length as the collator pads it: up to a multiple of `PAD_TO_MULTIPLE_OF`."""
    return -(-tokens // PAD_TO_MULTIPLE_OF) * PAD_TO_MULTIPLE_OF


@dataclass(frozen=True, kw_only=True)
class HistogramBin:
    lo: int  # inclusive, tokens
    hi: int  # exclusive, tokens
    count: int


@dataclass(frozen=True, kw_only=True)
class LengthDistribution:
    """Token lengths of the queries of one dataset under one tokenizer and template."""

    lengths: tuple[int, ...]  # tokens per query, in dataset order
    dataset: str
    tokenizer: str
    template: str

    def __post_init__(self) -> None:
        if not self.lengths:
            raise TunecostError(f"length distribution of {self.dataset!r} is empty")
        if any((not isinstance(n, int)) or n <= 0 for n in self.lengths):
            raise TunecostError("token lengths must be positive integers")

    @functools.cached_property
    def sorted_lengths(self) -> tuple[int, ...]:
        return tuple(sorted(self.lengths))

    @property
    def num_queries(self) -> int:
        return len(self.lengths)

    @property
    def total_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def min_tokens(self) -> int:
        return self.sorted_lengths[0]

    @property
    def max_tokens(self) -> int:
        return self.sorted_lengths[-1]

    @property
    def mean_tokens(self) -> float:
        return self.total_tokens / self.num_queries

    @property
    def median_tokens(self) -> float:
        return self.percentile(50)

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100), linear interpolation between order statistics (numpy's default)."""
        if not 0 <= q <= 100:
            raise TunecostError(f"percentile must be within 0..100, got {q}")
        xs = self.sorted_lengths
        pos = (len(xs) - 1) * q / 100
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    def histogram(self, num_bins: int = 30, bin_width: int | None = None) -> tuple[HistogramBin, ...]:
        """Counts per token-length bin from the shortest to the longest query (`bin_width` wins if given)."""
        lo, hi = self.min_tokens, self.max_tokens + 1
        if bin_width is None:
            if num_bins <= 0:
                raise TunecostError(f"num_bins must be positive, got {num_bins}")
            bin_width = max(1, math.ceil((hi - lo) / num_bins))
        elif bin_width <= 0:
            raise TunecostError(f"bin_width must be positive, got {bin_width}")
        start = (lo // bin_width) * bin_width
        num = math.ceil((hi - start) / bin_width)
        counts = [0] * num
        for n in self.lengths:
            counts[(n - start) // bin_width] += 1
        return tuple(
            HistogramBin(lo=start + i * bin_width, hi=start + (i + 1) * bin_width, count=c)
            for i, c in enumerate(counts)
        )

    def _ordered(self, order: BatchOrder, seed: int) -> tuple[int, ...]:
        if order == "dataset":
            return self.lengths
        if order == "sorted":
            return self.sorted_lengths
        if order == "shuffled":
            xs = list(self.lengths)
            random.Random(seed).shuffle(xs)
            return tuple(xs)
        raise TunecostError(f"unknown batch order {order!r}; use dataset, sorted or shuffled")

    def padded_tokens(self, batch_size: int, order: BatchOrder = "dataset", seed: int = 0) -> int:
        """Tokens processed when every batch of `batch_size` queries is padded to its longest one
        (the last batch may be smaller). ``sorted`` groups similar lengths (least padding)."""
        if batch_size <= 0:
            raise TunecostError(f"batch size must be positive, got {batch_size}")
        xs = self._ordered(order, seed)
        return sum(max(xs[i : i + batch_size]) * len(xs[i : i + batch_size]) for i in range(0, len(xs), batch_size))

    def padding_waste(self, batch_size: int, order: BatchOrder = "dataset", seed: int = 0) -> float:
        """Fraction of processed tokens that are padding: 1 - real tokens / padded tokens."""
        return 1.0 - self.total_tokens / self.padded_tokens(batch_size, order, seed)

    def worst_batch_length(self, batch_size: int) -> int:
        """The longest padded sequence length any batch can have (the longest query): sizes memory peaks."""
        if batch_size <= 0:
            raise TunecostError(f"batch size must be positive, got {batch_size}")
        return self.max_tokens

    def summary(self) -> dict[str, float | int | str]:
        return {
            "dataset": self.dataset,
            "tokenizer": self.tokenizer,
            "template": self.template,
            "num_queries": self.num_queries,
            "total_tokens": self.total_tokens,
            "min_tokens": self.min_tokens,
            "median_tokens": self.median_tokens,
            "mean_tokens": round(self.mean_tokens, 2),
            "p90_tokens": self.percentile(90),
            "p99_tokens": self.percentile(99),
            "max_tokens": self.max_tokens,
        }


def length_distribution(dataset: Dataset, tokenizer: Tokenizer, template: Template) -> LengthDistribution:
    """Tokenize every query (prompt + response) of `dataset` and return its length distribution."""
    encoded = encode_queries(
        template, tokenizer, [e.prompt for e in dataset.examples], [e.response for e in dataset.examples]
    )
    return LengthDistribution(
        lengths=tuple(len(q.ids) for q in encoded),
        dataset=dataset.name,
        tokenizer=tokenizer.name,
        template=template.name,
    )
