"""Training inputs for a profile: synthetic token ids at a fixed length (the paper's latency runs: random ids,
sequence length 128), random ids with a dataset's length distribution, or a real tokenized dataset.

A `BatchSource` hands out padded batches in a fixed order, so the instrumented and the plain run of a point train
on exactly the same batches; `longest_batch(b)` is the worst case a max-batch-size probe must fit.
Padding is on the right; labels are -100 on padding (and, for a dataset, on the prompt: the loss is on the
response, as LLaMA-Factory trains).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tunecost.errors import TunecostError
from tunecost.workload.datasets import load_dataset
from tunecost.workload.templates import encode_queries, template_by_name
from tunecost.workload.tokenizers import tokenizer_by_name

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Batch:
    input_ids: Any  # (B, L) int64
    attention_mask: Any  # (B, L) int64, 1 = real token
    labels: Any  # (B, L) int64, -100 = no loss

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int(self.attention_mask.sum())

    @property
    def padded_tokens(self) -> int:
        return self.batch_size * self.seq_len

    def to(self, device: Any) -> Batch:
        return Batch(
            self.input_ids.to(device, non_blocking=True),
            self.attention_mask.to(device, non_blocking=True),
            self.labels.to(device, non_blocking=True),
        )

    def model_kwargs(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "labels": self.labels}


@dataclass(frozen=True)
class Query:
    ids: tuple[int, ...]
    num_prompt_tokens: int = 0  # tokens without loss at the start


def pad_batch(queries: Sequence[Query], pad_id: int) -> Batch:
    import torch

    if not queries:
        raise ValueError("empty batch")
    length = max(len(q.ids) for q in queries)
    ids = torch.full((len(queries), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(queries), length), dtype=torch.long)
    labels = torch.full((len(queries), length), IGNORE_INDEX, dtype=torch.long)
    for row, q in enumerate(queries):
        n = len(q.ids)
        ids[row, :n] = torch.tensor(q.ids, dtype=torch.long)
        mask[row, :n] = 1
        labels[row, q.num_prompt_tokens : n] = ids[row, q.num_prompt_tokens : n]
    return Batch(ids, mask, labels)


class BatchSource:
    """Queries in a fixed order, served as batches. `describe()` gives the workload keys (seq_len, dataset)."""

    def __init__(
        self, queries: Sequence[Query], *, pad_id: int, seq_len: int | None, dataset: str | None, cycle: bool = False
    ) -> None:
        if not queries:
            raise TunecostError("no queries to train on")
        self.queries = list(queries)
        self.pad_id = pad_id
        self.seq_len = seq_len
        self.dataset = dataset
        self.cycle = cycle  # synthetic sources can make as many queries as asked

    def __len__(self) -> int:
        return len(self.queries)

    def describe(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "dataset": self.dataset}

    def check_enough(self, batch_size: int, num_batches: int) -> None:
        need = batch_size * num_batches
        if not self.cycle and need > len(self.queries):
            raise TunecostError(
                f"dataset {self.dataset!r} has {len(self.queries)} queries, but {num_batches} steps at batch size "
                f"{batch_size} need {need}; lower --steps or the batch size, or use a larger dataset"
            )

    def batches(self, batch_size: int, num_batches: int) -> list[Batch]:
        """`num_batches` consecutive batches from the start (the same ones on every call)."""
        return list(self.iter_batches(batch_size, num_batches))

    def iter_batches(self, batch_size: int, num_batches: int) -> Iterator[Batch]:
        """The batches of `batches`, one at a time (checks the source is large enough before the first)."""
        self.check_enough(batch_size, num_batches)
        return self._iter_batches(batch_size, num_batches)

    def _iter_batches(self, batch_size: int, num_batches: int) -> Iterator[Batch]:
        n = len(self.queries)
        for b in range(num_batches):
            rows = [self.queries[(b * batch_size + i) % n] for i in range(batch_size)]
            yield pad_batch(rows, self.pad_id)

    def longest_batch(self, batch_size: int) -> Batch:
        """The `batch_size` longest queries, padded: the largest batch this source can produce."""
        longest = sorted(self.queries, key=lambda q: len(q.ids), reverse=True)
        rows = [longest[i % len(longest)] for i in range(batch_size)]
        return pad_batch(rows, self.pad_id)

    @property
    def max_length(self) -> int:
        return max(len(q.ids) for q in self.queries)

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(len(q.ids) for q in self.queries)


def _random_ids(rng: Any, vocab_size: int, length: int) -> tuple[int, ...]:
    return tuple(int(v) for v in _random_row(rng, vocab_size, length))


def _random_row(rng: Any, vocab_size: int, length: int) -> Any:
    # Skip the first ids (special tokens in most vocabularies): random text, as the paper's latency runs used.
    low = min(3, vocab_size - 1)
    return rng.integers(low, vocab_size, size=length)


class SyntheticSource(BatchSource):
    """Random token ids, every query `seq_len` long, made when a batch is asked for: nothing is held between
    batches, so memory follows the batch being built, not the number of queries. Query i is the i-th draw of a
    generator seeded with `seed` (cycling after `num_queries`), the same ids on every call."""

    def __init__(self, *, vocab_size: int, seq_len: int, num_queries: int, seed: int) -> None:
        if num_queries < 1:
            raise TunecostError("no queries to train on")
        self.vocab_size = vocab_size
        self.num_queries = num_queries
        self.seed = seed
        self.pad_id = 0
        self.seq_len = seq_len
        self.length: int = seq_len  # the same, typed int
        self.dataset = None
        self.cycle = True

    def __len__(self) -> int:
        return self.num_queries

    @property
    def queries(self) -> list[Query]:  # type: ignore[override]
        """Every query, built on demand (a list of `num_queries`: for small sources and tests)."""
        rng = self._rng()
        return [Query(_random_ids(rng, self.vocab_size, self.length)) for _ in range(self.num_queries)]

    def _rng(self) -> Any:
        import numpy as np

        return np.random.default_rng(self.seed)

    def iter_batches(self, batch_size: int, num_batches: int) -> Iterator[Batch]:
        import numpy as np
        import torch

        self.check_enough(batch_size, num_batches)
        rng, made = self._rng(), 0
        first: list[Any] = []  # the first `num_queries` rows, kept only when a call cycles past them
        keep = batch_size * num_batches > self.num_queries
        for _ in range(num_batches):
            rows = np.empty((batch_size, self.length), dtype=np.int64)
            for row in range(batch_size):
                if made < self.num_queries:
                    rows[row] = _random_row(rng, self.vocab_size, self.length)
                    if keep:
                        first.append(rows[row].copy())
                else:
                    rows[row] = first[made % self.num_queries]
                made += 1
            ids = torch.from_numpy(rows)
            yield Batch(ids, torch.ones_like(ids), ids.clone())

    def longest_batch(self, batch_size: int) -> Batch:
        return next(self.iter_batches(batch_size, 1))

    @property
    def max_length(self) -> int:
        return self.length

    @property
    def lengths(self) -> tuple[int, ...]:
        return (self.length,) * self.num_queries


def synthetic_source(*, vocab_size: int, seq_len: int, num_queries: int = 64, seed: int = 0) -> SyntheticSource:
    """Random token ids, every query exactly `seq_len` long (loss on every token), made batch by batch."""
    if seq_len < 2:
        raise TunecostError(f"sequence length must be at least 2 tokens, got {seq_len}")
    return SyntheticSource(vocab_size=vocab_size, seq_len=seq_len, num_queries=num_queries, seed=seed)


def lengths_source(
    *, vocab_size: int, lengths: Sequence[int], dataset: str, seed: int = 0, max_length: int | None = None
) -> BatchSource:
    """Random token ids with the given per-query lengths (a dataset's shape without its text)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cut = [min(n, max_length) if max_length else n for n in lengths]
    queries = [Query(_random_ids(rng, vocab_size, max(2, n))) for n in cut]
    return BatchSource(queries, pad_id=0, seq_len=None, dataset=dataset)


def dataset_source(
    name: str,
    *,
    vocab_size: int,
    tokenizer: str = "mistral",
    template: str = "mistral",
    max_length: int = 1024,
    limit: int | None = None,
) -> BatchSource:
    """A real dataset (tunecost.workload.datasets), tokenized and templated, cut to `max_length` tokens."""
    data = load_dataset(name, limit=limit)
    tok = tokenizer_by_name(tokenizer)
    if tok.vocab_size > vocab_size:
        raise TunecostError(
            f"tokenizer {tok.name} has {tok.vocab_size} ids but the model's vocabulary has "
            f"{vocab_size}; pass the model's own tokenizer with --tokenizer"
        )
    encoded = encode_queries(
        template_by_name(template), tok, [e.prompt for e in data.examples], [e.response for e in data.examples]
    )
    queries = [Query(q.ids[:max_length], min(q.num_prompt_tokens, max_length - 1)) for q in encoded]
    return BatchSource(queries, pad_id=tok.pad_id, seq_len=None, dataset=data.name)
