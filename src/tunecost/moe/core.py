"""The expert computation of `FastExperts`: route once, grouped GEMMs, split LoRA on routed rows only.

Sources and derivations: docs/moe-layer.md, section `tunecost.moe.core`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from tunecost.moe import ranges
from tunecost.moe.grouped import (
    Groups,
    Routing,
    grouped_addmm_,
    grouped_matmul,
    grouped_matmul_wgrad,
    groups_from_counts,
    route,
)
from tunecost.moe.nf4 import NF4ExpertWeights

ACTIVATIONS: tuple[str, ...] = ("silu", "gelu", "gelu_tanh")
# torch.profiler / NVTX range names (tunecost.moe.ranges), so the kernel classifier reads the experts' own work;
# forward and backward work carry the same name.
W1W3_RANGE, W2_RANGE = ranges.W1W3, ranges.W2
LORA_RANGE, ACT_RANGE, DEQUANT_RANGE = ranges.LORA, ranges.ACTIVATION, ranges.DEQUANT
_BACKWARD_CHUNKS = 2


def activation_forward(name: str, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """act(x), written into `out` when given (a column slice: no temporary, no copy)."""
    approximate = "tanh" if name == "gelu_tanh" else "none"
    if out is None:
        return F.silu(x) if name == "silu" else F.gelu(x, approximate=approximate)
    if name == "silu":
        return torch.ops.aten.silu.out(x, out=out)
    return torch.ops.aten.gelu.out(x, approximate=approximate, out=out)


def activation_backward(name: str, grad: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """d act(x) / dx * grad, written into `out` (a column slice of the (rows, 2I) gradient: no extra copy)."""
    if name == "silu":
        return torch.ops.aten.silu_backward.grad_input(grad, x, grad_input=out)
    approximate = "tanh" if name == "gelu_tanh" else "none"
    return torch.ops.aten.gelu_backward.grad_input(grad, x, approximate=approximate, grad_input=out)


class BaseWeights:
    """Frozen or trainable dense expert weights, or NF4 stacks (frozen). `get` returns (W_gu, W_d, groups)."""

    def __init__(
        self,
        gate_up: torch.Tensor | NF4ExpertWeights,
        down: torch.Tensor | NF4ExpertWeights,
        *,
        keep_dequantized: bool | None = None,
    ) -> None:
        self.gate_up = gate_up
        self.down = down
        self.quantized = isinstance(gate_up, NF4ExpertWeights)
        self.keep_dequantized = keep_dequantized

    def get(self, routing: Routing) -> tuple[torch.Tensor, torch.Tensor, Groups]:
        gate_up, down = self.gate_up, self.down
        if isinstance(gate_up, NF4ExpertWeights) and isinstance(down, NF4ExpertWeights):
            hit = routing.hit_experts
            return gate_up.dequantize(hit), down.dequantize(hit), routing.hit_groups()
        assert isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor)  # both dense or both NF4
        return gate_up, down, routing.groups


@dataclass(frozen=True)
class ExpertLora:
    """LoRA factors of one experts module (any may be None: no LoRA there).

    a_gate_up: (E, R, H); fused layout R = r and b_gate_up (E, 2I, r) covers both halves; per-projection
    layout R = 2r, rows [0, r) feed b_gate (E, I, r) and rows [r, 2r) feed b_up (E, I, r).
    a_down (E, r, I), b_down (E, H, r).
    """

    scaling: float
    a_gate_up: torch.Tensor | None = None
    b_gate_up: torch.Tensor | None = None
    b_gate: torch.Tensor | None = None
    b_up: torch.Tensor | None = None
    a_down: torch.Tensor | None = None
    b_down: torch.Tensor | None = None


def _keep_dequantized(policy: bool | None) -> bool:
    """Whether a forward keeps its de-quantized experts for the backward. Default (None): only when that costs
    one layer's worth at a time, i.e. inside a backward (a reentrant checkpoint's recomputation) or under
    saved-tensor hooks (non-reentrant checkpointing: it drops what the first forward saves and keeps what the
    recomputation saves; both forwards must save the same tensors, which this rule guarantees). Plain training
    would otherwise hold every layer's de-quantized experts until its backward: the model in full precision."""
    if policy is not None:
        return policy
    try:
        in_backward = torch._C._current_graph_task_id() != -1
        hooked = torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
    except (AttributeError, TypeError):  # private API moved: fall back to the memory-safe choice
        return False
    return in_backward or hooked


def _up_blocks(b_gate_up, b_gate, b_up, intermediate: int):
    """(B, input columns of x A^T, output columns of h) for each LoRA block of the gate/up projection."""
    if b_gate_up is not None:
        rank = b_gate_up.shape[-1]
        return [(0, b_gate_up, slice(0, rank), slice(0, 2 * intermediate))]
    rank = b_gate.shape[-1]
    return [
        (1, b_gate, slice(0, rank), slice(0, intermediate)),
        (2, b_up, slice(rank, 2 * rank), slice(intermediate, 2 * intermediate)),
    ]


def _base_matmul(inp, weight, nf4, routing, base, base_groups):
    """`inp` times each expert's base weight: one grouped GEMM over `weight` (dense, or de-quantized and kept),
    else (`weight` None) the NF4 weight `nf4` de-quantized one expert range at a time."""
    if weight is not None:
        return grouped_matmul(inp, weight.transpose(1, 2), base_groups)
    return _nf4_matmul_by_range(inp, nf4, routing, base)


def _add_lora(out, inp, lora_a, blocks, groups, scaling):
    """out[:, cols_out] += scaling * (inp A^T)[:, cols_in] B^T for each (B, cols_in, cols_out) block, in place;
    returns inp A^T (saved for the backward)."""
    with record_function(LORA_RANGE):
        inp_a = grouped_matmul(inp, lora_a.transpose(1, 2), groups)
        for b, cols_in, cols_out in blocks:
            grouped_addmm_(out[:, cols_out], inp_a[:, cols_in], b.transpose(1, 2), groups, alpha=scaling)
    return inp_a


class _ExpertMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_gu, w_d, a_gu, b_gu, b_g, b_u, a_d, b_d, base, routing, scaling, activation):
        # w_gu / w_d are the dense weights when dense (so autograd can give them gradients in a full fine-tune),
        # None when the base weights are NF4 (then `base` de-quantizes them: all hit experts at once when they are
        # kept for the backward, else one expert range and one matrix at a time, as the backward does).
        keep = not base.quantized or _keep_dequantized(base.keep_dequantized)
        w_gu_g = w_d_g = base_groups = None  # the weights the grouped GEMMs use when kept (dense or de-quantized)
        if keep:
            with record_function(DEQUANT_RANGE):
                w_gu_g, w_d_g, base_groups = base.get(routing) if base.quantized else (w_gu, w_d, routing.groups)
        groups = routing.groups
        intermediate = (w_d_g if keep else base.down).shape[-1]
        with record_function(W1W3_RANGE):  # w1 and w3 of every expert, one grouped GEMM (per range without keep)
            h = _base_matmul(x, w_gu_g, base.gate_up, routing, base, base_groups)
        xa = None
        if a_gu is not None:
            up_blocks = [(b, cols_in, cols_out) for _, b, cols_in, cols_out in _up_blocks(b_gu, b_g, b_u, intermediate)]
            xa = _add_lora(h, x, a_gu, up_blocks, groups, scaling)
        with record_function(ACT_RANGE):
            gate, up = h[:, :intermediate], h[:, intermediate:]
            act = activation_forward(activation, gate)  # kept: recomputing it costs two passes in the backward
            a = act * up
        with record_function(W2_RANGE):
            y = _base_matmul(a, w_d_g, base.down, routing, base, base_groups)
        aa = None
        if a_d is not None:
            aa = _add_lora(y, a, a_d, [(b_d, slice(None), slice(None))], groups, scaling)

        if base.quantized:
            weights = (w_gu_g, w_d_g) if keep else ()
        else:
            weights = (w_gu, w_d)
        ctx.save_for_backward(x, h, act, xa, aa, a_gu, b_gu, b_g, b_u, a_d, b_d, *weights)
        ctx.base, ctx.routing = base, routing
        ctx.scaling, ctx.activation = scaling, activation
        return y

    @staticmethod
    def backward(ctx, dy):
        x, h, act, xa, aa, a_gu, b_gu, b_g, b_u, a_d, b_d, *weights = ctx.saved_tensors
        # `weights`: the dense weights, or the de-quantized ones kept since the forward; empty when the NF4 experts
        # were not kept, and then each expert range below de-quantizes only its own experts (about half of the
        # hit experts at a time instead of all of them: the full-precision copy is half the size).
        need = ctx.needs_input_grad
        dy = dy.contiguous()
        lora = (a_gu, b_gu, b_g, b_u, a_d, b_d)
        grads: list = [None] * 13
        if need[0]:
            grads[0] = torch.empty_like(x)
        for index, tensor in ((1, weights[:1]), (2, weights[1:])):  # only a trainable dense base asks for these
            if need[index]:
                grads[index] = torch.zeros_like(tensor[0])
        for index, tensor in enumerate(lora, start=3):
            if need[index]:
                grads[index] = torch.zeros_like(tensor)
        # Expert by expert range, about half the rows at a time: the (rows, 2I) and (rows, I) gradients of the
        # backward then exist for half the rows only. Each expert is in one range, so no gradient is summed.
        for rows, experts, compact, groups, base_groups in _row_chunks(ctx.routing, ctx.base):
            lora_c = tuple(None if t is None else t[experts] for t in lora)
            saved_c = tuple(None if t is None else t[rows] for t in (x, h, act, xa, aa))
            out = _backward_rows(
                dy[rows],
                saved_c,
                _range_weight(weights, 0, ctx.base.gate_up, ctx.routing, compact),
                _range_weight(weights, 1, ctx.base.down, ctx.routing, compact),
                lora_c,
                groups,
                base_groups,
                need,
                ctx.scaling,
                ctx.activation,
            )
            for index, value in out.items():
                target = grads[index][rows] if index == 0 else grads[index][experts]
                target.copy_(value)
            del out  # this range's gradients, before the next range's weights are de-quantized
        return tuple(grads)


def _range_weight(weights: tuple, which: int, stack, routing: Routing, compact: slice):
    """A getter for one expert range's weight matrix: a slice of the dense or kept weights, or the range
    de-quantized when asked (so the down matrix is freed before the gate/up one is de-quantized)."""
    if weights:
        return lambda: weights[which][compact]
    return lambda: _dequantize_range(stack, routing, compact)


def _dequantize_range(stack: NF4ExpertWeights, routing: Routing, compact: slice) -> torch.Tensor:
    """The hit experts `compact` (a `_row_chunks` range) of an NF4 stack, in full precision."""
    with record_function(DEQUANT_RANGE):
        return stack.dequantize(routing.hit_experts[compact])


def _nf4_matmul_by_range(
    inp: torch.Tensor, stack: NF4ExpertWeights, routing: Routing, base: BaseWeights
) -> torch.Tensor:
    """Rows of `inp` (sorted by expert) times W^T of their expert, W from the NF4 `stack`, de-quantizing only one
    expert range of `_row_chunks` at a time: a fraction of one matrix's hit experts exists in full precision."""
    out = inp.new_empty(inp.shape[0], stack.shape[0])
    for rows, _, compact, _, base_groups in _row_chunks(routing, base):
        weight = _dequantize_range(stack, routing, compact)
        out[rows] = grouped_matmul(inp[rows], weight.transpose(1, 2), base_groups)
        del weight  # before the next range is de-quantized, not after
    return out


def _row_chunks(routing: Routing, base: BaseWeights):
    """(rows, experts, base-weight indices, groups, base groups) for consecutive expert ranges of about
    1/_BACKWARD_CHUNKS of the rows each; groups are relative to the range's first row."""
    hit = routing.hit_experts
    ends = routing.groups.ends
    total = routing.groups.num_rows
    device = routing.groups.offsets.device
    cuts, target = [0], total / _BACKWARD_CHUNKS
    for position, expert in enumerate(hit[:-1]):
        if ends[expert] >= target * len(cuts):
            cuts.append(position + 1)
    cuts.append(len(hit))
    for first, last in itertools.pairwise(cuts):
        if first == last:
            continue
        e0, e1 = hit[first], hit[last - 1] + 1
        r0, r1 = (ends[e0 - 1] if e0 else 0), ends[e1 - 1]
        groups = groups_from_counts([ends[e] - (ends[e - 1] if e else 0) for e in range(e0, e1)], device)
        if base.quantized:  # compact weights: one per hit expert
            compact = slice(first, last)
            base_c = groups_from_counts([ends[e] - (ends[e - 1] if e else 0) for e in hit[first:last]], device)
        else:
            compact, base_c = slice(e0, e1), groups
        yield slice(r0, r1), slice(e0, e1), compact, groups, base_c


def _backward_rows(dy, saved, get_w_gu, get_w_d, lora, groups, base_groups, need, s, activation) -> dict:
    """Gradients for one range of rows (see _ExpertMLP); returns {input index: gradient for the range}.
    `get_w_gu` / `get_w_d` return the range's weights when first needed (down first), and each is dropped after
    its use, so de-quantized ranges exist one matrix at a time."""
    x, h, act, xa, aa = saved
    a_gu, b_gu, b_g, b_u, a_d, b_d = lora
    intermediate = h.shape[-1] // 2
    w_d_g = get_w_d()
    gate, up = h[:, :intermediate], h[:, intermediate:]
    out = {}
    need_a = (a_d is not None and need[7]) or need[2]
    with record_function(ACT_RANGE):
        a = act * up if need_a else None  # the gated product, only for the down projection's weight gradients
    with record_function(W2_RANGE):
        d_a = grouped_matmul(dy, w_d_g, base_groups)
        del w_d_g
        if need[2]:
            assert a is not None  # need_a covers need[2]
            out[2] = grouped_matmul_wgrad(dy, a, groups)
    if a_d is not None:
        with record_function(LORA_RANGE):
            if need[8]:
                out[8] = grouped_matmul_wgrad(dy, aa, groups).mul_(s)
            d_aa = grouped_matmul(dy, b_d, groups).mul_(s)
            if need[7]:
                assert a is not None  # need_a covers need[7]
                out[7] = grouped_matmul_wgrad(d_aa, a, groups)
            grouped_addmm_(d_a, d_aa, a_d, groups, alpha=1.0)
    del a
    with record_function(ACT_RANGE):
        dh = torch.empty_like(h)
        torch.mul(d_a, act, out=dh[:, intermediate:])  # d(act(g) * u)/du = act(g)
        activation_backward(activation, d_a.mul_(up), gate, out=dh[:, :intermediate])
        del d_a
    with record_function(W1W3_RANGE):
        if need[0]:
            out[0] = grouped_matmul(dh, get_w_gu(), base_groups)
        if need[1]:
            out[1] = grouped_matmul_wgrad(dh, x, groups)
    if a_gu is not None:
        with record_function(LORA_RANGE):
            d_xa = torch.empty_like(xa)
            for index, b, cols_in, cols_out in _up_blocks(b_gu, b_g, b_u, intermediate):
                if need[4 + index]:
                    out[4 + index] = grouped_matmul_wgrad(dh[:, cols_out], xa[:, cols_in], groups).mul_(s)
                d_xa[:, cols_in] = grouped_matmul(dh[:, cols_out], b, groups).mul_(s)
            if need[3]:
                out[3] = grouped_matmul_wgrad(d_xa, x, groups)
            if need[0]:
                grouped_addmm_(out[0], d_xa, a_gu, groups, alpha=1.0)
    return out


def experts_forward(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *,
    base: BaseWeights,
    lora: ExpertLora | None,
    activation: str,
    num_experts: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts' output (tokens, H) and tokens per expert (E,), same contract as transformers' experts."""
    routing = route(top_k_index, num_experts)
    num_tokens, hidden_dim = hidden_states.shape
    num_top_k = top_k_index.shape[-1]
    rows = hidden_states[routing.token_of_row]
    lora = lora or ExpertLora(scaling=1.0)
    dense = not base.quantized
    y = _ExpertMLP.apply(
        rows,
        base.gate_up if dense else None,
        base.down if dense else None,
        lora.a_gate_up,
        lora.b_gate_up,
        lora.b_gate,
        lora.b_up,
        lora.a_down,
        lora.b_down,
        base,
        routing,
        lora.scaling,
        activation,
    )
    # Weight by the router scores and restore token order: gather back, then sum the top_k slots of each token
    # (deterministic, unlike index_add_ on CUDA), in the scores' dtype as transformers' grouped_mm path does.
    weighted = y * top_k_weights.reshape(-1)[routing.perm].unsqueeze(-1)
    inverse = torch.empty_like(routing.perm)
    inverse[routing.perm] = torch.arange(routing.perm.numel(), device=routing.perm.device)
    out = weighted[inverse].view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
    return out.to(hidden_states.dtype), routing.tokens_per_expert
