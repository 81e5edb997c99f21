"""What catalog GPUs achieve, beside their datasheet (`gpus.py`): maximum achievable matmul throughput and streaming
bandwidth, each value with its source (`data/gpu_achieved.csv`). The throughput model (`estimate.throughput`)
uses these instead of datasheet peaks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.errors import TunecostError

GPU_ACHIEVED_PATH = Path(__file__).parent / "data" / "gpu_achieved.csv"


@dataclass(frozen=True, kw_only=True)
class AchievedRates:
    name: str  # the GPU's catalog name
    matmul_flops_per_s: float
    memory_bytes_per_s: float
    sources: dict[str, str]
    as_of: str
    fp8_matmul_flops_per_s: float | None = None  # measured FP8 MAMF where published (else derived: docs/fp8.md)


def load_achieved(path: Path = GPU_ACHIEVED_PATH) -> dict[str, AchievedRates]:
    out: dict[str, AchievedRates] = {}
    for i, row in read_catalog_csv(path, ("name", "matmul_tflops", "memory_tb_s", "as_of")):
        matmul = parse_float(path, i, "matmul_tflops", row["matmul_tflops"]) * 1e12
        memory = parse_float(path, i, "memory_tb_s", row["memory_tb_s"]) * 1e12
        if matmul <= 0 or memory <= 0:
            raise TunecostError(f"{path}: row {i}: matmul_tflops and memory_tb_s must be > 0")
        if row["name"] in out:
            raise TunecostError(f"{path}: row {i}: GPU {row['name']} listed twice")
        out[row["name"]] = AchievedRates(
            name=row["name"],
            matmul_flops_per_s=matmul,
            memory_bytes_per_s=memory,
            sources={k.removeprefix("source_"): v for k, v in row.items() if k.startswith("source_")},
            as_of=row["as_of"],
            fp8_matmul_flops_per_s=(
                parse_float(path, i, "fp8_matmul_tflops", row["fp8_matmul_tflops"]) * 1e12
                if row.get("fp8_matmul_tflops")
                else None
            ),
        )
    return out


@lru_cache(maxsize=1)
def achieved_catalog() -> dict[str, AchievedRates]:
    return load_achieved()
