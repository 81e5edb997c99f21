"""Tensor parallelism of a Mixtral-style MoE block, as Megatron shards experts when expert-tensor parallelism
follows TP: every expert split on its intermediate dimension (gate/up column-parallel, down row-parallel), the
router replicated, the block's input replicated (all-gathered with sequence parallelism) and its output a partial
sum, all-reduced (reduce-scattered with sequence parallelism) as a dense MLP's is.

Derivations: docs/multi-gpu.md, "Tensor parallelism of MoE blocks".
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tunecost.errors import TunecostError

# parameter of a transformers or tunecost experts module -> the dimension split across TP ranks (None: whole,
# its gradient a partial sum): gate_up (E, 2I, H) and down (E, H, I), LoRA's A (E, r, in) and B (E, out, r)
EXPERT_SHARDS: dict[str, int | None] = {
    "gate_up_proj": 1,
    "down_proj": 2,
    "lora_A_gate": None,
    "lora_B_gate": 1,
    "lora_A_up": None,
    "lora_B_up": 1,
    "lora_A_down": 2,
    "lora_B_down": None,
}


def rank_blocks_of_halves(gate_up: torch.Tensor, tp: int) -> torch.Tensor:
    """gate_up (E, 2I, H) with gate then up (the "halves" layout) reordered so that splitting dim 1 in `tp`
    contiguous chunks gives rank r [gate_r; up_r]: the module's `chunk(2)` on a rank's rows is its gate and up."""
    e, two_i, h = gate_up.shape
    return gate_up.reshape(e, 2, tp, two_i // (2 * tp), h).transpose(1, 2).reshape(e, two_i, h)


def _partition(module: nn.Module, mesh) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    tp = mesh.size()
    for name, param in list(module.named_parameters(recurse=False)):
        if name not in EXPERT_SHARDS:
            raise TunecostError(f"tensor parallelism: the experts' parameter {name!r} has no sharding rule")
        dim = EXPERT_SHARDS[name]
        data = rank_blocks_of_halves(param.data, tp) if name == "gate_up_proj" else param.data
        placement = Replicate() if dim is None else Shard(dim)
        sharded = distribute_tensor(data, mesh, [placement])
        module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))


class _ReplicatedGrad(torch.autograd.Function):
    """A replicated DTensor's local tensor whose gradient (this rank's partial sum) is all-reduced back into a
    replicated DTensor: the routing weights' and the tokens' gradients from the experts, so that they meet the
    router's (replicated) gradients in one layout."""

    @staticmethod
    def forward(ctx, t):
        ctx.mesh = t.device_mesh
        return t.to_local()

    @staticmethod
    def backward(ctx, grad):
        from torch.distributed.tensor import DTensor, Partial, Replicate

        return DTensor.from_local(grad, ctx.mesh, [Partial()], run_check=False).redistribute(ctx.mesh, [Replicate()])


class LocalShards(nn.Module):
    """Runs an experts `module` (parameters DTensors) on its local shards and local inputs: the tokens and routing
    weights replicated in (their gradients all-reduced), this rank's partial sum of the block's output out."""

    def __init__(self, module: nn.Module, mesh) -> None:
        super().__init__()
        self.module = module
        self.mesh = mesh

    def forward(self, *args):
        from torch.distributed.tensor import DTensor, Partial

        def local(t):
            if not isinstance(t, DTensor):
                return t
            return _ReplicatedGrad.apply(t) if t.is_floating_point() else t.to_local()

        params = {
            name: p.to_local(grad_placements=[Partial()] if p.placements[0].is_replicate() else None)
            for name, p in self.module.named_parameters()
        }
        out = torch.func.functional_call(self.module, params, tuple(local(a) for a in args))
        return DTensor.from_local(out, self.mesh, [Partial()], run_check=False)


def check_experts_layout(experts: nn.Module) -> None:
    """Refuse an experts module whose weights are not the (E, 2I, H) gate-then-up layout this split assumes."""
    layout = getattr(experts, "layout", None)
    concatenated = getattr(experts, "is_concatenated", True) and not getattr(experts, "is_transposed", False)
    if layout not in (None, "halves") or not concatenated or not hasattr(experts, "gate_up_proj"):
        raise TunecostError(
            f"tensor parallelism: {type(experts).__name__} does not keep Mixtral's (experts, 2 x intermediate, "
            "hidden) gate-then-up weights"
        )


def shard_experts(block: nn.Module, mesh) -> None:
    """Split `block.experts` (the MoE block of a decoder layer) on the intermediate dimension over `mesh` and
    replicate its router (`block.gate`), in place. The router's logits meet plain tensors in transformers'
    load-balancing loss: the step runs under `tensor_parallel.loss_context`, which replicates those implicitly."""
    from torch.distributed.tensor import distribute_module

    experts = block.get_submodule("experts")
    check_experts_layout(experts)
    _partition(experts, mesh)
    block.experts = LocalShards(experts, mesh)
    distribute_module(block.get_submodule("gate"), mesh)  # every parameter replicated; runs on DTensors


def moe_block_style(*, sequence_parallel: bool) -> Any:
    """The block's input made one replicated DTensor (all-gathered from the sequence shard with SP), so the
    router's and the experts' input gradients are summed before one all-reduce (reduce-scatter with SP); its
    partial-sum output all-reduced (reduce-scattered onto the sequence shard with SP)."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput

    seq = Shard(1) if sequence_parallel else Replicate()
    return PrepareModuleInputOutput(
        input_layouts=(seq,),
        desired_input_layouts=(Replicate(),),
        output_layouts=(Partial(),),
        desired_output_layouts=(seq,),
        use_local_output=not sequence_parallel,
    )
