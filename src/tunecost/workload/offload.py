"""DeepSpeed ZeRO CPU offload: what leaves the GPU, what the host holds, and the PCIe traffic of a step.

DeepSpeed's `offload_optimizer` (ZeRO stages 1-3) keeps each rank's partition of the fp32 master weights, the
Adam states and the fp32 gradients in CPU memory and runs the optimizer step on the CPU (ZeRO-Offload):
after backward reduces a bucket, the rank's gradient partition goes to the host (16-bit or, for fp32 LoRA
factors, 32-bit: the trainable bytes / N), and after the CPU step the updated 16-bit partition comes back
(the same bytes). `offload_param` (stage 3 only; here always with the optimizer offloaded, as DeepSpeed's
ZeRO-3 offload configuration does) keeps each rank's parameter partition in CPU memory too: every forward and
every backward fetches the partition of each unit to the GPU before its all-gather (the stored weights / N,
twice a step), and the updated parameters stay on the host. FSDP's CPU offload (FSDP1
`CPUOffload(offload_params=True)`, FSDP2 `CPUOffloadPolicy`) is the same partition: each rank's parameter and
gradient shards live in host memory, the optimizer steps there, and every unit's shard is copied to the GPU before
its all-gather and its gradient shard back after its reduce-scatter ("params" for fsdp1 and fsdp2).

Time: bytes / the host link's bandwidth (the interconnect catalog's PCIe row for the GPU), each rank on its
own PCIe x16 link (no sharing between the GPUs of a node). Gradient copies follow their bucket's
reduce-scatter under backward; parameter fetches precede their unit's all-gather (prefetched like it); the
return of the updated partition after the optimizer step is exposed. The CPU optimizer step's own time is not
modelled: the GPU optimizer time stands in for it.
"""

from __future__ import annotations

from tunecost.errors import TunecostError

OFFLOAD_CHOICES = ("none", "optimizer", "params")
OFFLOAD_STRATEGIES = {"optimizer": ("zero1", "zero2", "zero3"), "params": ("zero3", "fsdp1", "fsdp2")}
FP32_GRADIENT_BYTES = 4  # DeepSpeed keeps the offloaded gradient partition in fp32 for the CPU Adam
HOST_LINK_BY_GPU = {"H100-80GB-SXM": "PCIe5", "H100-80GB-PCIE": "PCIe5", "H200-141GB": "PCIe5"}
HOST_LINK_OTHER = "PCIe4"


def check_offload(offload: str, strategy: str) -> None:
    """One-line errors for an offload a strategy does not take."""
    if offload not in OFFLOAD_CHOICES:
        raise TunecostError(f"unknown offload {offload!r}; supported: {', '.join(OFFLOAD_CHOICES)}")
    if offload != "none" and strategy not in OFFLOAD_STRATEGIES[offload]:
        allowed = "/".join(OFFLOAD_STRATEGIES[offload])
        raise TunecostError(f"offload {offload!r} is for {allowed} only; not for {strategy}")


def offloads_states(offload: str) -> bool:
    """True when gradients, master weights and optimizer states live on the host."""
    return offload in ("optimizer", "params")


def offloads_params(offload: str) -> bool:
    return offload == "params"


def host_bytes(
    *, offload: str, optimizer_state_bytes: int, trainable_params: int, weight_bytes: int, num_ranks: int
) -> int:
    """A rank's CPU memory for its offloaded partition: optimizer states (ZeRO's, whole model), fp32 gradients
    and, with parameter offload, the stored weights, each divided over the `num_ranks` ranks."""
    if not offloads_states(offload):
        return 0
    total = optimizer_state_bytes + trainable_params * FP32_GRADIENT_BYTES
    total += weight_bytes if offloads_params(offload) else 0
    return -(-total // num_ranks)


def host_link_name(gpu_name: str) -> str:
    """The PCIe generation between a GPU and its host (catalog name), by GPU."""
    return HOST_LINK_BY_GPU.get(gpu_name, HOST_LINK_OTHER)


def copy_seconds(nbytes: float, host_bandwidth_bytes_per_s: float) -> float:
    """Time of one host-device copy of `nbytes` over a PCIe link."""
    if host_bandwidth_bytes_per_s <= 0 or nbytes < 0:
        raise TunecostError("a host copy needs a positive bandwidth and non-negative bytes")
    return nbytes / host_bandwidth_bytes_per_s
