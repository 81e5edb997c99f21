"""Memory that torch FSDP1 (``FullyShardedDataParallel``, what accelerate's FSDP runs) holds beyond the rank
derived from the single-GPU step (`rank_memory`): the layer inputs its reshard-only hooks keep.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.fsdp1`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunecost.distributed.single_step import SingleGpuStep

HELD_SEGMENT = "backward:unit_first"  # the backward of the first decoder layer: all the others are done


def held_input_bytes(step: SingleGpuStep, segment: str) -> int:
    """Bytes FSDP1 holds at `segment` ("phase:region") beyond the single-GPU step, when the step checkpoints
    re-entrantly and the decoder layers are frozen (not a full fine-tune). At the backward of the first of N
    layers: the inputs of the other N - 1 layers (the single-GPU step has freed them) and the gradients of N - 2 of
    them (the gradient of the second layer's input is the one flowing into the first layer, alive on one GPU too),
    each batch x seq_len x hidden in the residual stream's dtype.
    Nothing is held before the first layer's backward runs; the loss and the last layer's backward peak as on one
    GPU."""
    if not (step.reentrant_checkpointing and step.method != "full") or segment != HELD_SEGMENT:
        return 0
    per_layer = step.batch_size * step.seq_len * step.hidden_size * step.activation_bytes_per_element
    return max(0, 2 * step.num_layers - 3) * per_layer
