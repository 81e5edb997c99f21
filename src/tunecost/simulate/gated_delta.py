"""Qwen3.5's gated DeltaNet layers on fake tensors, with the memory and work of the kernels a GPU run uses:
flash-linear-attention's chunked gated delta rule and causal-conv1d's convolution.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.gated_delta`.
"""

from __future__ import annotations

import math
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tunecost.simulate.counts import add_work
from tunecost.workload.gated_delta import CHUNK_TOKENS, delta_rule_bytes, delta_rule_flops


class _ChunkGatedDeltaRule(torch.autograd.Function):
    """fla 0.6's ChunkGatedDeltaRuleFunction with q/k l2-normalised in the kernel: saves the normalised q and k
    with their fp32 inverse norms, v, the fp32 chunk-cumulated gate, beta and A (B, T, HV, 64); w, u, h and v_new
    live through the forward only and are recomputed in backward."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
        b, t, h, kd = q.shape
        hv, vd = v.shape[2], v.shape[3]
        nt = math.ceil(t / CHUNK_TOKENS)
        qn, q_rstd = torch.empty_like(q), q.new_empty((b, t, h), dtype=torch.float32)
        kn, k_rstd = torch.empty_like(k), k.new_empty((b, t, h), dtype=torch.float32)
        gc = torch.empty_like(g, dtype=torch.float32)  # chunk_local_cumsum
        a = k.new_empty((b, t, hv, CHUNK_TOKENS))  # fused kkt + solve_tril
        w, u = k.new_empty((b, t, hv, kd)), torch.empty_like(v)  # recompute_w_u_fwd
        states, v_new = k.new_empty((b, nt, hv, kd, vd)), torch.empty_like(v)  # chunk_gated_delta_rule_fwd_h
        o = torch.empty_like(v)  # chunk_fwd_o
        fwd, _ = delta_rule_flops(b * t, hv, kd, vd)
        add_work(
            "ssm_scan", flops=int(fwd), nbytes=int(delta_rule_bytes(b * t, hv, kd, vd, k.element_size(), chunks=b * nt))
        )
        del w, u, states, v_new
        ctx.save_for_backward(qn, q_rstd, kn, k_rstd, v, gc, beta, a)
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor):
        qn, _q_rstd, kn, _k_rstd, v, gc, beta, _a = ctx.saved_tensors
        b, t, _, kd = qn.shape
        hv, vd = v.shape[2], v.shape[3]
        nt = math.ceil(t / CHUNK_TOKENS)
        w, u = kn.new_empty((b, t, hv, kd)), torch.empty_like(v)  # recompute_w_u_fwd
        states, v_new = kn.new_empty((b, nt, hv, kd, vd)), torch.empty_like(v)  # fwd_h again
        dv = torch.empty_like(v)  # chunk_bwd_dv_local
        dh = kn.new_empty((b, nt, hv, kd, vd))  # chunk_gated_delta_rule_bwd_dhu
        del states
        dq, dk, dw = torch.empty_like(qn), torch.empty_like(kn), torch.empty_like(w)  # chunk_bwd_dqkwg
        dg = torch.empty_like(gc)
        del dh, v_new
        dk2, dv2 = torch.empty_like(kn), torch.empty_like(v)  # prepare_wy_repr_bwd
        db = torch.empty_like(beta)
        del w, u, dw, dv, dk2
        _, bwd = delta_rule_flops(b * t, hv, kd, vd)
        add_work(
            "ssm_scan",
            flops=int(bwd),
            nbytes=int(3 * delta_rule_bytes(b * t, hv, kd, vd, kn.element_size(), chunks=b * nt)),
        )
        return dq, dk, dv2, dg, db


class _CausalConv1d(torch.autograd.Function):
    """causal-conv1d's depthwise convolution with SiLU fused: saves its input and weight only."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        b, d, t = x.shape
        add_work("ssm_scan", flops=2 * b * d * t * weight.shape[-1], nbytes=2 * x.numel() * x.element_size())
        ctx.save_for_backward(x, weight)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        x, weight = ctx.saved_tensors
        b, d, t = x.shape
        add_work("ssm_scan", flops=4 * b * d * t * weight.shape[-1], nbytes=3 * x.numel() * x.element_size())
        return torch.empty_like(x), torch.empty_like(weight)


def _kernel_forward(self: Any, hidden_states: torch.Tensor, **_kwargs: Any) -> torch.Tensor:
    """Qwen3_5GatedDeltaNet.forward's training path (no cache; Qwen3-Next's with its fused projections), its two
    kernels fla's and causal-conv1d's."""
    b, t, _ = hidden_states.shape
    if hasattr(self, "in_proj_qkvz"):  # Qwen3-Next: q, k, v, z and b, a interleaved per key head
        q, k, v, z, beta, a = self.fix_query_key_value_ordering(
            self.in_proj_qkvz(hidden_states), self.in_proj_ba(hidden_states)
        )
        mixed_qkv = torch.cat([x.reshape(b, t, -1) for x in (q, k, v)], dim=-1)
    else:
        mixed_qkv = self.in_proj_qkv(hidden_states)
        z = self.in_proj_z(hidden_states).reshape(b, t, -1, self.head_v_dim)
        beta, a = self.in_proj_b(hidden_states), self.in_proj_a(hidden_states)
    mixed_qkv = _CausalConv1d.apply(mixed_qkv.transpose(1, 2), self.conv1d.weight.squeeze(1))
    query, key, value = torch.split(mixed_qkv.transpose(1, 2), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    out = _ChunkGatedDeltaRule.apply(
        query.reshape(b, t, -1, self.head_k_dim),
        key.reshape(b, t, -1, self.head_k_dim),
        value.reshape(b, t, -1, self.head_v_dim),
        g,
        beta.sigmoid(),
    )
    out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(out.reshape(b, t, -1))


def install_gated_delta_kernels(model: nn.Module) -> None:
    """Bind the kernels' forward to every gated DeltaNet layer of `model` (transformers picks fla's and
    causal-conv1d's functions when they are installed, as on a GPU; their torch fallbacks keep more)."""
    for module in model.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            module.forward = MethodType(_kernel_forward, module)
