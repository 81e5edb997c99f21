"""DeepSpeed ZeRO CPU offload: what leaves the GPU, what the host holds, and the PCIe traffic of a step.

Sources and derivations: docs/multi-gpu.md, section `tunecost.workload.offload`.
"""

from __future__ import annotations

from tunecost.errors import TunecostError

OFFLOAD_CHOICES = ("none", "optimizer", "params")
OFFLOAD_STRATEGIES = {"optimizer": ("zero1", "zero2", "zero3"), "params": ("zero3", "fsdp1", "fsdp2")}
FP32_GRADIENT_BYTES = 4  # DeepSpeed keeps the offloaded gradient partition in fp32 for the CPU Adam
HOST_LINK_BY_GPU = {"H100-80GB-SXM": "PCIe5", "H100-80GB-PCIE": "PCIe5", "H200-141GB": "PCIe5"}
HOST_LINK_OTHER = "PCIe4"
# Host memory one parameter's CPU optimizer update moves, in elements of the states' dtype: DeepSpeedCPUAdam's
# one fused pass (fp32 param, grad, exp_avg, exp_avg_sq read, three written) and torch's AdamW on CPU tensors,
# fused=True likewise, else its single-tensor loop of eight ops (12 read, 8 written); docs/multi-gpu.md.
CPU_ADAM_ELEMENTS_FUSED = 7
CPU_ADAM_ELEMENTS_SINGLE_TENSOR = 20
DEEPSPEED_CPU_ADAM_BYTES = 4  # DeepSpeedCPUAdam's fp32 partition


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


def cpu_optimizer_seconds(params: float, bytes_per_param: float, host_memory_bytes_per_s: float) -> float:
    """Time of an optimizer step over `params` parameters on the host, bound by its memory bandwidth: a floor."""
    if host_memory_bytes_per_s <= 0 or params < 0 or bytes_per_param < 0:
        raise TunecostError("a CPU optimizer step needs a positive memory bandwidth and non-negative sizes")
    return params * bytes_per_param / host_memory_bytes_per_s
