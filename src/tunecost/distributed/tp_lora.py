"""Tensor parallelism of tunecost's LoRA linear (`simulate.modules.SimLinear`, frozen weight plus LoRA factors
A (r x in) and B (out x r)): PyTorch's ColwiseParallel/RowwiseParallel with the same inputs and outputs, and a
partition of the factors as a sharded LoRA layer needs: column-parallel, W and B split by output rows and A
replicated; row-parallel, W and A split by input columns and B replicated (the update's partial sums are reduced
with the base output's). 4-bit weights are not sharded (QLoRA under TP is refused).

Sources and derivations: docs/multi-gpu.md, section "Tensor parallelism: one rank on a fake process group vs gloo".
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

COLWISE_SHARDS = {"weight": 0, "bias": 0, "lora_A": None, "lora_B": 0}  # parameter -> sharded dim (None: whole)
ROWWISE_SHARDS = {"weight": 1, "bias": None, "lora_A": 1, "lora_B": None}


def _partition(shards: dict[str, int | None], _name: str, module: nn.Module, mesh) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    for name, param in list(module.named_parameters(recurse=False)):
        dim = shards[name]
        placement = Replicate() if dim is None else Shard(dim)
        module.register_parameter(
            name, nn.Parameter(distribute_tensor(param, mesh, [placement]), requires_grad=param.requires_grad)
        )


def lora_linear_style(style: Any) -> Any:
    """The ParallelStyle for a `SimLinear` that `style` (a ColwiseParallel or RowwiseParallel of the plan) gives an
    nn.Linear in the same place: the same input and output layouts."""
    from torch.distributed.tensor import Shard, distribute_module
    from torch.distributed.tensor.parallel import ColwiseParallel

    colwise = isinstance(style, ColwiseParallel)
    shards = COLWISE_SHARDS if colwise else ROWWISE_SHARDS
    # what the styles' `_apply` sets for an nn.Linear: a column-parallel input whole, a row-parallel one split
    desired_input = style.desired_input_layouts if colwise else (Shard(-1),)

    def apply(module: nn.Module, device_mesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            partial(_partition, shards),
            partial(style._prepare_input_fn, style.input_layouts, desired_input),
            partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
        )

    style._apply = apply  # this instance only: its own layouts, our partition
    return style
