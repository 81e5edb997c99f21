"""BlackMamba's MoE mixers under our experts: same function and gradients as the model's own loop."""

from __future__ import annotations

import copy

import pytest
import torch
from moe_helpers import assert_close, randomize_lora

from tunecost.moe import LoraSpec, install_experts, moe_layers, trainable_parameters, uninstall_experts

bm = pytest.importorskip("tunecost.models.blackmamba")


@pytest.fixture(scope="module")
def model_and_ids():
    config = bm.tiny_blackmamba_config(vocab_size=128, hidden_size=64, ffn_hidden_size=64, num_layers=2)
    torch.manual_seed(0)
    model = bm.build_blackmamba(config)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(1))
    return model, ids


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids, output_router_logits=True)
    out.loss.backward()
    return out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_fast_full_finetune_matches_the_stock_loop(model_and_ids):
    model, ids = model_and_ids
    stock_out, stock_grads = _loss_and_grads(model, ids)
    fast = install_experts(copy.deepcopy(model), "fast")
    layer = moe_layers(fast)[0]
    assert type(layer.block).__name__ == "FastMoEMixer" and layer.experts.activation == "gelu"
    out, grads = _loss_and_grads(fast, ids)
    assert_close(out.logits, stock_out.logits)
    assert [t.tolist() for t in out.tokens_per_expert] == [t.tolist() for t in stock_out.tokens_per_expert]
    mixer = model.decoder.layers[1].mixer
    fc1 = torch.stack([e.linear_fc1.weight.grad for e in mixer.local_experts])
    assert_close(layer.experts.gate_up_proj.grad, fc1)
    assert_close(grads["decoder.layers.1.mixer.router.weight"], stock_grads["decoder.layers.1.mixer.router.weight"])
    assert_close(grads["embedding.word_embeddings.weight"], stock_grads["embedding.word_embeddings.weight"])
    restored = uninstall_experts(fast)
    assert type(moe_layers(restored)[0].block).__name__ == "MoEMixer"
    with torch.no_grad():
        assert_close(restored(ids).logits, stock_out.logits)


def test_fast_lora_matches_peft_on_the_per_expert_linears(model_and_ids):
    model, ids = model_and_ids
    lora = LoraSpec(rank=4, alpha=8)
    ref = install_experts(copy.deepcopy(model), "stock", lora)  # PEFT lora.Linear on linear_fc1/2 and router
    fast = install_experts(copy.deepcopy(model), "fast", lora)
    randomize_lora(fast)
    experts, mixer = moe_layers(fast)[0].experts, ref.decoder.layers[1].mixer
    with torch.no_grad():
        for e, expert in enumerate(mixer.local_experts):
            expert.linear_fc1.lora_A["default"].weight.copy_(experts.lora_A_gate_up[e])
            expert.linear_fc1.lora_B["default"].weight.copy_(experts.lora_B_gate_up[e])
            expert.linear_fc2.lora_A["default"].weight.copy_(experts.lora_A_down[e])
            expert.linear_fc2.lora_B["default"].weight.copy_(experts.lora_B_down[e])
        router = moe_layers(fast)[0].router
        mixer.router.lora_A["default"].weight.copy_(router.lora_A.weight)
        mixer.router.lora_B["default"].weight.copy_(router.lora_B.weight)
    ref_out, _ = _loss_and_grads(ref, ids)
    out, _ = _loss_and_grads(fast, ids)
    assert_close(out.logits, ref_out.logits)
    assert all("lora_" in n for n in trainable_parameters(fast))
    assert_close(experts.lora_A_gate_up.grad[2], mixer.local_experts[2].linear_fc1.lora_A["default"].weight.grad)
    assert_close(experts.lora_B_down.grad[5], mixer.local_experts[5].linear_fc2.lora_B["default"].weight.grad)
    assert_close(router.lora_A.weight.grad, mixer.router.lora_A["default"].weight.grad)


def test_fast_4bit_equals_the_linear4bit_qlora_stack(model_and_ids):
    model, ids = model_and_ids
    lora = LoraSpec(rank=4, alpha=8)
    qlora = install_experts(copy.deepcopy(model), "qlora-linear4bit", lora)
    fast = install_experts(copy.deepcopy(model), "fast-4bit", lora)
    randomize_lora(qlora)
    experts, mixer = moe_layers(fast)[0].experts, qlora.decoder.layers[1].mixer
    with torch.no_grad():
        for e, expert in enumerate(mixer.local_experts):
            experts.lora_A_gate_up[e].copy_(expert.linear_fc1.lora_A.weight)
            experts.lora_B_gate_up[e].copy_(expert.linear_fc1.lora_B.weight)
            experts.lora_A_down[e].copy_(expert.linear_fc2.lora_A.weight)
            experts.lora_B_down[e].copy_(expert.linear_fc2.lora_B.weight)
        moe_layers(fast)[0].router.load_state_dict(mixer.router.state_dict())
        assert_close(fast(ids).logits, qlora(ids).logits)


def test_expert_load_counter_counts_blackmamba_routing(model_and_ids):
    """Tokens per expert from BlackMamba's sigmoid routers: each token goes to k experts in each MoE layer."""
    from tunecost.profile.expert_load import ExpertLoadCounter

    model, ids = model_and_ids
    k = model.config.experts_per_token
    with ExpertLoadCounter(model) as counter, torch.no_grad():
        model(ids)
    tokens = counter.counts().tokens
    assert tokens and all(sum(per_expert) == k * ids.numel() for per_expert in tokens.values())
