"""Known dataset names: where each is looked for under ``$TUNECOST_DATA_DIR`` and, for some, its hub id (read
from the local hub cache, downloaded only when allowed)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecost.catalog.datasets import TRAIN_SPLIT, dataset_catalog, find_dataset_facts, get_dataset_facts
from tunecost.errors import TunecostError
from tunecost.workload.run_length import sliced_queries

DATA_DIR_ENV = "TUNECOST_DATA_DIR"
FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")  # the data files tunecost reads


@dataclass(frozen=True, kw_only=True)
class KnownDataset:
    name: str
    description: str
    files: tuple[str, ...] = ()  # relative paths tried under each data dir
    hub: tuple[str, str | None, str] | None = None  # (repo id, config, split)


def _llm_adapters_train(name: str, description: str) -> KnownDataset:
    """A training set of LLM-Adapters' ft-training_set, looked for flat, under llm-adapters/ or as the repo has it."""
    files = (f"{name}.json", f"llm-adapters/{name}.json", f"ft-training_set/{name}.json")
    return KnownDataset(name=name, description=f"LLM-Adapters {description}", files=files)


def _llm_adapters_test(name: str, what: str, *, stem: str | None = None) -> KnownDataset:
    """A test set of LLM-Adapters' dataset folder (`stem`: its folder name when it differs from `name`)."""
    stem = stem or name
    return KnownDataset(
        name=name,
        description=f"LLM-Adapters {what} test set",
        files=(f"{stem}_test.json", f"llm-adapters/{stem}_test.json", f"dataset/{stem}/test.json"),
    )


KNOWN_DATASETS: dict[str, KnownDataset] = {
    k.name: k
    for k in (
        _llm_adapters_train("commonsense_15k", "commonsense_15k (the paper's CS)"),
        _llm_adapters_train("commonsense_170k", "commonsense_170k"),
        _llm_adapters_train("math_14k", "math_14k (the paper's MATH)"),
        _llm_adapters_train("math_10k", "math_10k"),
        KnownDataset(
            name="math_data",
            description="LLM-Adapters math_data.json",
            files=("math_data.json", "llm-adapters/math_data.json"),
        ),
        KnownDataset(
            name="gsm8k",
            description="GSM8K test (1319; LLM-Adapters file or original JSONL)",
            files=("gsm8k_test.json", "llm-adapters/gsm8k_test.json", "dataset/gsm8k/test.json", "gsm8k/test.jsonl"),
            hub=("openai/gsm8k", "main", "test"),
        ),
        KnownDataset(
            name="gsm8k-train",
            description="GSM8K train (7473, original JSONL)",
            files=("gsm8k/train.jsonl", "gsm8k_train.jsonl"),
            hub=("openai/gsm8k", "main", "train"),
        ),
        KnownDataset(
            name="hellaswag",
            description="HellaSwag validation (ctx/endings/label)",
            files=("hellaswag/validation.jsonl", "hellaswag_val.jsonl", "hellaswag.jsonl"),
            hub=("Rowan/hellaswag", None, "validation"),
        ),
        _llm_adapters_test("boolq", "BoolQ"),
        _llm_adapters_test("piqa", "PIQA"),
        _llm_adapters_test("social_i_qa", "SIQA"),
        _llm_adapters_test("ARC-Challenge", "ARC-Challenge"),
        _llm_adapters_test("ARC-Easy", "ARC-Easy"),
        _llm_adapters_test("openbookqa", "OpenBookQA"),
        _llm_adapters_test("winogrande", "WinoGrande"),
        # LLM-Adapters' HellaSwag file (generation, ending1..4) is hellaswag_test.json
        _llm_adapters_test("hellaswag_llm-adapters", "HellaSwag (generation, ending1..4)", stem="hellaswag"),
        _llm_adapters_test("AQuA", "AQuA"),
        _llm_adapters_test("SVAMP", "SVAMP"),
        KnownDataset(name="synthetic-arith", description="embedded arithmetic word problems (train split)"),
        KnownDataset(name="synthetic-arith-test", description="embedded arithmetic word problems (held-out split)"),
    )
}


def data_dirs() -> list[Path]:
    """Folders searched for known names: ``$TUNECOST_DATA_DIR`` (several separated by the OS path separator)."""
    raw = os.environ.get(DATA_DIR_ENV, "")
    return [Path(os.path.expanduser(p)) for p in raw.split(os.pathsep) if p.strip()]


def resolve_known(name: str) -> Path | None:
    """The first local file for a known name under the data dirs, or None."""
    known = KNOWN_DATASETS[name]
    for folder in data_dirs():
        for rel in known.files:
            candidate = folder / rel
            if candidate.is_file():
                return candidate
    return None


def canonical_name(spec: str) -> str | None:
    """The registry's spelling of a known dataset name (case-insensitive), or None."""
    lowered = {k.lower(): k for k in KNOWN_DATASETS}
    return lowered.get(spec.strip().lower())


def is_hub_id(spec: str) -> bool:
    """Whether `spec` reads as a hub dataset id, `org/name` (dots allowed: teknium/OpenHermes-2.5), not a data file."""
    return re.fullmatch(r"[\w.-]+/[\w.-]+", spec) is not None and Path(spec).suffix.lower() not in FILE_SUFFIXES


def hub_cached(repo_id: str) -> bool:
    """Whether `repo_id` is a hub id whose dataset snapshot the local Hugging Face cache holds (the cache's documented
    layout, HF_HUB_CACHE/datasets--ORG--NAME/snapshots), looked up without loading the hub client."""
    from huggingface_hub import constants

    if not is_hub_id(repo_id):
        return False
    return (Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}" / "snapshots").is_dir()


def _catalog_split(known: str, split: str | None) -> dict[str, str]:
    """The catalog row of dataset `known`'s `split` (its hub id's row of that split), else `known` with the split
    (`dataset_split`: its queries are the row's split's where the split spec slices it, else said)."""
    split = (split or "").strip()
    facts = find_dataset_facts(known) if split else None  # None too for a known dataset outside the catalog
    if facts is None or not facts.split or split == facts.split:
        return {"dataset": known}
    rows = [f for f in dataset_catalog().values() if facts.hub_id and f.hub_id == facts.hub_id and f.split == split]
    return {"dataset": rows[0].name} if len(rows) == 1 else {"dataset": known, "dataset_split": split}


def config_dataset_option(key: str, name: str, split: str | None = None) -> tuple[dict[str, str], list[str]]:
    """What a framework config's dataset `name` (under `key`) and the `split` it states give a job: the catalog's
    row (of that split where it has one, else its own with the split to count), else its copy in the local Hugging
    Face cache, else no dataset and a note saying how to give the lengths."""
    if known := catalog_dataset(name):
        return _catalog_split(known, split), []
    if hub_cached(name):
        return {"dataset": name}, [f"{key} {name}: its copy in the local Hugging Face cache is counted"]
    fix = f"give --dataset FILE or --seq-len, or `hf download {name} --repo-type dataset`"
    return {}, [f"{key} {name}: a hub dataset or folder not in the local Hugging Face cache; {fix}"]


def _catalog_queries(name: str, split: str | None = None) -> int | None:
    """The rows of the catalog's dataset `name` at the `split` a config loads (its row of that split, else the slice
    the split takes of the row's split); None where the catalog does not count them."""
    known = catalog_dataset(name)
    chosen = _catalog_split(known, split) if known else {}
    facts = find_dataset_facts(chosen["dataset"]) if chosen else None
    if facts is None:
        return None
    if (spec := chosen.get("dataset_split")) is None:
        return facts.num_queries
    try:
        return sliced_queries(spec, facts.num_queries, facts.split or TRAIN_SPLIT)
    except ValueError:
        return None


def mixture_parts(parts: list[tuple[str, str | None, float]], cut: int | None = None) -> list[tuple[int, str]] | None:
    """Each part of a mixture, from its (dataset, split, weight): the `int(rows x weight)` it takes of its split (the
    alignment handbook's subsampling), its rows first cut to `cut` (LLaMA-Factory's max_samples), and a text naming
    them; None where one is not counted."""
    taken = []
    for name, split, weight in parts:
        if (rows := _catalog_queries(name, split)) is None:
            return None
        n = int(min(rows, cut or rows) * weight)
        taken.append((n, f"{n} of {name}{f' {split}' if split else ''}{f' x {weight:g}' if weight != 1 else ''}"))
    return taken


def mixture_queries(parts: list[tuple[str, str | None, float]], cut: int | None = None) -> tuple[int, str] | None:
    """A mixture's queries per epoch, its parts (`mixture_parts`) concatenated, and how they add up."""
    if (taken := mixture_parts(parts, cut)) is None:
        return None
    return sum(n for n, _ in taken), " + ".join(text for _, text in taken)


def mixture_option(
    key: str, parts: list[tuple[str, str | None, float]], first: Mapping[str, Any]
) -> tuple[dict[str, Any], str]:
    """The job options of a config's mixture (under `key`) whose first dataset gives `first`: with its queries per
    epoch where the catalog counts every part (the first's split then counted among them), else `first`; and the
    line that says which."""
    if counted := mixture_queries(parts):
        kept = {k: v for k, v in first.items() if k != "dataset_split"}
        line = f"{key}: {counted[0]} queries per epoch ({counted[1]}); the first's lengths stand for all"
        return kept | {"mixture_queries": counted[0]}, line
    said = f"only the first of {len(parts)} datasets gives the lengths and the queries per epoch"
    said = said if len(parts) > 1 else f"the weight {parts[0][2]:g} is not counted in the queries per epoch"
    return dict(first), f"{key}: {said} (--queries gives the mixture's)"


def load_hub_rows(repo_id: str, config: str | None, split: str, *, allow_download: bool = False) -> list[dict]:
    """Rows of a hub dataset split: from the local hub cache, or downloaded when `allow_download`."""
    try:
        import datasets as hf_datasets
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - declared dependencies
        raise TunecostError("loading from the hub needs the 'datasets' package") from None
    if allow_download:
        source: str = repo_id
    else:
        try:
            source = snapshot_download(repo_id, repo_type="dataset", local_files_only=True)
        except Exception:
            raise TunecostError(
                f"hub dataset {repo_id!r} is not in the local cache and downloads are off "
                f"(allow_download=True / --allow-download, or put a file under ${DATA_DIR_ENV})"
            ) from None
    try:
        ds = hf_datasets.load_dataset(source, name=config, split=split)
    except Exception as exc:
        raise TunecostError(
            f"cannot load hub dataset {repo_id!r} (config {config}, split {split}): "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    return [dict(row) for row in ds]


def catalog_dataset(name: str) -> str | None:
    """tunecost's name of a dataset named by its hub id or common name (None: not one it knows)."""
    try:
        return get_dataset_facts(name).name
    except TunecostError:
        return canonical_name(name)


def data_files(dataset: str) -> list[Path] | None:
    """The files of a comma-separated list of data files (a LLaMA-Factory config's several local datasets), None
    where `dataset` is not such a list or one of them is not on this machine."""
    parts = [Path(os.path.expanduser(p.strip())) for p in dataset.split(",")]
    return parts if len(parts) > 1 and all(p.is_file() for p in parts) else None
