"""The GPU catalog: datasheet memory, bandwidth and peak throughput, with a source per figure.

Data lives in `data/gpus.csv`; names resolve case-insensitively, with aliases (`h100` is the SXM part). Names are
compared after dropping case, punctuation and vendor words (NVIDIA, GeForce, Tesla, AMD, Instinct), so the names
nvidia-smi prints ("NVIDIA GeForce RTX 3090", "Tesla V100-SXM2-32GB") resolve. A name that could mean cards of
different memory (a bare "V100", "GH200" or "RTX 3080") or a card outside the catalog ("RTX 6000": the Turing
Quadro, or the RTX 6000 Ada) is an error naming the candidates, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.errors import TunecostError, unknown_name_error
from tunecost.units import bytes_from_gib

GPU_CATALOG_PATH = Path(__file__).parent / "data" / "gpus.csv"

# Words sources put before a card's name that never tell two catalog cards apart.
_VENDOR_WORDS = frozenset({"nvidia", "geforce", "tesla", "amd", "instinct"})
# a system or architecture named with the GPU: "DGX H100", "HGX B200", "GB200 NVL72", "Grace Blackwell GB200"
_VENDOR_WORDS |= {"dgx", "hgx", "nvl72", "nvl36", "nvl4", "grace", "hopper", "blackwell", "superpod"}
# Names that mean a card outside the catalog as well as one inside it: (what else it may be, catalog candidates).
_AMBIGUOUS_NAMES = {
    "rtx6000": ("the Turing Quadro RTX 6000 (24 GB, not in the catalog)", ("RTX6000ADA-48GB",)),
    "quadrortx6000": ("the Turing Quadro RTX 6000 (24 GB, not in the catalog)", ("RTX6000ADA-48GB",)),
    "rtx3080": ("the RTX 3080 12GB (not in the catalog)", ("RTX3080-10GB",)),
    "3080": ("the RTX 3080 12GB (not in the catalog)", ("RTX3080-10GB",)),
    "rtx3060": ("the RTX 3060 8GB (not in the catalog)", ("RTX3060-12GB",)),
    "3060": ("the RTX 3060 8GB (not in the catalog)", ("RTX3060-12GB",)),
    # a prefix of the catalog's cards: the RTX 2080 (8 GB), the TITAN V, Xp and X
    "rtx2080": ("the RTX 2080 (8 GB, not in the catalog)", ("RTX2080TI-11GB",)),
    "2080": ("the RTX 2080 (8 GB, not in the catalog)", ("RTX2080TI-11GB",)),
    "titan": ("another TITAN (V, Xp, X; not in the catalog)", ("TITANRTX-24GB",)),
    "rtx4060ti": ("the RTX 4060 Ti 8GB (not in the catalog)", ("RTX4060TI-16GB",)),
    "4060ti": ("the RTX 4060 Ti 8GB (not in the catalog)", ("RTX4060TI-16GB",)),
}
# Architectures without bf16 tensor cores: their bf16 column holds the FP16 tensor rate (see gpus.csv's header).
_NO_BF16_ARCHITECTURES = frozenset({"Volta", "Turing"})


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
    # What CUDA reports as the device's total (`torch.cuda.get_device_properties(i).total_memory`), in GiB: below
    # the datasheet figure by the driver's reserve, and on GDDR6 cards with ECC on by a further 1/16. None where no
    # printout is stored (`source_cuda_memory` names it).
    cuda_memory_gib: float | None = None
    # Dense FP8 tensor-core rate (FP32 accumulate, no sparsity); None where the card has no FP8 tensor cores.
    fp8_tensor_flops_per_s: float | None = None

    @property
    def supports_fp8(self) -> bool:
        """True for cards with FP8 tensor cores (Hopper, Ada, Blackwell, CDNA3 and later): a catalog FP8 rate."""
        return self.fp8_tensor_flops_per_s is not None

    @property
    def supports_bf16(self) -> bool:
        """False for Volta and Turing cards: no bf16 tensor cores (the catalog's bf16 rate is their FP16 rate)."""
        return self.architecture not in _NO_BF16_ARCHITECTURES

    @cached_property
    def memory_bytes(self) -> int:
        """Device memory in bytes: the datasheet figure read as GiB (what CUDA reports before ECC/driver reserve)."""
        return bytes_from_gib(self.memory_gib)

    @cached_property
    def usable_memory_bytes(self) -> int:
        """The memory a training process can have on this GPU, what fits/out-of-memory decisions compare with:
        the total CUDA reports where the catalog stores it, else the datasheet figure (`memory_bytes`); never more
        than the datasheet figure (a card given a smaller memory keeps the smaller)."""
        if self.cuda_memory_gib is None:
            return self.memory_bytes
        return min(self.memory_bytes, bytes_from_gib(self.cuda_memory_gib))

    def usable_memory_note(self) -> str:
        """Which memory figure `usable_memory_bytes` is, for the notes of an answer."""
        if self.cuda_memory_gib is None:
            return f"{self.memory_gib:g} GiB, the datasheet figure (the total CUDA reports is not in the catalog)"
        if self.usable_memory_bytes == self.memory_bytes:
            return f"{self.memory_gib:g} GiB, the memory given"
        return f"{self.cuda_memory_gib:.2f} GiB, the total CUDA reports (datasheet {self.memory_gib:g} GB)"


def load_gpus(path: Path = GPU_CATALOG_PATH) -> dict[str, GPU]:
    required = ("name", "aliases", "memory_gib", "mem_bandwidth_tb_s", "bf16_tensor_tflops", "fp32_tflops", "as_of")
    gpus: dict[str, GPU] = {}
    for i, row in read_catalog_csv(path, required):
        memory_gib = parse_float(path, i, "memory_gib", row["memory_gib"])
        gpu = GPU(
            name=row["name"],
            aliases=tuple(a.strip() for a in row["aliases"].split(";") if a.strip()),
            vendor=row.get("vendor", ""),
            architecture=row.get("architecture", ""),
            memory_gib=memory_gib,
            mem_bandwidth_bytes_per_s=parse_float(path, i, "mem_bandwidth_tb_s", row["mem_bandwidth_tb_s"]) * 1e12,
            bf16_tensor_flops_per_s=parse_float(path, i, "bf16_tensor_tflops", row["bf16_tensor_tflops"]) * 1e12,
            fp32_flops_per_s=parse_float(path, i, "fp32_tflops", row["fp32_tflops"]) * 1e12,
            as_of=row["as_of"],
            sources={k.removeprefix("source_"): v for k, v in row.items() if k.startswith("source_")},
            notes=row.get("notes", ""),
            cuda_memory_gib=_cuda_memory_gib(path, i, row, memory_gib),
            fp8_tensor_flops_per_s=_fp8_flops_per_s(path, i, row),
        )
        gpus[gpu.name] = gpu
    return gpus


def _cuda_memory_gib(path: Path, row_number: int, row: dict[str, str], datasheet: float) -> float | None:
    """The optional `cuda_memory_gib` cell: blank, or a positive figure not above the datasheet's (H200's 141 GB
    allowing), with its source."""
    cell = row.get("cuda_memory_gib", "")
    if not cell:
        return None
    value = parse_float(path, row_number, "cuda_memory_gib", cell)
    if not 0 < value <= datasheet:
        raise TunecostError(
            f"{path}: row {row_number}: cuda_memory_gib {cell} must be > 0 and at most memory_gib {row['memory_gib']}"
        )
    if not row.get("source_cuda_memory"):
        raise TunecostError(f"{path}: row {row_number}: cuda_memory_gib {cell} has no source_cuda_memory")
    return value


def _fp8_flops_per_s(path: Path, row_number: int, row: dict[str, str]) -> float | None:
    """The optional `fp8_tensor_tflops` cell: blank (no FP8 tensor cores), or a positive rate with its source."""
    cell = row.get("fp8_tensor_tflops", "")
    if not cell:
        return None
    value = parse_float(path, row_number, "fp8_tensor_tflops", cell)
    if not value > 0:
        raise TunecostError(f"{path}: row {row_number}: fp8_tensor_tflops {cell} must be > 0")
    if not row.get("source_fp8"):
        raise TunecostError(f"{path}: row {row_number}: fp8_tensor_tflops {cell} has no source_fp8")
    return value * 1e12


def no_fp8_error(names: list[str]) -> TunecostError:
    """The one-line error for FP8 training (--fp8) on GPUs without FP8 tensor cores."""
    verb = "has" if len(names) == 1 else "have"
    return TunecostError(
        f"--fp8: {', '.join(names)} {verb} no FP8 tensor cores (FP8 needs Hopper, Ada, Blackwell, MI300); "
        "drop --fp8 or pick such a GPU"
    )


def fp8_gpu_names(fp8: str, names: list[str], *, every: bool = False) -> list[str]:
    """The GPUs an FP8 job (`fp8` not "none") can run on: `every` (--gpu all) keeps the catalog's FP8 cards, else
    a named GPU without FP8 tensor cores is `no_fp8_error`."""
    if fp8 == "none":
        return names
    resolved = [resolve_gpu_name(n).gpu for n in names]
    if every:
        return [g.name for g in resolved if g.supports_fp8]
    lacking = list(dict.fromkeys(g.name for g in resolved if not g.supports_fp8))
    if lacking:
        raise no_fp8_error(lacking)
    return names


@lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GPU]:
    return load_gpus()


@dataclass(frozen=True)
class Resolved:
    gpu: GPU
    via_alias: str | None  # the alias the user typed, when it was not the canonical name


@lru_cache(maxsize=4096)
def normalize_gpu_name(name: str) -> str:
    """The comparison key of a GPU name: lower case, vendor words and punctuation dropped ("NVIDIA GeForce RTX
    3090" and "rtx-3090" both give "rtx3090")."""
    words = (re.sub(r"^(\d+)g$", r"\1gb", w) for w in re.split(r"[^0-9a-z]+", name.lower()))  # "80G": 80GB
    return "".join(w for w in words if w and w not in _VENDOR_WORDS)


def _name_words(name: str) -> frozenset[str]:
    """The words of a GPU name without vendor and memory-type words, any SXM generation as "sxm"."""
    aside = re.sub(r"\(.*?\)", " ", name.lower())  # "A100-SXM4-80GB (x8)"
    words = (re.sub(r"^(\d+)g$", r"\1gb", re.sub(r"^sxm\d$", "sxm", w)) for w in re.split(r"[^0-9a-z]+", aside))
    return frozenset(w for w in words if w and w not in _VENDOR_WORDS and not w.startswith("hbm"))


def _all_words(gpu: GPU) -> frozenset[str]:
    return _name_words(gpu.name).union(*(_name_words(a) for a in gpu.aliases))


def _ambiguous(name: str, candidates: list[str]) -> TunecostError:
    return TunecostError(f"ambiguous GPU {name!r}: matches {', '.join(candidates)}; name one of them")


def _keeps_model_number(key: str, canonical: str) -> bool:
    """`key` begins the (normalized) catalog name `canonical` without cutting a model number short: "mi300" names
    MI300X-192GB, but "h20" (the H20, another card) does not name H200-141GB."""
    rest = canonical[len(key) :]
    return not (rest and key[-1].isdigit() and rest[0].isdigit())


def resolve_gpu_name(name: str, catalog: dict[str, GPU] | None = None) -> Resolved:
    """Resolve a GPU name as users and sources write it: canonical name first, then a unique alias, then a unique
    prefix of a canonical name; all compared by `normalize_gpu_name`. Ambiguity is an error naming the candidates."""
    catalog = gpu_catalog() if catalog is None else catalog
    key = normalize_gpu_name(name)
    if not key:
        raise TunecostError(f"GPU name is empty; known GPUs: {', '.join(catalog)}")
    for gpu in catalog.values():
        if normalize_gpu_name(gpu.name) == key:
            return Resolved(gpu, None)
    hits = [gpu for gpu in catalog.values() if key in {normalize_gpu_name(a) for a in gpu.aliases}]
    if len(hits) == 1:
        return Resolved(hits[0], name)
    if len(hits) > 1:
        raise _ambiguous(name, [g.name for g in hits])
    if key in _AMBIGUOUS_NAMES:
        other, inside = _AMBIGUOUS_NAMES[key]
        raise _ambiguous(name, [other, *(n for n in inside if n in catalog)])
    words = _name_words(name)
    within = [g for g in catalog.values() if g.name.split("-")[0].lower() in words and words <= _all_words(g)]
    if len(words) > 1 and len(within) == 1:  # the catalog's words in another order: "H200-SXM-141GB"
        return Resolved(within[0], name)
    if len(words) > 1 and len(within) > 1:  # "A100-SXM4": the 40 GB or the 80 GB card
        raise _ambiguous(name, [g.name for g in within])
    prefix = [gpu for gpu in catalog.values() if normalize_gpu_name(gpu.name).startswith(key)]
    if len(prefix) == 1 and _keeps_model_number(key, normalize_gpu_name(prefix[0].name)):
        return Resolved(prefix[0], name)
    if len(prefix) > 1:
        raise _ambiguous(name, [g.name for g in prefix])
    raise unknown_name_error("GPU", name, catalog.keys())


def get_gpu(name: str) -> GPU:
    return resolve_gpu_name(name).gpu
