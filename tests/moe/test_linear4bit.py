"""The paper-faithful QLoRA experts: really 4-bit, and every LoRA factor is live."""

from __future__ import annotations

import copy

import pytest
import torch
from moe_helpers import (
    assert_close,
    forward_backward,
    make_block,
    make_inputs,
    merged_reference_backward,
    randomize_lora,
)

from tunecost.moe import LoraSpec, install_experts
from tunecost.moe.linear4bit import Linear4bitExperts, LoraLinear

RANK, ALPHA = 4, 8


@pytest.fixture(scope="module")
def qlora_block():
    # dims that are multiples of the 4-bit blocksize: bitsandbytes' own CPU Linear4bit mis-dequantizes others
    block = make_block(top_k=2, starve_expert=None, hidden=64, intermediate=64)
    qlora = install_experts(copy.deepcopy(block), "qlora-linear4bit", LoraSpec(rank=RANK, alpha=ALPHA))
    randomize_lora(qlora)  # B starts at zero, which would leave every A without gradient
    return block, qlora


def test_stored_expert_bytes_are_4bit(qlora_block):
    block, qlora = qlora_block
    experts = qlora.experts
    assert isinstance(experts, Linear4bitExperts)
    dense_numel = block.experts.gate_up_proj.numel() + block.experts.down_proj.numel()
    packed_numel = 0
    for expert in experts.experts:
        for name in ("w1", "w3", "w2"):
            layer = getattr(expert, name)
            assert isinstance(layer, LoraLinear)
            weight = layer.base_layer.weight
            state = weight.quant_state
            assert weight.dtype == torch.uint8 and not weight.requires_grad
            assert weight.numel() == layer.base_layer.in_features * layer.base_layer.out_features // 2
            assert state.quant_type == "nf4" and state.blocksize == 64 and state.nested  # QLoRA double quant
            packed_numel += weight.numel()
    assert packed_numel == dense_numel // 2
    assert not any(
        "weight" in n and p.dtype.is_floating_point and p.numel() >= 64 * 64
        for n, p in experts.named_parameters()
        if "lora_" not in n
    )


def test_every_lora_factor_changes_the_output_and_gets_a_gradient(qlora_block):
    _, qlora = qlora_block
    x = make_inputs(tokens=64, hidden=64, shift=0.0)
    out, _ = forward_backward(qlora, x)
    assert bool((qlora.experts.last_tokens_per_expert > 0).all())  # every expert is exercised
    factors = {n: p for n, p in qlora.named_parameters() if "lora_" in n}
    # 8 experts x (w1, w3, w2) x (A, B) + the router's A and B
    assert len(factors) == 8 * 3 * 2 + 2
    assert set(factors) == {n for n, p in qlora.named_parameters() if p.requires_grad}
    for name, p in factors.items():
        assert p.grad is not None and p.grad.abs().max() > 0, f"{name} got no gradient"
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in factors.items():
            saved = p.detach().clone()
            p.add_(0.5 * torch.randn(p.shape, generator=g))  # random: a constant shift of router logits is a no-op
            changed = (qlora(x) - out).abs().max()
            p.copy_(saved)
            assert changed > 1e-4 * out.abs().max(), f"perturbing {name} did not change the output"


def test_matches_a_dense_reference_with_the_dequantized_weights(qlora_block):
    block, qlora = qlora_block
    x = make_inputs(tokens=64, hidden=64, shift=0.0)
    out, dx = forward_backward(qlora, x)
    s = ALPHA / RANK
    gate_up, down = qlora.experts.dense_weights()
    experts = qlora.experts.experts
    lora = {name: [getattr(e, name) for e in experts] for name in ("w1", "w3", "w2")}
    leaves = {
        f"{n}.{ab}": torch.stack([getattr(m, f"lora_{ab}").weight.detach() for m in mods]).requires_grad_(True)
        for n, mods in lora.items()
        for ab in ("A", "B")
    }
    i = down.shape[-1]
    expected, dx_expected = merged_reference_backward(
        x,
        block=block,
        lora_block=qlora,
        scaling=s,
        gate=gate_up[:, :i] + s * leaves["w1.B"] @ leaves["w1.A"],
        up=gate_up[:, i:] + s * leaves["w3.B"] @ leaves["w3.A"],
        down=down + s * leaves["w2.B"] @ leaves["w2.A"],
    )
    assert_close(out.reshape(expected.shape), expected)
    assert_close(dx, dx_expected)
    for key, leaf in leaves.items():
        name, ab = key.split(".")
        got = torch.stack([getattr(m, f"lora_{ab}").weight.grad for m in lora[name]])
        assert_close(got, leaf.grad)
