"""The paper's analytical cost model (Xia et al., IISWC 2024, §V) as small pure functions.

Units: memory in GB (as the paper's GPU_mem and model_mem, Table I), throughput in queries per second,
time in seconds or hours as named, money in USD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tunecost.errors import TunecostError

# The setup the paper measured each model in (§III); its coefficients and throughputs apply to that method only.
PAPER_METHOD = {"mixtral-8x7b": "qlora", "blackmamba-2.8b": "full"}


@dataclass(frozen=True, kw_only=True)
class BatchSizeCoefficients:
    """Eq. (1)'s coefficients for one model: C0 (scaling), C1 (MoE coefficient), model memory in GB."""

    c0: float
    c1: float
    model_memory_gb: float
    source: str


# Eq. (1) coefficient sets. "text": printed in §V-A; "artifact": used by the artifact's Fig. 13 projection
# (its Fig. 13 projection script). Model memory from Table I.
EQ1_COEFFICIENTS: dict[tuple[str, str], BatchSizeCoefficients] = {
    ("mixtral-8x7b", "text"): BatchSizeCoefficients(
        c0=82, c1=0.95, model_memory_gb=23.35, source="paper §V-A text; Table I"
    ),
    ("mixtral-8x7b", "artifact"): BatchSizeCoefficients(
        c0=62, c1=0.89, model_memory_gb=23.35, source="artifact Fig. 13 projection; Table I"
    ),
    ("blackmamba-2.8b", "text"): BatchSizeCoefficients(
        c0=83, c1=0.88, model_memory_gb=5.6, source="paper §V-A text; Table I"
    ),
}
EQ1_ARTIFACT_SEQ_LEN = 512  # the sequence length the artifact's projection used

# Eq. (2), artifact form: the fixed MoE attenuation c3 per model (its eq. (2) fitting script).
EQ2_ARTIFACT_C3: dict[str, float] = {"mixtral-8x7b": 1.8, "blackmamba-2.8b": 2.5}


def sparsity_fraction(experts_per_token: int, num_experts: int) -> float:
    """The paper's 'sparsity': experts per token over experts (0.25 for top-2 of 8; 1.0 dense)."""
    if not 1 <= experts_per_token <= num_experts:
        raise TunecostError(f"experts per token must be in 1..{num_experts}, got {experts_per_token}")
    return experts_per_token / num_experts


def max_batch_size_eq1(
    *, gpu_memory_gb: float, model_memory_gb: float, seq_len_tokens: float, sparsity: float, c0: float, c1: float
) -> int:
    """Eq. (1): floor(C0 * (GPU_mem - model_mem) / (seq_len * ((1 - C1) + C1 * sparsity))). 0 if it does not fit."""
    if seq_len_tokens <= 0:
        raise TunecostError(f"sequence length must be > 0, got {seq_len_tokens}")
    free_gb = gpu_memory_gb - model_memory_gb
    if free_gb <= 0:
        return 0
    per_query = seq_len_tokens * ((1.0 - c1) + c1 * sparsity)
    return max(0, math.floor(c0 * free_gb / per_query))


def throughput_eq2_printed(*, batch_size: float, sparsity: float, c2: float, c3: float, c4: float) -> float:
    """Eq. (2) as printed: C2 * log(batch_size / (sparsity * C3)) + C4, in queries per second."""
    return c2 * math.log(batch_size / (sparsity * c3)) + c4


def throughput_eq2_artifact(*, batch_size: float, sparsity: float, a: float, b: float, c3: float) -> float:
    """Eq. (2) as the artifact fits it: a + b * log(batch_size) / (sparsity * c3), queries per second."""
    return a + b * math.log(batch_size) / (sparsity * c3)


def training_seconds(*, num_queries: float, epochs: float, queries_per_s: float) -> float:
    """Wall time of a fine-tune: every query once per epoch at a steady throughput."""
    if not all(math.isfinite(x) for x in (num_queries, epochs, queries_per_s)):
        raise TunecostError("queries, epochs and throughput must be finite numbers")
    if num_queries <= 0:
        raise TunecostError(f"number of queries must be > 0, got {num_queries}")
    if epochs <= 0:
        raise TunecostError(f"epochs must be > 0, got {epochs}")
    if queries_per_s <= 0:
        raise TunecostError(f"throughput must be > 0 queries/s, got {queries_per_s}")
    return num_queries * epochs / queries_per_s


def training_hours(*, num_queries: float, epochs: float, queries_per_s: float) -> float:
    """Hours of the whole fine-tune at `queries_per_s` (`training_seconds` / 3600)."""
    return training_seconds(num_queries=num_queries, epochs=epochs, queries_per_s=queries_per_s) / 3600.0


def usd_for_hours(*, hours: float, usd_per_gpu_hour: float, num_gpus: int = 1) -> float:
    """Dollars of `hours` on `num_gpus` GPUs at `usd_per_gpu_hour` each (0 for owned GPUs: the cost is 0)."""
    if not math.isfinite(usd_per_gpu_hour) or usd_per_gpu_hour < 0:
        raise TunecostError(f"price must be >= 0 $/GPU-hour (0: owned hardware), got {usd_per_gpu_hour}")
    return hours * usd_per_gpu_hour * num_gpus


def cost_usd(
    *, num_queries: float, epochs: float, queries_per_s: float, usd_per_gpu_hour: float, num_gpus: int = 1
) -> float:
    """§V-C: queries x epochs / throughput / 3600 x $/h (Table IV)."""
    hours = training_hours(num_queries=num_queries, epochs=epochs, queries_per_s=queries_per_s)
    return usd_for_hours(hours=hours, usd_per_gpu_hour=usd_per_gpu_hour, num_gpus=num_gpus)


@dataclass(frozen=True, kw_only=True)
class CostEstimate:
    """What `tunecost cost` prints: one fine-tune's hours and dollars from a throughput and a price (§V-C, Table
    IV); `hours` and `usd` are computed (and the inputs checked) on construction."""

    num_queries: float
    epochs: float
    queries_per_s: float
    usd_per_hour: float
    provider: str | None = None
    price_date: str | None = None
    gpu: str | None = None
    hours: float = field(init=False)
    usd: float = field(init=False)

    def __post_init__(self) -> None:
        hours = training_hours(num_queries=self.num_queries, epochs=self.epochs, queries_per_s=self.queries_per_s)
        object.__setattr__(self, "hours", hours)
        object.__setattr__(self, "usd", usd_for_hours(hours=hours, usd_per_gpu_hour=self.usd_per_hour))
