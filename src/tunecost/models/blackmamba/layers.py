"""BlackMamba's layers: RMSNorm, the Mamba mixer, the MoE mixer and its experts, and the pre-norm block.

Attribute names reproduce Zyphra's state-dict keys exactly (github.com/Zyphra/BlackMamba: `mamba_layer.py`,
`switch_mlp.py`, `mlp.py`, `mamba_block.py`), so their checkpoints load strictly. Each piece a profiler wants
to time on its own is its own module: `block.norm`, `block.mixer` (a `MambaMixer` or a `MoEMixer`), and inside
an MoE mixer `router` and `local_experts[e]`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tunecost.models.blackmamba.config import MAMBA_LAYER, BlackMambaConfig
from tunecost.models.blackmamba.scan import causal_conv1d, selective_scan

RouterInfo = tuple[torch.Tensor, torch.Tensor]  # (router logits (tokens, E), tokens per expert (E,))


class BlackMambaRMSNorm(nn.Module):
    """RMSNorm with a weight and no bias, computed in fp32 and returned in the input dtype (as the
    mamba-ssm Triton RMSNorm that Zyphra's blocks use)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class MambaMixer(nn.Module):
    """Mamba's selective SSM mixer (Zyphra `MambaLayer`, the non-fused path; same maths as the fused one)."""

    def __init__(self, config: BlackMambaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        h, d_inner, n, r = config.hidden_size, config.d_inner, config.state_size, config.dt_rank
        self.d_inner, self.d_state, self.dt_rank = d_inner, n, r
        self.in_proj = nn.Linear(h, 2 * d_inner, bias=config.add_bias_linear)
        k = config.conv_dimension
        self.conv1d = nn.Conv1d(d_inner, d_inner, kernel_size=k, groups=d_inner, padding=k - 1, bias=True)
        self.x_proj = nn.Linear(d_inner, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(d_inner, n))
        self.D = nn.Parameter(torch.empty(d_inner))
        self.out_proj = nn.Linear(d_inner, h, bias=config.add_bias_linear)

    @torch.no_grad()
    def reset_ssm_parameters(self, dt_min: float = 1e-3, dt_max: float = 0.1, dt_floor: float = 1e-4) -> None:
        """Zyphra's (and Mamba's) SSM init: S4D-real A, D = 1, dt_proj bias = softplus^-1 of a log-uniform
        dt in [dt_min, dt_max], dt_proj weight uniform in +-dt_rank^-0.5."""
        bound = self.dt_rank**-0.5
        self.dt_proj.weight.uniform_(-bound, bound)
        device = self.dt_proj.bias.device
        dt = torch.exp(
            torch.rand(self.d_inner, device=device) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        ).clamp(min=dt_floor)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        a = torch.arange(1, self.d_state + 1, dtype=torch.float32, device=device)
        self.A_log.copy_(torch.log(a).expand(self.d_inner, -1))
        self.D.fill_(1.0)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        xz = self.in_proj(hidden_states).transpose(1, 2)  # (b, 2*d_inner, L)
        x, z = xz.chunk(2, dim=1)
        x = causal_conv1d(x, self.conv1d.weight, self.conv1d.bias, activation="silu")
        x_dbl = self.x_proj(x.transpose(1, 2))  # (b, L, dt_rank + 2n)
        dt, b, c = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.linear(dt, self.dt_proj.weight).transpose(1, 2)  # its bias goes in as delta_bias, in fp32
        a = -torch.exp(self.A_log.float())
        y = selective_scan(
            x,
            dt,
            a,
            b.transpose(1, 2),
            c.transpose(1, 2),
            self.D.float(),
            z=z,
            delta_bias=self.dt_proj.bias.float(),
            delta_softplus=True,
        )
        return self.out_proj(y.transpose(1, 2))


class BlackMambaExpert(nn.Module):
    """One expert MLP: linear_fc1 -> gelu-gated unit (gelu(a) * b) or gelu -> linear_fc2 (Zyphra `MLP`)."""

    def __init__(self, config: BlackMambaConfig) -> None:
        super().__init__()
        self.swiglu = config.swiglu
        self.linear_fc1 = nn.Linear(config.hidden_size, config.fc1_output_size, bias=config.add_bias_linear)
        self.linear_fc2 = nn.Linear(config.ffn_hidden_size, config.hidden_size, bias=config.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear_fc1(x)
        if self.swiglu:
            a, b = h.chunk(2, dim=-1)
            h = F.gelu(a) * b
        else:
            h = F.gelu(h)
        return self.linear_fc2(h)


class MoEMixer(nn.Module):
    """Sigmoid-scored top-k MoE (Zyphra `SwitchMLP` generalised from top-1): each token goes to its k highest
    sigmoid(router) experts and the outputs are summed weighted by those scores, not renormalised; there is
    no load-balancing loss. At k = 1 this is exactly the released model's routing."""

    def __init__(self, config: BlackMambaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_experts = config.num_experts
        self.experts_per_token = config.experts_per_token
        self.router: nn.Module = nn.Linear(config.hidden_size, self.num_experts, bias=True)
        self.local_experts = nn.ModuleList(BlackMambaExpert(config) for _ in range(self.num_experts))

    @property
    def top_k(self) -> int:
        """Alias of `experts_per_token`, for code that sets `module.top_k` on every router (transformers')."""
        return self.experts_per_token

    @top_k.setter
    def top_k(self, k: int) -> None:
        self.experts_per_token = k

    def forward(
        self, hidden_states: torch.Tensor, output_router_logits: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, RouterInfo]:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        router_logits = self.router(x)  # (tokens, E)
        scores, chosen = torch.sigmoid(router_logits).topk(self.experts_per_token, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.local_experts):
            token_idx, slot = torch.where(chosen == e)
            if token_idx.numel() == 0:  # an idle expert costs nothing (Zyphra ran it on zero rows)
                continue
            y = expert(x[token_idx]) * scores[token_idx, slot].unsqueeze(-1).to(x.dtype)
            out.index_add_(0, token_idx, y)
        out = out.reshape(shape)
        if not output_router_logits:
            return out
        tokens_per_expert = torch.bincount(chosen.flatten(), minlength=self.num_experts)
        return out, (router_logits, tokens_per_expert)


class BlackMambaBlock(nn.Module):
    """Pre-norm residual block (Zyphra `MambaBlock` / `MoEBlock`): residual += previous output;
    out = mixer(norm(residual)); the residual stream is kept in fp32."""

    def __init__(self, config: BlackMambaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.layer_type = config.layer_types[layer_idx]
        self.norm = BlackMambaRMSNorm(config.hidden_size, eps=config.layernorm_epsilon)
        if self.layer_type == MAMBA_LAYER:
            self.mixer: nn.Module = MambaMixer(config, layer_idx)
        else:
            self.mixer = MoEMixer(config, layer_idx)

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None = None, output_router_logits: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, RouterInfo | None]:
        residual = hidden_states if residual is None else hidden_states + residual
        normed = self.norm(residual.to(self.norm.weight.dtype))
        residual = residual.float()
        if self.layer_type == MAMBA_LAYER:
            return self.mixer(normed), residual, None
        if output_router_logits:
            out, info = self.mixer(normed, output_router_logits=True)
            return out, residual, info
        return self.mixer(normed), residual, None
