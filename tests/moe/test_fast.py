"""FastExperts (core.py, grouped.py) against the reference path: PEFT LoRA on transformers' fused experts.

Outputs and gradients (LoRA A and B, router, input) match within fp32 tolerance on CPU, for
top-1, top-2 and dense routing, including experts that receive no tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch
from moe_helpers import (
    assert_close,
    copy_fast_lora_into_peft,
    forward_backward,
    make_block,
    make_inputs,
    merged_reference_backward,
    peft_factors,
    peft_reference,
    randomize_lora,
    to_peft_a,
    to_peft_b,
)

from tunecost.moe import LoraSpec, install_experts
from tunecost.moe.fast import FastExperts
from tunecost.moe.grouped import force_loop

RANK, ALPHA = 4, 8


def _fast_and_reference(top_k: int, hidden: int = 32, quantize_4bit: bool = False, keep: bool = True):
    # transformers' grouped_mm experts crash on rows that are not 16-byte multiples (torch 2.13 CPU; its
    # alignment check stops at torch 2.10), so such references run its eager experts.
    block = make_block(top_k=top_k, hidden=hidden, experts_impl="grouped_mm" if hidden % 4 == 0 else "eager")
    fast = install_experts(
        copy.deepcopy(block),
        "fast",
        LoraSpec(rank=RANK, alpha=ALPHA),
        quantize_4bit=quantize_4bit,
        keep_dequantized=keep,
    )
    randomize_lora(fast)
    if quantize_4bit:  # the reference holds the de-quantized weights
        gate_up, down = fast.experts.dense_weights()
        with torch.no_grad():
            block.experts.gate_up_proj.copy_(gate_up)
            block.experts.down_proj.copy_(down)
    ref = peft_reference(block, rank=RANK, alpha=ALPHA)
    copy_fast_lora_into_peft(fast, ref)
    return fast, ref


def _compare(fast, ref, x) -> None:
    out_ref, dx_ref = forward_backward(ref, x)
    out, dx = forward_backward(fast, x)
    assert_close(out, out_ref)
    assert_close(dx, dx_ref)
    f, experts = peft_factors(ref), fast.experts
    assert_close(to_peft_a(experts.lora_A_gate_up.grad), f["A_gate_up"].grad)
    assert_close(to_peft_b(experts.lora_B_gate_up.grad), f["B_gate_up"].grad)
    assert_close(to_peft_a(experts.lora_A_down.grad), f["A_down"].grad)
    assert_close(to_peft_b(experts.lora_B_down.grad), f["B_down"].grad)
    if fast.gate.top_k == 1:
        # top-1 renormalises the single score to 1: the output does not depend on the router, both paths give
        # round-off-sized gradients (the aux loss trains a top-1 router; test_router covers that).
        tiny = 1e-5 * dx_ref.abs().max()
        for grad in (fast.gate.lora_A.weight.grad, f["A_router"].grad, fast.gate.lora_B.weight.grad):
            assert grad.abs().max() < tiny
        return
    assert_close(fast.gate.lora_A.weight.grad, f["A_router"].grad)
    assert_close(fast.gate.lora_B.weight.grad, f["B_router"].grad)


@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_fast_matches_peft_on_fused_experts(top_k):
    fast, ref = _fast_and_reference(top_k)
    x = make_inputs()
    _compare(fast, ref, x)
    counts = fast.experts.last_tokens_per_expert
    assert int(counts.sum()) == x.shape[1] * top_k
    if top_k < 8:  # expert 3 is starved by construction: no tokens, zero LoRA gradient, no error
        assert int(counts[3]) == 0
        assert fast.experts.lora_B_gate_up.grad[3].abs().max() == 0
        assert fast.experts.lora_A_down.grad[3].abs().max() == 0
    else:
        assert bool((counts == x.shape[1]).all())


def test_base_weights_get_no_gradient():
    fast, _ = _fast_and_reference(2)
    forward_backward(fast, make_inputs())
    assert fast.experts.gate_up_proj.grad is None and fast.experts.down_proj.grad is None
    assert not fast.experts.gate_up_proj.requires_grad and fast.gate.weight.grad is None


def test_loop_fallback_matches_grouped_mm():
    fast, ref = _fast_and_reference(2)
    with force_loop():
        _compare(fast, ref, make_inputs())


def test_rows_not_16_byte_aligned_fall_back_to_the_loop():
    # hidden 30 in fp32: 120-byte rows, which torch's CPU grouped_mm rejects; the loop must take over.
    fast, ref = _fast_and_reference(2, hidden=30)
    _compare(fast, ref, make_inputs(hidden=30))


@pytest.mark.parametrize("keep", [True, False, None])
def test_fast_4bit_matches_reference_with_dequantized_weights(keep):
    fast, ref = _fast_and_reference(2, quantize_4bit=True, keep=keep)
    assert fast.experts.quantized and not hasattr(fast.experts, "gate_up_proj")
    _compare(fast, ref, make_inputs())


def test_full_finetune_gradients_match_stock_grouped_mm():
    block = make_block(top_k=2)
    for p in block.parameters():
        p.requires_grad_(True)
    fast = install_experts(copy.deepcopy(block), "fast")
    assert fast.experts.gate_up_proj.requires_grad
    x = make_inputs()
    out_ref, dx_ref = forward_backward(block, x)
    out, dx = forward_backward(fast, x)
    assert_close(out, out_ref)
    assert_close(dx, dx_ref)
    assert_close(fast.experts.gate_up_proj.grad, block.experts.gate_up_proj.grad)
    assert_close(fast.experts.down_proj.grad, block.experts.down_proj.grad)
    assert_close(fast.gate.weight.grad, block.gate.weight.grad)


def test_gelu_gated_experts_blackmamba_style():
    torch.manual_seed(0)
    num_experts, hidden, ffn = 4, 16, 24
    fc1 = torch.randn(num_experts, 2 * ffn, hidden) * 0.2  # BlackMamba linear_fc1: [a; b], gelu(a) * b
    fc2 = torch.randn(num_experts, hidden, ffn) * 0.2
    experts = FastExperts(fc1, fc2, activation="gelu", lora_rank=2, lora_alpha=4)
    randomize_lora(experts)
    x = torch.randn(10, hidden)
    scores = torch.sigmoid(torch.randn(10, num_experts))
    top, idx = torch.topk(scores, 2, dim=-1)
    out = experts(x, idx, top)
    s = 2.0
    gate = fc1[:, :ffn] + s * experts.lora_B_gate_up[:, :ffn].detach() @ experts.lora_A_gate_up.detach()
    up = fc1[:, ffn:] + s * experts.lora_B_gate_up[:, ffn:].detach() @ experts.lora_A_gate_up.detach()
    down = fc2 + s * experts.lora_B_down.detach() @ experts.lora_A_down.detach()
    expected = torch.zeros(10, hidden)
    for t in range(10):
        for slot in range(2):
            e = int(idx[t, slot])
            h = torch.nn.functional.gelu(gate[e] @ x[t]) * (up[e] @ x[t])
            expected[t] += top[t, slot] * (down[e] @ h)
    assert_close(out.detach(), expected)


def test_per_projection_layout_matches_merged_reference():
    block = make_block(top_k=2)
    lora = LoraSpec(rank=RANK, alpha=ALPHA, expert_layout="per-projection")
    fast = install_experts(copy.deepcopy(block), "fast", lora)
    randomize_lora(fast)
    x = make_inputs()
    out, dx = forward_backward(fast, x)
    e, s, i = fast.experts, ALPHA / RANK, block.experts.down_proj.shape[-1]
    params = [e.lora_A_gate_up, e.lora_B_gate, e.lora_B_up, e.lora_A_down, e.lora_B_down]
    grads = [p.grad.clone() for p in params]
    ref_params = [p.detach().clone().requires_grad_(True) for p in params]
    a_gu, b_g, b_u, a_d, b_d = ref_params
    w_gu, w_d = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    expected, dx_expected = merged_reference_backward(
        x,
        block=block,
        lora_block=fast,
        scaling=s,
        gate=w_gu[:, :i] + s * b_g @ a_gu[:, :RANK],
        up=w_gu[:, i:] + s * b_u @ a_gu[:, RANK:],
        down=w_d + s * b_d @ a_d,
    )
    assert_close(out.reshape(expected.shape), expected)
    assert_close(dx, dx_expected)
    for got, ref in zip(grads, ref_params):
        assert_close(got, ref.grad)


@pytest.mark.parametrize(
    ("keep", "checkpoint", "passes", "whole_calls"),
    [
        (True, None, 1, 2),
        (False, None, 2, 0),
        (None, None, 2, 0),
        (None, "non-reentrant", 2, 4),
        (None, "reentrant", 2, 2),
    ],
)
def test_dequantization_count_per_step(keep, checkpoint, passes, whole_calls):
    """Hit experts are de-quantized once per forward; the backward reuses them when kept (always with True;
    with the default only for a checkpoint recomputation, whose backward follows at once). A forward that does
    not keep them, and a backward that de-quantizes again, take one expert range at a time. Counted per expert and
    stack (gate_up, down): `passes` de-quantizations of every hit expert per step (forward + backward, or forward +
    recomputation), of which `whole_calls` calls cover all hit experts (the kept ones; non-reentrant checkpointing
    keeps in both forwards, since both must save the same tensors)."""
    from torch.utils.checkpoint import checkpoint as run_checkpointed

    fast, _ = _fast_and_reference(2, quantize_4bit=True, keep=keep)
    experts, calls = fast.experts, []
    for stack in (experts.gate_up_nf4, experts.down_nf4):
        original = stack.dequantize
        stack.dequantize = lambda hit=None, _orig=original: calls.append(list(hit)) or _orig(hit)
    x = make_inputs().requires_grad_(True)
    out = run_checkpointed(fast, x, use_reentrant=checkpoint == "reentrant") if checkpoint else fast(x)
    out.square().sum().backward()
    hit = sorted(int(e) for e in torch.nonzero(fast.experts.last_tokens_per_expert).flatten())
    assert len(hit) > 2  # the test routing hits several experts, so ranges can split them
    dequantized = sorted(expert for call in calls for expert in call)
    assert dequantized == sorted(hit * 2 * passes)
    assert sum(call == hit for call in calls) == whole_calls
    assert all(call == hit or len(call) < len(hit) for call in calls)
    grad = fast.experts.lora_A_down.grad.clone()
    fast.zero_grad(set_to_none=True)
    fast(x).square().sum().backward()
    assert_close(fast.experts.lora_A_down.grad, grad)
