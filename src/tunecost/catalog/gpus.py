"""The GPU catalog: datasheet memory, bandwidth and peak throughput, with a source per figure.

Data lives in `data/gpus.csv`; names resolve case-insensitively, with aliases (`h100` is the SXM part).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.errors import TunecostError, unknown_name_error
from tunecost.units import bytes_from_gib

GPU_CATALOG_PATH = Path(__file__).parent / "data" / "gpus.csv"


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One GPU model. Figures are datasheet peaks (dense, no 2:4 sparsity)."""

    name: str
    aliases: tuple[str, ...]
    vendor: str
    architecture: str
    # The datasheet's memory figure ("48 GB"), the paper's GPU_mem in eq. (1). For these cards the datasheet's "GB"
    # counts GiB: the memory chips hold 48 x 2^30 bytes, which is what `memory_bytes` gives (see gpus.csv's header).
    memory_gib: float
    mem_bandwidth_bytes_per_s: float
    bf16_tensor_flops_per_s: float
    fp32_flops_per_s: float
    as_of: str
    sources: dict[str, str]
    notes: str = ""

    @property
    def memory_bytes(self) -> int:
        """Device memory in bytes: the datasheet figure read as GiB (what CUDA reports before ECC/driver reserve)."""
        return bytes_from_gib(self.memory_gib)


def load_gpus(path: Path = GPU_CATALOG_PATH) -> dict[str, GPU]:
    required = ("name", "aliases", "memory_gib", "mem_bandwidth_tb_s", "bf16_tensor_tflops", "fp32_tflops", "as_of")
    gpus: dict[str, GPU] = {}
    for i, row in read_catalog_csv(path, required):
        gpu = GPU(
            name=row["name"],
            aliases=tuple(a.strip() for a in row["aliases"].split(";") if a.strip()),
            vendor=row.get("vendor", ""),
            architecture=row.get("architecture", ""),
            memory_gib=parse_float(path, i, "memory_gib", row["memory_gib"]),
            mem_bandwidth_bytes_per_s=parse_float(path, i, "mem_bandwidth_tb_s", row["mem_bandwidth_tb_s"]) * 1e12,
            bf16_tensor_flops_per_s=parse_float(path, i, "bf16_tensor_tflops", row["bf16_tensor_tflops"]) * 1e12,
            fp32_flops_per_s=parse_float(path, i, "fp32_tflops", row["fp32_tflops"]) * 1e12,
            as_of=row["as_of"],
            sources={k.removeprefix("source_"): v for k, v in row.items() if k.startswith("source_")},
            notes=row.get("notes", ""),
        )
        gpus[gpu.name] = gpu
    return gpus


@lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GPU]:
    return load_gpus()


@dataclass(frozen=True)
class Resolved:
    gpu: GPU
    via_alias: str | None  # the alias the user typed, when it was not the canonical name


def resolve_gpu_name(name: str, catalog: dict[str, GPU] | None = None) -> Resolved:
    """Resolve a user-typed GPU name: exact canonical name (any case) first, then a unique alias."""
    catalog = gpu_catalog() if catalog is None else catalog
    key = name.strip().lower()
    if not key:
        raise TunecostError(f"GPU name is empty; known GPUs: {', '.join(catalog)}")
    for gpu in catalog.values():
        if gpu.name.lower() == key:
            return Resolved(gpu, None)
    hits = [gpu for gpu in catalog.values() if key in (a.lower() for a in gpu.aliases)]
    if len(hits) == 1:
        return Resolved(hits[0], name)
    if len(hits) > 1:
        raise TunecostError(f"ambiguous GPU {name!r}: matches {', '.join(g.name for g in hits)}")
    prefix = [gpu for gpu in catalog.values() if gpu.name.lower().startswith(key)]
    if len(prefix) == 1:
        return Resolved(prefix[0], name)
    if len(prefix) > 1:
        raise TunecostError(f"ambiguous GPU {name!r}: matches {', '.join(g.name for g in prefix)}")
    raise unknown_name_error("GPU", name, catalog.keys())


def get_gpu(name: str) -> GPU:
    return resolve_gpu_name(name).gpu
