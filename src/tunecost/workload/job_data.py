"""The data of a job to price: a catalog dataset's facts, or a file's (or known name's) real token lengths.

`job_data(dataset, model=...)` counts every example (prompt + response, template "none", as `tunecost data stats`
does) of a file, or of a catalog dataset's copy in the local Hugging Face cache, with the model's own tokenizer when
it loads offline, else with the offline Mixtral tokenizer as a stand-in.
Counts are cached in-process per (file, mtime, size, tokenizer), so pricing several GPUs tokenizes once.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from tunecost.catalog.datasets import dataset_catalog, find_dataset_facts
from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.workload.datasets import load_dataset
from tunecost.workload.known_datasets import (
    FILE_SUFFIXES,
    KNOWN_DATASETS,
    canonical_name,
    data_files,
    hub_cached,
    resolve_known,
)
from tunecost.workload.lengths import LengthDistribution, length_distribution
from tunecost.workload.templates import template_by_name
from tunecost.workload.tokenizers import tokenizer_by_name

TEMPLATE = "none"  # prompt + response as one text, BOS counted (tunecost.workload.templates)
OFFLINE_TOKENIZER = "mistral"
# Catalog models whose own tokenizer is the offline one (Mixtral / Mistral v1 SentencePiece, 32000 pieces).
MISTRAL_V1_MODELS = ("mixtral-8x7b", "mistral-7b-v0.1", "mistral-7b-v0.2", "tiny-mixtral")
FILE_TYPES = f"{', '.join(FILE_SUFFIXES[:-1])} or {FILE_SUFFIXES[-1]}"  # .json, .jsonl, .csv or .parquet


@dataclass(frozen=True, kw_only=True)
class JobData:
    """What a job trains on: how many queries and, when measured, each query's tokens (prompt + response)."""

    name: str  # catalog name, known name, or the file's path as given
    num_queries: int
    lengths: tuple[int, ...] | None  # None: a catalog dataset known only by the paper's median length
    tokenizer: str | None  # the tokenizer that counted the lengths
    note: str  # one line: where the lengths came from and how they were counted

    def __post_init__(self) -> None:
        if self.num_queries < 1:
            raise TunecostError(f"dataset {self.name!r} has no queries")
        if self.lengths is not None and (len(self.lengths) != self.num_queries or min(self.lengths) < 1):
            raise TunecostError(f"dataset {self.name!r}: need one positive token count per query")


def job_data(dataset: str, *, model: str, allow_download: bool = False) -> JobData:
    """The data of `dataset` (a file path, a catalog dataset, or a `tunecost data list` name readable offline),
    its lengths counted with `model`'s tokenizer. A catalog dataset without a local file keeps only its facts."""
    path = Path(os.path.expanduser(dataset))
    if path.is_file():
        return _measured(dataset, str(path), model, allow_download)
    if (files := data_files(dataset)) is not None:
        return _concatenated(dataset, files, model, allow_download)
    facts = find_dataset_facts(dataset)
    known = canonical_name(dataset)
    local = resolve_known(known) if known is not None else None
    if local is not None:
        return _measured(facts.name if facts else str(known), str(local), model, allow_download)
    if facts is not None:
        unread = ""
        if facts.hub_id and not facts.has_paper_median and hub_cached(facts.hub_id):  # the paper's rows stay
            try:
                return _measured(facts.name, facts.hub_id, model, allow_download, split=facts.split or "train")
            except TunecostError as exc:
                unread = f"; its local hub copy was not read: {exc}"
        note = (
            f"{facts.name}: {facts.num_queries:,} queries; lengths not measured: {facts.length_summary} "
            f"(source: {facts.source}){unread}"
        )
        return JobData(name=facts.name, num_queries=facts.num_queries, lengths=None, tokenizer=None, note=note)
    try:
        return _measured(known or dataset, dataset, model, allow_download)
    except TunecostError as exc:
        raise _unknown_dataset(dataset, known, exc) from None


def _concatenated(name: str, files: list[Path], model: str, allow_download: bool) -> JobData:
    """The examples of several files, one after the other (datasets' concatenate_datasets)."""
    parts = [_measured(str(f), str(f), model, allow_download) for f in files]
    lengths = tuple(n for p in parts for n in p.lengths or ())
    counted = " + ".join(f"{p.num_queries:,} of {p.name}" for p in parts)
    note = f"lengths of {len(parts)} files, their examples together ({counted}), max {max(lengths)} tokens"
    return JobData(name=name, num_queries=len(lengths), lengths=lengths, tokenizer=parts[0].tokenizer, note=note)


def _measured(name: str, source: str, model: str, allow_download: bool, split: str = "train") -> JobData:
    """`source` (a file, or a name or hub id `load_dataset` reads: its `split`) counted with `model`'s tokenizer,
    described in a note."""
    tokenizer, which = _model_tokenizer(model, allow_download)
    target = Path(os.path.expanduser(source))
    if target.is_file():
        stat = target.stat()
        key = (str(target.resolve()), stat.st_mtime_ns, stat.st_size)
    else:
        key = (source, 0, 0)
    dist = _lengths(*key, tokenizer, allow_download, split)
    where = name if name == source else f"{name} ({source})"
    note = (
        f"lengths of {where}: {dist.num_queries:,} examples (prompt + response, template {TEMPLATE}) counted with "
        f"{which}, median {dist.median_tokens:g}, p95 {dist.percentile(95):g}, max {dist.max_tokens} tokens"
    )
    return JobData(name=name, num_queries=dist.num_queries, lengths=dist.lengths, tokenizer=dist.tokenizer, note=note)


def _model_tokenizer(model: str, allow_download: bool) -> tuple[str, str]:
    """The tokenizer to count `model`'s data with, and a few words saying which it is: the model's own (its hub
    id or local folder) when it loads offline, else the offline Mixtral tokenizer as a stand-in."""
    spec = resolve_model(model)
    if spec.name in MISTRAL_V1_MODELS:
        return OFFLINE_TOKENIZER, f"the Mixtral tokenizer (mistral-v1, {spec.name}'s own, offline copy)"
    own = spec.hub_id or spec.local_path
    if own and _loads(own, allow_download):
        return own, f"{own}'s tokenizer ({spec.name}'s own)"
    return OFFLINE_TOKENIZER, f"the Mixtral tokenizer (mistral-v1, offline stand-in for {spec.name}'s own)"


@functools.lru_cache(maxsize=64)
def _loads(tokenizer: str, allow_download: bool) -> bool:
    """Whether `tokenizer` loads (cached: a failed attempt costs a transformers import and a cache lookup)."""
    try:
        tokenizer_by_name(tokenizer, allow_download=allow_download)
    except (TunecostError, ImportError):
        return False
    return True


@functools.lru_cache(maxsize=32)
def _lengths(
    source: str, mtime_ns: int, size: int, tokenizer: str, allow_download: bool, split: str
) -> LengthDistribution:
    """Token lengths of every example of `source`, cached per file version and tokenizer."""
    ds = load_dataset(source, allow_download=allow_download, split=split)
    return length_distribution(
        ds, tokenizer_by_name(tokenizer, allow_download=allow_download), template_by_name(TEMPLATE)
    )


def _unknown_dataset(dataset: str, known: str | None, cause: TunecostError) -> TunecostError:
    """One message naming `dataset` (or why it cannot be read), the catalog datasets, and that a file works too."""
    catalog = sorted(dataset_catalog())
    also = f"a file ({FILE_TYPES}) or an offline `tunecost data list` name works too"
    choices = f"Valid choices: {', '.join(catalog)}; {also}"
    if known is None and "/" not in dataset and os.sep not in dataset and not Path(dataset).suffix:
        names = {n.lower(): n for n in [*catalog, *KNOWN_DATASETS]}
        close = difflib.get_close_matches(dataset.strip().lower(), list(names), n=1, cutoff=0.6)
        hint = f" Did you mean {names[close[0]]!r}?" if close else ""
        return TunecostError(f"unknown dataset {dataset!r}.{hint} {choices}")
    return TunecostError(f"{cause}. {choices}")
