"""Activation offload (torchtune's `enable_activation_offloading`): what the forward saves goes to the host and
comes back in backward on a stream of its own, beside the step's compute; only what the copies do not hide adds."""

from __future__ import annotations

from tunecost.catalog.interconnects import resolve_interconnect
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.model import smooth_max
from tunecost.models.catalog import ModelSpec
from tunecost.models.families import arch_of
from tunecost.workload import offload
from tunecost.workload.job import FineTuneJob

# with checkpointing the forward saves each decoder layer's input, the final norm's and the output head's
EXTRA_SAVED_HIDDEN_STATES = 2


def offloaded_bytes(spec: ModelSpec, job: FineTuneJob, tokens: float) -> float:
    """Bytes one micro-batch of `tokens` copies each way. Only with gradient checkpointing: without it every
    activation of every layer would go, which the counts do not list."""
    if not job.gradient_checkpointing:
        raise TunecostError("activation offload without gradient checkpointing is not modelled for throughput")
    states = spec.num_layers + EXTRA_SAVED_HIDDEN_STATES
    return states * tokens * arch_of(spec).hidden * job.compute_bytes_per_element


def copies_seconds(spec: ModelSpec, job: FineTuneJob, tokens: float, gpu_name: str) -> float:
    """Seconds of one micro-batch's copies, to the host and back, over the GPU's PCIe link."""
    link = resolve_interconnect(offload.host_link_name(gpu_name))
    return 2 * offload.copy_seconds(offloaded_bytes(spec, job, tokens), link.bus_bandwidth_bytes_per_s)


def with_copies_s(compute_s: float, copies_s: float) -> float:
    """A step whose copies run beside its compute: the larger of the two, with the roofline's soft corner."""
    return smooth_max(compute_s, copies_s)
