"""tunecost.models.anatomy: layers, MoE blocks, experts and top-k of one tiny random model per supported family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import gqa_attention

from tunecost.errors import TunecostError
from tunecost.models import anatomy
from tunecost.models.families import SUPPORTED_FAMILIES

SIMULATE_CONFIGS = Path(__file__).parents[1] / "fixtures" / "simulate"
# every Hugging Face family at one small size: 3 layers of width 32 (4 heads of 8, 2 key-value heads), MLP width 48
_SMALL = dict(
    vocab_size=128, intermediate_size=48, num_hidden_layers=3, max_position_embeddings=64, **gqa_attention(32, 4)
)


def _hf(family: str, **extra):
    return _from_config(family, {**_SMALL, **extra})


def _from_fixture(name: str):
    """The model of a tiny config of a real architecture in tests/fixtures/simulate (the step simulator's)."""
    config = json.loads((SIMULATE_CONFIGS / f"{name}.json").read_text())
    return _from_config(config.pop("model_type"), config)


def _from_config(family: str, config: dict):
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    hf_config = CONFIG_MAPPING[family](**config)
    hf_config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()


def _blackmamba():
    from tunecost.models.blackmamba import build_blackmamba, tiny_blackmamba_config

    config = tiny_blackmamba_config(vocab_size=128, hidden_size=32, ffn_hidden_size=48)
    return build_blackmamba(config, seed=0).eval()


# family -> (builder, layers, MoE blocks, experts, top-k); counts by hand from the configs below
CASES = {
    "mixtral": (lambda: _hf("mixtral", num_local_experts=4, num_experts_per_tok=2), 3, 3, 4, 2),
    "olmoe": (lambda: _hf("olmoe", num_experts=6, num_experts_per_tok=2), 3, 3, 6, 2),
    # decoder_sparse_step 2: layers 1 (the 2nd) is sparse, 0 and 2 are dense MLPs
    "qwen2_moe": (
        lambda: _hf(
            "qwen2_moe",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            decoder_sparse_step=2,
        ),
        3,
        1,
        4,
        2,
    ),
    "qwen3_moe": (
        lambda: _hf("qwen3_moe", num_experts=8, num_experts_per_tok=3, moe_intermediate_size=16),
        3,
        3,
        8,
        3,
    ),
    # tiny-deepseek-v2.json: 4 layers, first_k_dense_replace 1 (layer 0 is a dense MLP), 8 routed experts, top-2
    "deepseek_v2": (lambda: _from_fixture("tiny-deepseek-v2"), 4, 3, 8, 2),
    "deepseek_v3": (lambda: _from_fixture("tiny-deepseek-v3"), 4, 3, 8, 2),
    "glm4_moe": (lambda: _from_fixture("tiny-glm4-moe"), 4, 3, 8, 2),
    # tiny-qwen3_5(-moe).json: 8 layers (DeltaNet x 3, attention, twice), every MoE layer 8 experts, top-2
    "qwen3_5_text": (lambda: _from_fixture("tiny-qwen3_5"), 8, 0, 1, 1),
    "qwen3_5_moe_text": (lambda: _from_fixture("tiny-qwen3_5-moe"), 8, 8, 8, 2),
    # tiny-qwen3-next.json: the same mixers, decoder_sparse_step 2: layers 1, 3, 5, 7 route over 8 experts, top-2
    "qwen3_next": (lambda: _from_fixture("tiny-qwen3-next"), 8, 4, 8, 2),
    # tiny-granite-hybrid.json: Mamba2 x 3, attention, twice; every layer 8 experts, top-2, beside a shared MLP
    "granitemoehybrid": (lambda: _from_fixture("tiny-granite-hybrid"), 8, 8, 8, 2),
    # tiny_blackmamba_config: 4 layers (Mamba, MoE, Mamba, MoE), 8 experts, top-2
    "blackmamba": (_blackmamba, 4, 2, 8, 2),
    "granitemoe": (lambda: _hf("granitemoe", num_local_experts=4, num_experts_per_tok=2), 3, 3, 4, 2),
    "gpt_oss": (lambda: _hf("gpt_oss", num_local_experts=4, num_experts_per_tok=2, head_dim=8), 3, 3, 4, 2),
    "granitemoeshared": (
        lambda: _hf("granitemoeshared", num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=16),
        3,
        3,
        4,
        2,
    ),
    # GPT-2 style names: n_embd 32, 4 heads, n_inner 48, 3 blocks at transformer.h
    "gpt_bigcode": (
        lambda: _from_config("gpt_bigcode", dict(vocab_size=128, n_embd=32, n_head=4, n_inner=48, n_layer=3)),
        3,
        0,
        1,
        1,
    ),
    "llama": (lambda: _hf("llama"), 3, 0, 1, 1),
    "mistral": (lambda: _hf("mistral"), 3, 0, 1, 1),
    "qwen2": (lambda: _hf("qwen2"), 3, 0, 1, 1),
    "qwen3": (lambda: _hf("qwen3"), 3, 0, 1, 1),
    "gemma": (lambda: _hf("gemma"), 3, 0, 1, 1),
    "gemma2": (lambda: _hf("gemma2"), 3, 0, 1, 1),
    "gemma3_text": (lambda: _hf("gemma3_text"), 3, 0, 1, 1),
    "phi": (lambda: _hf("phi"), 3, 0, 1, 1),
    "phi3": (lambda: _hf("phi3", pad_token_id=0, eos_token_id=2), 3, 0, 1, 1),  # defaults name token 32000
    "granite": (lambda: _hf("granite"), 3, 0, 1, 1),
    "olmo": (lambda: _hf("olmo"), 3, 0, 1, 1),
    "olmo2": (lambda: _hf("olmo2"), 3, 0, 1, 1),
    "olmo3": (lambda: _hf("olmo3", eos_token_id=None), 3, 0, 1, 1),
    **{
        name: (lambda name=name: _hf(name, pad_token_id=None, bos_token_id=None, eos_token_id=None), 3, 0, 1, 1)
        for name in ("smollm3", "exaone4", "ernie4_5", "glm", "glm4")
    },
    **{  # head_dim set: these configs default it to None, which their attention cannot take
        name: (
            lambda name=name: _hf(name, head_dim=8, pad_token_id=None, bos_token_id=None, eos_token_id=None),
            3,
            0,
            1,
            1,
        )
        for name in ("ministral", "ministral3", "seed_oss", "hunyuan_v1_dense")
    },
    "starcoder2": (lambda: _hf("starcoder2"), 3, 0, 1, 1),
    "nemotron": (lambda: _hf("nemotron", head_dim=8), 3, 0, 1, 1),
    # Falcon's own keys (its blocks at transformer.h): width 32, 4 heads, 2 key-value heads (new architecture)
    "falcon": (
        lambda: _from_config(
            "falcon",
            dict(
                vocab_size=128,
                hidden_size=32,
                num_attention_heads=4,
                num_kv_heads=2,
                new_decoder_architecture=True,
                ffn_hidden_size=48,
                num_hidden_layers=3,
            ),
        ),
        3,
        0,
        1,
        1,
    ),
}


def test_every_supported_family_is_tested():
    assert set(CASES) == set(SUPPORTED_FAMILIES)


def _routed(model) -> int:
    """How many experts the first MoE block's router picks per token (counted from the output of one forward)."""
    block = anatomy.moe_blocks(model)[0]
    picked = []
    router = anatomy.unwrap_peft(block.router)

    def count(module, args, output):
        if isinstance(output, tuple):  # transformers' *TopKRouter: (logits, scores, indices)
            picked.append(output[-1].shape[-1])
        else:  # BlackMamba's router Linear: the mixer takes top-k of its logits itself
            picked.append(anatomy.unwrap_peft(block.block).experts_per_token)

    handle = router.register_forward_hook(count)
    try:
        with torch.no_grad():
            model(torch.arange(8).reshape(1, 8))
    finally:
        handle.remove()
    return picked[0]


@pytest.mark.parametrize("family", sorted(CASES))
def test_family_anatomy(family):
    build, layers, blocks, experts, top_k = CASES[family]
    model = build()
    assert anatomy.model_family(model) == family
    assert len(anatomy.decoder_layers(model)) == layers
    found = anatomy.moe_blocks(model)
    assert len(found) == blocks
    assert anatomy.num_experts(model) == experts
    assert anatomy.get_top_k(model) == top_k
    assert all(b.num_experts == experts and b.top_k == top_k for b in found)
    layer_list = anatomy.decoder_layers(model)
    assert all(any(m is b.block for m in layer_list[b.layer_index].modules()) for b in found)
    if not found:
        with pytest.raises(TunecostError, match="got 2"):
            anatomy.set_top_k(model, 2)
        anatomy.set_top_k(model, 1)
        return
    assert _routed(model) == top_k
    with torch.no_grad():
        before = model(torch.arange(8).reshape(1, 8)).logits
    new_k = experts if top_k != experts else 1
    anatomy.set_top_k(model, new_k)
    assert anatomy.get_top_k(model) == new_k
    assert all(b.top_k == new_k for b in anatomy.moe_blocks(model))
    assert _routed(model) == new_k
    with torch.no_grad():
        after = model(torch.arange(8).reshape(1, 8)).logits
    assert not torch.allclose(before, after)  # the routing really changed
    for bad in (0, experts + 1):
        with pytest.raises(TunecostError, match=f"got {bad}"):
            anatomy.set_top_k(model, bad)


@pytest.mark.parametrize("family", ["mixtral", "olmoe", "qwen3_moe"])
def test_peft_wrapped_models_unwrap(family):
    """LoRA on attention (target_modules) and on the fused experts and router (target_parameters): the anatomy is
    the same through the PeftModel, and unwrap_peft reaches the original router and experts."""
    from peft import LoraConfig, get_peft_model

    build, layers, blocks, experts, top_k = CASES[family]
    plain = build()
    originals = [(type(b.router), type(b.experts)) for b in anatomy.moe_blocks(plain)]
    config = LoraConfig(
        r=2,
        lora_alpha=4,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"],
    )
    model = get_peft_model(plain, config)
    assert anatomy.model_family(model) == family
    assert len(anatomy.decoder_layers(model)) == layers
    found = anatomy.moe_blocks(model)
    assert len(found) == blocks
    assert all(type(b.experts).__name__ == "ParamWrapper" for b in found)  # what the block calls
    assert [(type(anatomy.unwrap_peft(b.router)), type(anatomy.unwrap_peft(b.experts))) for b in found] == originals
    attention = anatomy.decoder_layers(model)[0].self_attn.q_proj
    assert anatomy.unwrap_peft(attention) is attention.base_layer
    assert type(anatomy.unwrap_peft(attention)) is torch.nn.Linear
    assert anatomy.num_experts(model) == experts and anatomy.get_top_k(model) == top_k
    anatomy.set_top_k(model, 1)
    assert anatomy.get_top_k(model) == 1 and _routed(model) == 1


def test_bare_block_and_configs():
    """A bare MoE block (no family) is found by its router and experts; configs and config.json dicts answer
    num_experts / get_top_k, BlackMamba's Zyphra keys included."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(hidden_size=16, intermediate_size=8, num_local_experts=4, num_experts_per_tok=2)
    block = MixtralSparseMoeBlock(config)
    (found,) = anatomy.moe_blocks(block)
    assert found.block is block and found.num_experts == 4 and found.top_k == 2
    anatomy.set_top_k(block, 3)
    assert block.gate.top_k == 3 and block.top_k == 3
    assert anatomy.num_experts(config) == 4 and anatomy.get_top_k(config) == 2
    zyphra = {"model_type": "blackmamba", "num_experts": 8, "mlp_router_topk": 1}
    assert anatomy.num_experts(zyphra) == 8 and anatomy.get_top_k(zyphra) == 1
    assert anatomy.num_experts({"model_type": "llama"}) == 1
