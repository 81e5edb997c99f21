"""Per-rank memory and collectives under DDP (`torch.nn.parallel.DistributedDataParallel`).

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.ddp`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tunecost.distributed.recorder import Collective

MIB = 1024 * 1024
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB
DEFAULT_BUCKET_CAP_BYTES = 25 * MIB


def ddp_bucket_bytes(
    trainable: list[torch.Tensor],
    *,
    first_bucket_cap_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
) -> list[int]:
    """Bytes of each DDP gradient bucket, in all-reduce order (first bucket first). Tensors may be on the meta
    device or fake: only sizes, dtypes and devices are read."""
    import torch.distributed as dist

    ready_order = list(reversed(trainable))
    if not ready_order:
        return []
    limits = [first_bucket_cap_bytes, bucket_cap_bytes]
    buckets, _limits = dist._compute_bucket_assignment_by_size(ready_order, limits, [False] * len(ready_order))
    return [sum(ready_order[i].numel() * ready_order[i].element_size() for i in bucket) for bucket in buckets]


@dataclass(frozen=True, kw_only=True)
class DdpRank:
    """One DDP rank: the single-GPU peak plus the buckets (bytes), and the backward all-reduces."""

    single_gpu_peak_bytes: int
    bucket_bytes: tuple[int, ...]
    collectives: tuple[Collective, ...]

    @property
    def peak_bytes(self) -> int:
        return self.single_gpu_peak_bytes + sum(self.bucket_bytes)


def ddp_rank(single_gpu_peak_bytes: int, trainable: list[torch.Tensor], num_gpus: int, **bucket_caps: int) -> DdpRank:
    """Per-rank memory and all-reduces of DDP over `num_gpus` ranks for a step whose single-GPU peak is given."""
    buckets = ddp_bucket_bytes(trainable, **bucket_caps)
    dtype = str(trainable[0].dtype).removeprefix("torch.") if trainable else "?"
    calls = tuple(
        Collective(op="all_reduce", group_size=num_gpus, nbytes=b, dtype=dtype, phase="backward", layer=None)
        for b in buckets
    )
    return DdpRank(single_gpu_peak_bytes=single_gpu_peak_bytes, bucket_bytes=tuple(buckets), collectives=calls)
