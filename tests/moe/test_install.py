"""install_experts / uninstall_experts on a tiny Mixtral: every implementation trains, swaps are reversible."""

from __future__ import annotations

import pytest
import torch
from moe_helpers import randomize_lora

from tunecost.errors import TunecostError
from tunecost.models.anatomy import set_top_k
from tunecost.moe import (
    EXPERT_IMPLS,
    LoraSpec,
    install_experts,
    installed_impl,
    moe_layers,
    trainable_parameters,
    uninstall_experts,
)

LORA = LoraSpec(rank=4, alpha=8)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def stock_logits(ids, moe_model):
    with torch.no_grad():
        return moe_model()(ids).logits


@pytest.mark.parametrize("impl", EXPERT_IMPLS)
def test_each_impl_trains_and_starts_at_the_base_model(impl, ids, stock_logits, moe_model):
    model = install_experts(moe_model(), impl, None if impl == "stock" else LORA)
    assert installed_impl(model) == impl
    out = model(ids, labels=ids, output_router_logits=True)
    assert torch.isfinite(out.loss) and out.aux_loss is not None and len(out.router_logits) == 2
    out.loss.backward()
    trainable = trainable_parameters(model)
    if impl == "stock":
        assert len(trainable) == sum(1 for _ in model.parameters())
        return
    assert trainable and all("lora_" in name for name in trainable)
    # B = 0 at init: unquantized LoRA models compute exactly the base model; 4-bit ones are close to it
    tolerance = 1e-4 if impl in ("peft-fused", "fast") else 0.1
    assert (out.logits - stock_logits).abs().max() < tolerance * stock_logits.abs().max()
    assert any(p.grad is not None and p.grad.abs().max() > 0 for name, p in trainable.items() if "lora_B" in name)


def test_uninstall_restores_transformers_modules(ids, stock_logits, moe_model):
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts, MixtralTopKRouter

    for impl in ("fast", "peft-fused"):
        model = uninstall_experts(install_experts(moe_model(), impl, LORA))
        layer = moe_layers(model)[0]
        assert type(layer.experts) is MixtralExperts and type(layer.router) is MixtralTopKRouter
        assert installed_impl(model) == "stock"
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, stock_logits)


def test_uninstall_with_merge_keeps_the_trained_function(ids, moe_model):
    model = install_experts(moe_model(), "fast", LORA)
    randomize_lora(model, std=0.05)
    with torch.no_grad():
        trained = model(ids).logits
        merged = uninstall_experts(model, merge_lora=True)(ids).logits
    torch.testing.assert_close(merged, trained, rtol=1e-4, atol=1e-4 * trained.abs().max().item())


def test_hooks_survive_the_swap(ids, moe_model):
    model = moe_model()
    calls = []
    model.model.layers[0].mlp.experts.register_forward_hook(lambda *a: calls.append("experts"))
    model.model.layers[0].mlp.gate.register_forward_hook(lambda *a: calls.append("router"))
    install_experts(model, "fast", LORA)
    model(ids)
    assert calls == ["router", "experts"]


def test_experts_per_token_and_gradient_checkpointing(ids, moe_model):
    from tunecost.profile.expert_load import ExpertLoadCounter

    model = install_experts(moe_model(), "fast", LORA)
    randomize_lora(model, std=0.05)
    set_top_k(model, 8)
    assert model.config.num_experts_per_tok == 8 and moe_layers(model)[1].router.top_k == 8
    model(ids, labels=ids).loss.backward()
    grads = {n: p.grad.clone() for n, p in trainable_parameters(model).items()}
    model.zero_grad(set_to_none=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    with ExpertLoadCounter(model) as counter:
        model(ids, labels=ids).loss.backward()  # the backward recomputes each layer's forward
    for name, p in trainable_parameters(model).items():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-6)
    counts = counter.counts().tokens
    assert sorted(counts) == [0, 1]  # decoder layer indices of the two MoE blocks
    assert all(counts_ == [ids.numel()] * 8 for counts_ in counts.values())  # dense, recomputation not counted


def test_bad_requests_are_one_line_errors(moe_model):
    model = moe_model()
    with pytest.raises(TunecostError, match="Valid choices"):
        install_experts(model, "fastest", LORA)
    with pytest.raises(TunecostError, match="LoRA spec"):
        install_experts(model, "peft-fused")
    with pytest.raises(TunecostError, match="4-bit"):
        install_experts(model, "stock", quantize_4bit=True)
    with pytest.raises(TunecostError, match="between 1 and 8"):
        set_top_k(model, 9)
    with pytest.raises(TunecostError, match="LoRA target"):
        LoraSpec(targets=("attention",))
    with pytest.raises(TunecostError, match="no Mixtral-style MoE block"):
        install_experts(torch.nn.Linear(2, 2), "fast", LORA)
