"""BlackMamba on fake tensors, with the memory of the CUDA kernels the paper's runs used.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.mamba`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tunecost.errors import TunecostError
from tunecost.models.anatomy import decoder_layers
from tunecost.models.blackmamba import BlackMambaConfig, build_blackmamba
from tunecost.models.blackmamba.layers import MambaMixer, MoEMixer
from tunecost.simulate.counts import add_work
from tunecost.simulate.quant4bit import is_fake, tokens_per_expert

SCAN_CHUNK = 2048  # mamba-ssm's selective_scan_cuda chunk length (kNChunkSize)


def _scan_flops(b: int, d: int, seqlen: int, n: int, k: int) -> int:
    return 9 * b * d * seqlen * n + 2 * b * d * seqlen * k


class _FusedMambaInner(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xz, conv_w, conv_b, x_proj_w, dt_proj_w, out_proj_w, A, D, dt_bias):
        b, two_d, seqlen = xz.shape
        d, n, r = two_d // 2, A.shape[-1], dt_proj_w.shape[1]
        conv_out = xz.new_empty((b, d, seqlen))  # causal_conv1d_fwd (+SiLU)
        x_dbl = F.linear(conv_out.transpose(1, 2).reshape(b * seqlen, d), x_proj_w)  # (bL, r + 2n)
        delta = dt_proj_w @ x_dbl[:, :r].t()  # (d, bL)
        B = x_dbl[:, r : r + n].reshape(b, seqlen, n).permute(0, 2, 1).contiguous().unsqueeze(1)
        C = x_dbl[:, -n:].reshape(b, seqlen, n).permute(0, 2, 1).contiguous().unsqueeze(1)
        out = xz.new_empty((b, d, seqlen))
        states = xz.new_empty((b, d, math.ceil(seqlen / SCAN_CHUNK), 2 * n), dtype=torch.float32)
        out_z = xz.new_empty((b, d, seqlen))
        k = conv_w.shape[-1]
        es = xz.element_size()
        add_work(
            "ssm_scan",
            flops=_scan_flops(b, d, seqlen, n, k),
            nbytes=es * b * d * seqlen * 6 + 2 * 4 * b * seqlen * n + states.numel() * 4,
        )
        del conv_out, delta  # checkpoint_lvl=1: recomputed in backward
        ctx.save_for_backward(
            xz, conv_w, conv_b, x_dbl, x_proj_w, dt_proj_w, out_proj_w, A, B, C, D, dt_bias, states, out
        )
        return F.linear(out_z.transpose(1, 2), out_proj_w)

    @staticmethod
    def backward(ctx, dout):
        (xz, conv_w, conv_b, x_dbl, x_proj_w, dt_proj_w, out_proj_w, A, B, C, D, dt_bias, states, _out) = (
            ctx.saved_tensors
        )
        b, two_d, seqlen = xz.shape
        d, n, r = two_d // 2, A.shape[-1], dt_proj_w.shape[1]
        conv_out = xz.new_empty((b, d, seqlen))  # recomputed
        delta = dt_proj_w @ x_dbl[:, :r].t()
        dxz = torch.empty_like(xz)
        dout2 = dout.reshape(b * seqlen, -1).t()  # (H, bL)
        dout_y = out_proj_w.t() @ dout2  # (d, bL)
        dconv_out = xz.new_empty((b, d, seqlen))
        ddelta = xz.new_empty((b, d, seqlen))
        dA = torch.empty_like(A, dtype=torch.float32)
        dB = B.new_empty(B.shape, dtype=torch.float32)
        dC = C.new_empty(C.shape, dtype=torch.float32)
        dD = torch.empty_like(D, dtype=torch.float32)
        ddt_bias = torch.empty_like(dt_bias, dtype=torch.float32)
        out_z = xz.new_empty((b, d, seqlen))  # recomputed by the scan backward
        k = conv_w.shape[-1]
        es = xz.element_size()
        add_work(
            "ssm_scan",
            flops=2 * _scan_flops(b, d, seqlen, n, k),
            nbytes=es * b * d * seqlen * 10 + 4 * 4 * b * seqlen * n + 2 * states.numel() * 4,
        )
        del dout_y, delta
        dout_proj_w = dout2 @ out_z.transpose(1, 2).reshape(b * seqlen, d)
        del out_z
        dx_dbl = torch.empty_like(x_dbl)
        dx_dbl[:, r : r + n] = dB.squeeze(1).permute(0, 2, 1).reshape(b * seqlen, n)
        dx_dbl[:, -n:] = dC.squeeze(1).permute(0, 2, 1).reshape(b * seqlen, n)
        ddelta2 = ddelta.reshape(b, d, seqlen).permute(1, 0, 2).reshape(d, b * seqlen)
        ddt_proj_w = ddelta2 @ x_dbl[:, :r]
        dx_dbl[:, :r] = ddelta2.t() @ dt_proj_w
        del ddelta, ddelta2
        conv_flat = conv_out.transpose(1, 2).reshape(b * seqlen, d)
        dx_proj_w = dx_dbl.t() @ conv_flat
        dconv_flat = dconv_out.permute(1, 0, 2).reshape(d, b * seqlen)
        dconv_flat = torch.addmm(dconv_flat, x_proj_w.t(), dx_dbl.t())
        dconv_w = torch.empty_like(conv_w)  # causal_conv1d_bwd writes dx into dxz
        dconv_b = torch.empty_like(conv_b)
        return (
            dxz,
            dconv_w,
            dconv_b,
            dx_proj_w.to(x_proj_w.dtype),
            ddt_proj_w.to(dt_proj_w.dtype),
            dout_proj_w.to(out_proj_w.dtype),
            dA,
            dD,
            ddt_bias,
        )


class FusedMambaMixer(nn.Module):
    """A BlackMamba `MambaMixer` (same parameters) run as Zyphra's fast path: in_proj as a matmul, then
    mamba-ssm's fused inner function (see docs/memory-model.md)."""

    def __init__(self, mixer: MambaMixer) -> None:
        super().__init__()
        self.in_proj, self.conv1d, self.x_proj = mixer.in_proj, mixer.conv1d, mixer.x_proj
        self.dt_proj, self.out_proj = mixer.dt_proj, mixer.out_proj
        self.A_log, self.D = mixer.A_log, mixer.D

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not is_fake(hidden_states):
            raise TunecostError("the fused Mamba kernels are simulated on fake tensors only")
        b, seqlen, h = hidden_states.shape
        xz = (self.in_proj.weight @ hidden_states.reshape(b * seqlen, h).t()).reshape(-1, b, seqlen)
        xz = xz.permute(1, 0, 2)  # (b, 2d, L) view, as Zyphra's rearrange
        A = -torch.exp(self.A_log.float())
        return _FusedMambaInner.apply(
            xz,
            self.conv1d.weight,
            self.conv1d.bias,
            self.x_proj.weight,
            self.dt_proj.weight,
            self.out_proj.weight,
            A,
            self.D.float(),
            self.dt_proj.bias.float(),
        )


class LoopMoEMixer(nn.Module):
    """BlackMamba's `MoEMixer` (same router and experts) with a sort-based per-expert token split."""

    def __init__(self, mixer: MoEMixer) -> None:
        super().__init__()
        self.router, self.local_experts = mixer.router, mixer.local_experts
        self.num_experts, self.experts_per_token = mixer.num_experts, mixer.experts_per_token

    def forward(self, hidden_states: torch.Tensor, output_router_logits: bool = False):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        router_logits = self.router(x)
        k = self.experts_per_token
        scores, chosen = torch.sigmoid(router_logits).topk(k, dim=-1)
        out = torch.zeros_like(x)
        ids_sorted, perm = torch.sort(chosen.reshape(-1))
        counts = tokens_per_expert(ids_sorted, self.num_experts)
        token_idx_all, slot_all = perm // k, perm % k
        start = 0
        for e, n in enumerate(counts):
            if n:
                token_idx, slot = token_idx_all[start : start + n], slot_all[start : start + n]
                y = self.local_experts[e](x[token_idx]) * scores[token_idx, slot].unsqueeze(-1).to(x.dtype)
                out.index_add_(0, token_idx, y)
            start += n
        out = out.reshape(shape)
        if not output_router_logits:
            return out
        per_expert = torch.histc(ids_sorted.float(), bins=self.num_experts, min=0, max=self.num_experts - 1)
        return out, (router_logits, per_expert)


def build_blackmamba_for_sim(spec, *, num_layers: int, experts_per_token: int | None, dtype, device: str):
    """BlackMamba of `spec` with `num_layers` layers (the alternation kept), mixers swapped for simulation."""
    raw = dict(spec.config)
    raw["num_layers"] = num_layers
    raw["mamba_moe_layers"] = list(raw["mamba_moe_layers"])[:num_layers]
    cfg = BlackMambaConfig.from_dict(raw, where=spec.name)
    top_k = experts_per_token or cfg.experts_per_token
    cfg = cfg.with_experts_per_token(top_k)
    model = build_blackmamba(cfg, device=device, dtype=dtype)
    for layer in decoder_layers(model):
        if isinstance(layer.mixer, MambaMixer):
            layer.mixer = FusedMambaMixer(layer.mixer)
        elif isinstance(layer.mixer, MoEMixer):
            layer.mixer = LoopMoEMixer(layer.mixer)
    return model
