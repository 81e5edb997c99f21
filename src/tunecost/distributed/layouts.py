"""The GPU counts and layouts a multi-GPU search evaluates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tunecost.catalog.gpus import GPU
from tunecost.distributed import expert_parallel
from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.workload.parallel import MAX_SEARCH_GPUS, ParallelPlan

if TYPE_CHECKING:
    from tunecost.models.catalog import ModelSpec


def valid_gpu_counts(gpus_per_node: int, max_gpus: int, expert_parallel: int = 1) -> list[int]:
    """1 .. GPUs per node, then whole nodes, up to `max_gpus`; only multiples of the expert-parallel degree."""
    return [
        n for n in range(expert_parallel, max_gpus + 1, expert_parallel) if n <= gpus_per_node or n % gpus_per_node == 0
    ]


def layout_plans(
    n: int, strategies: Sequence[str], *, gpus_per_node: int, expert_degree: int, offload: str
) -> list[ParallelPlan]:
    """The layouts of `n` GPUs: one GPU without offload or expert parallelism is just that ("single"), whatever
    the strategies asked."""
    if n == 1 and offload == "none" and expert_degree == 1:
        return [ParallelPlan()]
    return [
        ParallelPlan(
            num_gpus=n, gpus_per_node=gpus_per_node, strategy=s, expert_parallel=expert_degree, offload=offload
        )
        for s in strategies
    ]


def gpu_counts(
    gpu: str, num_gpus: int | Mapping[str, int] | None, gpus_per_node: int, max_gpus: int, expert_degree: int
) -> list[int]:
    """The GPU counts evaluated for `gpu`: its own count, the one count, or every valid count up to `max_gpus`."""
    if isinstance(num_gpus, Mapping):
        return [num_gpus[gpu]]
    if num_gpus is not None:
        return [num_gpus]
    return valid_gpu_counts(gpus_per_node, max_gpus, expert_degree)


def checked_counts(
    model: str,
    gpus: Sequence[GPU],
    strategies: Sequence[str],
    num_gpus: int | Mapping[str, int] | None,
    gpus_per_node: int,
    max_gpus: int,
    expert_degree: int,
    offload: str,
) -> tuple[dict[str, list[int]], ModelSpec]:
    """The GPU counts to evaluate per GPU, and the job's model, once the search's limits are checked."""
    if not 1 <= max_gpus <= MAX_SEARCH_GPUS:
        raise TunecostError(f"the GPU limit must be between 1 and {MAX_SEARCH_GPUS}, got {max_gpus}")
    counts_by_gpu = {g.name: gpu_counts(g.name, num_gpus, gpus_per_node, max_gpus, expert_degree) for g in gpus}
    if not any(counts_by_gpu.values()):
        raise TunecostError(
            f"no GPU count up to {max_gpus} is a multiple of the expert-parallel degree {expert_degree}"
        )
    spec = resolve_model(model)
    most = max(max(c) for c in counts_by_gpu.values() if c)
    for s in strategies:
        plan = ParallelPlan(
            num_gpus=most, gpus_per_node=gpus_per_node, strategy=s, expert_parallel=expert_degree, offload=offload
        )
        expert_parallel.check_expert_parallel(plan, num_experts=spec.num_experts, model=spec.name)
    return counts_by_gpu, spec
