"""Frozen / quantized / LoRA modules the simulator swaps into a transformers model (fake- and real-tensor safe).

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.modules`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from tunecost.simulate.counts import op_class_scope
from tunecost.simulate.quant4bit import (
    Quantized4bit,
    QuantSpec,
    grouped_matmul_4bit,
    is_fake,
    matmul_4bit,
    tokens_per_expert,
)


def _new_param(shape, *, device, dtype, zero: bool = False) -> nn.Parameter:
    t = torch.empty(shape, device=device, dtype=dtype)
    if device is not None and torch.device(device).type != "meta":
        if zero:
            t.zero_()
        else:
            nn.init.kaiming_uniform_(t.view(-1, shape[-1]), a=math.sqrt(5))
    return nn.Parameter(t)


class SimLinear(nn.Module):
    """y = x W^T (+ b) with W frozen (compute dtype, 4-bit or int8), plus s * (x A^T) B^T when LoRA is on."""

    def __init__(
        self,
        base: nn.Linear,
        *,
        quant: QuantSpec | None,
        lora_rank: int | None = None,
        lora_alpha: float = 32.0,
        lora_dtype: torch.dtype = torch.float32,
        style: str = "tunecost",
        lora_dropout: float = 0.0,
        compute_dtype: torch.dtype | None = None,  # autocast's over fp32 weights (None: the weight's dtype)
    ) -> None:
        super().__init__()
        w = base.weight
        self.lora_dropout = lora_dropout
        self.out_features, self.in_features = w.shape
        self.compute_dtype = compute_dtype or w.dtype
        self.style = style
        dev = w.device
        self.qweight: Quantized4bit | None
        self.weight: nn.Parameter | None
        if quant is not None:
            self.qweight = Quantized4bit(1, self.out_features, self.in_features, quant, device=dev)
            if dev.type != "meta" and not is_fake(w):
                self.qweight.load_from(w.data[None])
            self.weight = None
        else:
            self.qweight = None
            self.weight = nn.Parameter(w.data, requires_grad=False)
        self.bias = None if base.bias is None else nn.Parameter(base.bias.data, requires_grad=False)
        self.lora_rank = lora_rank
        if lora_rank:
            self.scaling = lora_alpha / lora_rank
            self.lora_A = _new_param((lora_rank, self.in_features), device=dev, dtype=lora_dtype)
            self.lora_B = _new_param((self.out_features, lora_rank), device=dev, dtype=lora_dtype, zero=True)

    def _base(self, x_c: torch.Tensor) -> torch.Tensor:
        if self.qweight is not None:
            y = matmul_4bit(x_c, self.qweight)
            return y if self.bias is None else y + self.bias
        assert self.weight is not None  # set whenever qweight is not
        return nn.functional.linear(x_c, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        # An input in another dtype (fp32 after fp32 norms) is computed in the compute dtype: bitsandbytes'
        # Linear4bit casts it and casts its output back to the input's dtype; autocast casts a plain linear's input
        # and keeps the compute dtype. The cast copy dies with the base matmul, as inside bitsandbytes' forward.
        if self.qweight is not None and self.qweight.spec.is_int8:
            y = self._base(x2)  # Linear8bitLt: bitsandbytes casts to fp16 inside; out in the input's dtype
        else:
            y = self._base(x2.to(self.compute_dtype))
        if self.qweight is not None:
            y = y.to(x2.dtype)
        if self.lora_rank:
            # PEFT's GPTQ LoRA layer (peft/tuners/lora/gptq.py up to 0.13) casts nothing under autocast and adds
            # the update in place.
            gptq = self.qweight is not None and self.qweight.spec.is_gptq
            with op_class_scope("lora"):
                # PEFT >= 0.7 (style "peft") casts the input to the adapter dtype (fp32) first, and autocast
                # casts it back for the matmul: a copy of the input is what the matmul keeps for backward.
                x_lora = x2.to(self.lora_A.dtype) if self.style == "peft" and not gptq else x2
                if self.lora_dropout and self.training:  # PEFT: lora_A(dropout(x)) on the cast input (torchtune
                    # alike), on a GPU the fused kernel F.dropout runs there: a 1-byte mask kept, not CPU's noise
                    x_lora = torch.native_dropout(x_lora, self.lora_dropout, True)[0]
                x_lora = x_lora.to(self.compute_dtype)
                a = x_lora @ self.lora_A.to(self.compute_dtype).t()
                b_t = self.lora_B.to(self.compute_dtype).t()
                if self.style == "peft-2024":
                    y = y.clone()
                    y += (a @ b_t) * self.scaling
                elif self.style == "peft" and gptq and y.dtype == a.dtype:
                    y += (a @ b_t) * self.scaling
                elif self.style in ("peft", "torchtune") or y.dtype != a.dtype:
                    # out of place; lora_dropout 0 is nn.Identity (torchtune's LoRALinear: `out + scaling *
                    # lora_b(lora_a(x))`, adapters in the compute dtype)
                    y = y + (a @ b_t) * self.scaling
                else:
                    y = torch.addmm(y, a, b_t, alpha=self.scaling)
        return y.view(*lead, self.out_features)


def _glu(act_fn: Callable[[torch.Tensor], torch.Tensor], gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return act_fn(gate) * up


def _gpt_oss_glu(alpha: float, limit: float, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """transformers 5.23 `GptOssExperts._apply_gate` on the de-interleaved gate and up."""
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def split_gate_up(gate_up: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) of a (..., 2I) tensor whose last dimension holds both ("halves": gate first, Mixtral's;
    "interleaved": even and odd entries, gpt-oss's): views, as the models' code takes them."""
    if layout == "interleaved":
        return gate_up[..., ::2], gate_up[..., 1::2]
    gate, up = gate_up.chunk(2, dim=-1)
    return gate, up


@dataclass(frozen=True)
class ExpertWeights:
    """A transformers experts module's weights in one layout: gate/up (E, 2I, H) and down (E, H, I) (views of its
    parameters), optional biases (E, 2I) and (E, H), how gate and up sit in the 2I rows (`split_gate_up`), and
    the gated activation of (gate, up). Hold it only while building: its views keep the module's weights alive."""

    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None
    layout: str
    glu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def rows(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert's gate and up weight rows, (I, H) each."""
        gate, up = split_gate_up(self.gate_up[expert].transpose(0, 1), self.layout)
        return gate.transpose(0, 1), up.transpose(0, 1)


def expert_weights(experts: Any) -> ExpertWeights:
    """The weights of a transformers 5.23 experts module: Mixtral-style (`gate_up_proj` (E, 2I, H), `act_fn`) or
    gpt-oss's (`gate_up_proj` (E, H, 2I) interleaved, `down_proj` (E, I, H), biases, `alpha` and `limit`)."""
    if hasattr(experts, "gate_up_proj_bias"):
        return ExpertWeights(
            gate_up=experts.gate_up_proj.transpose(1, 2),
            down=experts.down_proj.transpose(1, 2),
            gate_up_bias=experts.gate_up_proj_bias,
            down_bias=experts.down_proj_bias,
            layout="interleaved",
            glu=partial(_gpt_oss_glu, float(experts.alpha), float(experts.limit)),
        )
    return ExpertWeights(
        gate_up=experts.gate_up_proj,
        down=experts.down_proj,
        gate_up_bias=None,
        down_bias=None,
        layout="halves",
        glu=partial(_glu, experts.act_fn),
    )


def _frozen(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t.data, requires_grad=False)


class SimExperts(nn.Module):
    """Routed experts with frozen (or 4-bit) weights and split LoRA; forward(hidden (T, H), top_k_index (T, k),
    top_k_weights (T, k)) like transformers' experts modules."""

    def __init__(
        self,
        experts: Any,  # a transformers experts module: gate_up_proj (E, 2I, H), down_proj (E, H, I), act_fn
        *,
        quant: QuantSpec | None,
        lora_rank: int | None,
        lora_alpha: float = 32.0,
        lora_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        weights = expert_weights(experts)
        gate_up, down = weights.gate_up, weights.down
        self.num_experts, two_i, self.hidden_dim = gate_up.shape
        self.intermediate_dim = two_i // 2
        self.layout, self.glu = weights.layout, weights.glu
        self.gate_up_bias, self.down_bias = _frozen(weights.gate_up_bias), _frozen(weights.down_bias)
        dev = gate_up.device
        self.q_gate_up: Quantized4bit | None
        self.q_down: Quantized4bit | None
        self.gate_up_proj: nn.Parameter | None
        self.down_proj: nn.Parameter | None
        if quant is not None:
            self.q_gate_up = Quantized4bit(self.num_experts, two_i, self.hidden_dim, quant, device=dev)
            self.q_down = Quantized4bit(self.num_experts, self.hidden_dim, self.intermediate_dim, quant, device=dev)
            if dev.type != "meta" and not is_fake(gate_up):
                self.q_gate_up.load_from(gate_up.data)
                self.q_down.load_from(down.data)
            self.gate_up_proj = self.down_proj = None
        else:
            self.q_gate_up = self.q_down = None
            self.gate_up_proj = nn.Parameter(gate_up.data, requires_grad=False)
            self.down_proj = nn.Parameter(down.data, requires_grad=False)
        self.lora_rank = lora_rank
        if lora_rank:
            e, r, h, i = self.num_experts, lora_rank, self.hidden_dim, self.intermediate_dim
            self.scaling = lora_alpha / lora_rank
            kw: dict[str, Any] = {"device": dev, "dtype": lora_dtype}
            if self.layout == "interleaved":  # one LoRA on the fused 3-D gate_up_proj (PEFT target_parameters)
                self.lora_A_gate_up = _new_param((e, r, h), **kw)
                self.lora_B_gate_up = _new_param((e, 2 * i, r), zero=True, **kw)
            else:
                self.lora_A_gate = _new_param((e, r, h), **kw)
                self.lora_B_gate = _new_param((e, i, r), zero=True, **kw)
                self.lora_A_up = _new_param((e, r, h), **kw)
                self.lora_B_up = _new_param((e, i, r), zero=True, **kw)
            self.lora_A_down = _new_param((e, r, i), **kw)
            self.lora_B_down = _new_param((e, h, r), zero=True, **kw)

    def _lora(self, x: torch.Tensor, a: nn.Parameter, b: nn.Parameter, offsets: torch.Tensor) -> torch.Tensor:
        with op_class_scope("lora"):
            xa = nn.functional.grouped_mm(x, a.to(x.dtype).transpose(-2, -1), offs=offsets)
            return nn.functional.grouped_mm(xa, b.to(x.dtype).transpose(-2, -1), offs=offsets)

    def _base(self, x, weight, qweight, counts, offsets) -> torch.Tensor:
        if qweight is not None:
            return grouped_matmul_4bit(x, qweight, counts)
        return nn.functional.grouped_mm(x, weight.transpose(-2, -1), offs=offsets)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        num_top_k = top_k_index.size(-1)
        num_tokens = hidden_states.size(0)
        sample_weights = top_k_weights.reshape(-1)
        expert_ids_g, perm = torch.sort(top_k_index.reshape(-1))
        x = hidden_states[perm // num_top_k]
        sample_weights_g = sample_weights[perm]
        histc = torch.histc(expert_ids_g.float(), bins=self.num_experts, min=0, max=self.num_experts - 1)
        offsets = torch.cumsum(histc, dim=0, dtype=torch.int32)
        counts = tokens_per_expert(expert_ids_g, self.num_experts) if self.q_gate_up is not None else ()

        gate_up = self._base(x, self.gate_up_proj, self.q_gate_up, counts, offsets)
        if self.gate_up_bias is not None:
            gate_up = gate_up + self.gate_up_bias[expert_ids_g]
        if self.lora_rank and self.layout == "interleaved":
            lora = self._lora(x, self.lora_A_gate_up, self.lora_B_gate_up, offsets)
            gate_up = torch.add(gate_up, lora, alpha=self.scaling)
        gate, up = split_gate_up(gate_up, self.layout)
        if self.lora_rank and self.layout != "interleaved":
            gate = torch.add(gate, self._lora(x, self.lora_A_gate, self.lora_B_gate, offsets), alpha=self.scaling)
            up = torch.add(up, self._lora(x, self.lora_A_up, self.lora_B_up, offsets), alpha=self.scaling)
        h = self.glu(gate, up)
        out = self._base(h, self.down_proj, self.q_down, counts, offsets)
        if self.down_bias is not None:
            out = out + self.down_bias[expert_ids_g]
        if self.lora_rank:
            out = torch.add(out, self._lora(h, self.lora_A_down, self.lora_B_down, offsets), alpha=self.scaling)

        weighted = out * sample_weights_g.unsqueeze(-1)
        inv_perm = torch.empty_like(perm)
        inv_perm[perm] = torch.arange(perm.size(0), device=perm.device)
        weighted = weighted[inv_perm]
        final = weighted.view(num_tokens, num_top_k, self.hidden_dim).sum(dim=1)
        return final.to(hidden_states.dtype)


class SimLoraRouter(nn.Module):
    """LoRA on a router's `weight` (E, H): the router's own forward with W + s * B @ A."""

    def __init__(
        self, router: Any, *, lora_rank: int, lora_alpha: float = 32.0, lora_dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.base = router
        num_experts, hidden = router.weight.shape
        dev = router.weight.device
        self.scaling = lora_alpha / lora_rank
        self.lora_A = _new_param((lora_rank, hidden), device=dev, dtype=lora_dtype)
        self.lora_B = _new_param((num_experts, lora_rank), device=dev, dtype=lora_dtype, zero=True)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        w = self.base.weight
        with op_class_scope("lora"):
            merged = torch.addmm(w, self.lora_B.to(w.dtype), self.lora_A.to(w.dtype), alpha=self.scaling)
        return torch.func.functional_call(self.base, {"weight": merged}, (hidden_states, *args), kwargs, strict=False)


class ModulesToSave(nn.Module):
    """PEFT's `ModulesToSaveWrapper` (modules_to_save): the original module stays, frozen, and a deep copy of it
    (same dtype) is trained and runs the forward; the copy's gradient and optimizer states come with it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.original_module = module.requires_grad_(False)
        self.modules_to_save = nn.ModuleDict({"default": copy.deepcopy(module).requires_grad_(True)})

    def forward(self, *args, **kwargs):
        return self.modules_to_save["default"](*args, **kwargs)
