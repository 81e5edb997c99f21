"""Granite 4.0's Mamba2 layers on fake tensors, with the memory and work of mamba-ssm's fused training kernel
(`mamba_split_conv1d_scan_combined`), which transformers calls when mamba-ssm is installed.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.mamba2`.
"""

from __future__ import annotations

import math
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tunecost.simulate.counts import add_work
from tunecost.workload.ssd import ssd_bytes, ssd_flops


class _SplitConv1dScan(torch.autograd.Function):
    """mamba-ssm's MambaSplitConv1dScanCombinedFn with a gated RMSNorm and the output projection: saves the input
    projection's output, the scan's output (B, L, H, P) and the norm's fp32 inverse RMS per group; the convolution,
    the chunk states and the normalised output are recomputed in backward."""

    @staticmethod
    def forward(
        ctx: Any, zxbcdt, conv_w, conv_b, dt_bias, a, d, norm_w, out_w, out_b, shape: tuple[int, int, int, int]
    ):
        heads, head_dim, groups, chunk = shape
        b, t, _ = zxbcdt.shape
        dim = heads * head_dim
        state = (conv_w.shape[0] - dim) // groups // 2
        nc = math.ceil(t / chunk)
        conv = zxbcdt.new_empty((b, t, conv_w.shape[0]))  # causal_conv1d_fwd (+SiLU)
        cumsum = zxbcdt.new_empty((2, b, heads, nc, chunk), dtype=torch.float32)  # dA_cumsum and dt
        states = zxbcdt.new_empty((b, nc, heads, head_dim, state), dtype=torch.float32)  # _chunk_state_fwd
        passed = zxbcdt.new_empty((b, nc, heads, head_dim, state))  # _state_passing_fwd, in C's dtype
        cb = zxbcdt.new_empty((b, nc, groups, chunk, chunk), dtype=torch.float32)  # _bmm_chunk_fwd
        del states
        out_x = zxbcdt.new_empty((b, t, heads, head_dim))  # _chunk_scan_fwd
        del conv, cumsum, passed, cb
        normed = zxbcdt.new_empty((b, t, dim))  # _layer_norm_fwd, gated by z
        rstd = zxbcdt.new_empty((groups * b * t,), dtype=torch.float32)
        fwd_flops, _ = ssd_flops(b * t, heads, head_dim, state, groups, chunk)
        fwd_flops += 2 * b * t * conv_w.shape[0] * conv_w.shape[1]  # the convolution
        add_work(
            "ssm_scan",
            flops=int(fwd_flops),
            nbytes=int(ssd_bytes(b * t, heads, head_dim, state, groups, chunk, zxbcdt.element_size(), chunks=b * nc)),
        )
        out = F.linear(normed, out_w, out_b)
        del normed
        ctx.shape = shape
        ctx.save_for_backward(zxbcdt, conv_w, conv_b, out_x, a, d, dt_bias, norm_w, rstd, out_w, out_b)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor):
        zxbcdt, conv_w, conv_b, _out_x, a, d, dt_bias, norm_w, _rstd, out_w, out_b = ctx.saved_tensors
        heads, head_dim, groups, chunk = ctx.shape
        b, t, _ = zxbcdt.shape
        dim = heads * head_dim
        state = (conv_w.shape[0] - dim) // groups // 2
        nc = math.ceil(t / chunk)
        out_recompute = zxbcdt.new_empty((b, t, dim))
        conv = zxbcdt.new_empty((b, t, conv_w.shape[0]))  # x, B, C recomputed
        dzxbcdt = torch.empty_like(zxbcdt)
        dxbc = zxbcdt.new_empty((b, t, conv_w.shape[0]))
        dy = F.linear(dout, out_w.t())  # dout through the output projection
        states = zxbcdt.new_empty((2, b, nc, heads, head_dim, state), dtype=torch.float32)  # states, dstates
        cb = zxbcdt.new_empty((2, b, nc, groups, chunk, chunk), dtype=torch.float32)  # CB, dCB
        del dy, states, cb, conv
        dout_w = torch.einsum("bso,bsd->od", dout, out_recompute)  # computed whether out_proj trains or not
        del out_recompute, dxbc
        _, bwd_flops = ssd_flops(b * t, heads, head_dim, state, groups, chunk)
        bwd_flops += 3 * 2 * b * t * conv_w.shape[0] * conv_w.shape[1]  # the convolution again, and its gradients
        add_work(
            "ssm_scan",
            flops=int(bwd_flops),
            nbytes=int(
                3 * ssd_bytes(b * t, heads, head_dim, state, groups, chunk, zxbcdt.element_size(), chunks=b * nc)
            ),
        )
        d_bias = None if out_b is None else dout.sum(dim=(0, 1))
        conv_b_grad = None if conv_b is None else torch.empty_like(conv_b)
        return (
            dzxbcdt,
            torch.empty_like(conv_w),
            conv_b_grad,
            torch.empty_like(dt_bias),
            torch.empty_like(a),
            torch.empty_like(d),
            torch.empty_like(norm_w),
            dout_w,
            d_bias,
            None,
        )


def _kernel_forward(self: Any, hidden_states: torch.Tensor, **_kwargs: Any) -> torch.Tensor:
    """GraniteMoeHybridMambaLayer.forward's training path: in_proj, then mamba-ssm's fused kernel (conv, SSD scan,
    gated RMSNorm, out_proj)."""
    return _SplitConv1dScan.apply(
        self.in_proj(hidden_states),
        self.conv1d.weight.squeeze(1),
        self.conv1d.bias,
        self.dt_bias,
        -torch.exp(self.A_log.float()),
        self.D,
        self.norm.weight,
        self.out_proj.weight,  # the frozen base weight under LoRA: the adapter is bypassed
        self.out_proj.bias,
        (self.num_heads, self.head_dim, self.n_groups, self.chunk_size),
    )


def install_mamba2_kernels(model: nn.Module) -> None:
    """Bind the fused kernel's forward to every Mamba2 layer of `model` (transformers calls
    `mamba_split_conv1d_scan_combined` in training when mamba-ssm is installed, as on a GPU). Not for 4-bit
    layers: the kernel cannot take bitsandbytes' packed out_proj weight."""
    for module in model.modules():
        if type(module).__name__.endswith("MambaLayer") and hasattr(module, "in_proj"):
            module.forward = MethodType(_kernel_forward, module)
