"""LoraRouter: transformers' router semantics, PEFT's LoRA numbers, and the aux loss sees the LoRA logits."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from moe_helpers import assert_close, make_block, make_inputs, peft_reference, randomize_lora

from tunecost.moe.router import LoraRouter


def _router(block, rank=4, alpha=8):
    config = SimpleNamespace(num_experts_per_tok=block.gate.top_k, num_local_experts=8, hidden_size=32)
    return LoraRouter(config, block.gate.weight, rank=rank, alpha=alpha)


def test_zero_b_is_the_stock_router():
    block = make_block(top_k=2)
    router = _router(block)
    x = make_inputs().reshape(-1, 32)
    for got, expected in zip(router(x), block.gate(x)):
        assert torch.equal(got, expected) if not got.dtype.is_floating_point else torch.allclose(got, expected)


def test_lora_router_matches_peft_on_gate_weight():
    block = make_block(top_k=2)
    router = _router(block)
    randomize_lora(router)
    ref = peft_reference(block, rank=4, alpha=8)
    with torch.no_grad():
        ref.gate.lora_A["default"].weight.copy_(router.lora_A.weight)
        ref.gate.lora_B["default"].weight.copy_(router.lora_B.weight)
    x = make_inputs().reshape(-1, 32)
    logits, scores, indices = router(x)
    ref_logits, ref_scores, ref_indices = ref.gate(x)
    assert_close(logits, ref_logits)
    assert_close(scores, ref_scores)
    assert torch.equal(indices, ref_indices)
    (logits.square().sum() + scores.sum()).backward()
    (ref_logits.square().sum() + ref_scores.sum()).backward()
    assert_close(router.lora_A.weight.grad, ref.gate.lora_A["default"].weight.grad)
    assert_close(router.lora_B.weight.grad, ref.gate.lora_B["default"].weight.grad)


def test_aux_loss_reaches_the_router_lora_in_a_model(moe_model):
    from tunecost.moe import LoraSpec, install_experts

    model = install_experts(moe_model(num_hidden_layers=1), "fast", LoraSpec(rank=4, alpha=8, targets=("router",)))
    randomize_lora(model)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    out = model(ids, output_router_logits=True)
    assert len(out.router_logits) == 1 and out.router_logits[0].shape == (16, 8)
    out.aux_loss.backward()  # the load-balancing loss alone
    gate = model.model.layers[0].mlp.gate
    assert isinstance(gate, LoraRouter)
    assert gate.lora_A.weight.grad.abs().max() > 0 and gate.lora_B.weight.grad.abs().max() > 0
