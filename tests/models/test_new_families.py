"""OLMo 1-3, SmolLM3, EXAONE 4, ERNIE 4.5, GLM, GLM-4, Ministral, Ministral 3, Seed-OSS, Hunyuan dense, StarCoder2
and Falcon: a tiny random config of each builds
through the catalog path with the parameters of transformers' own model (and the throughput model's count of them),
its attention and MLP projections are LoRA targets, a LoRA and a full step simulate, and the catalog's hub ids
resolve offline with the published sizes."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import dense_lora_job

from tunecost.errors import TunecostError
from tunecost.models.anatomy import decoder_layers
from tunecost.models.build import build_model
from tunecost.models.catalog import resolve_model
from tunecost.models.families import arch_of
from tunecost.models.params import count_parameters
from tunecost.workload.job import FineTuneJob, LoraConfig

_SIZES = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 200}
_DENSE_LORA = LoraConfig(rank=4, alpha=8, targets=("attention", "mlp"))
_LLAMA_LIKE = {**_SIZES, "intermediate_size": 96, "num_key_value_heads": 2, "max_position_embeddings": 128}
_LLAMA_LIKE |= {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # their defaults exceed vocab_size
_SLIDING_THEN_FULL = ["sliding_attention", "sliding_attention", "full_attention"]
CONFIGS = {
    "olmo": {"model_type": "olmo", **_LLAMA_LIKE, "clip_qkv": 8.0},  # clip_qkv: q, k, v clamped in place
    "olmo2": {"model_type": "olmo2", **_LLAMA_LIKE},
    # two layers over a 16-token window (shorter than the simulated 32-token sequences), the last over all
    "olmo3": {"model_type": "olmo3", **_LLAMA_LIKE, "sliding_window": 16, "layer_types": _SLIDING_THEN_FULL},
    "smollm3": {"model_type": "smollm3", **_LLAMA_LIKE, "no_rope_layers": [1, 1, 0]},
    "exaone4": {"model_type": "exaone4", **_LLAMA_LIKE, "sliding_window": 16, "layer_types": _SLIDING_THEN_FULL},
    "ernie4_5": {"model_type": "ernie4_5", **_LLAMA_LIKE, "head_dim": 16},
    "ernie4_5-bias": {"model_type": "ernie4_5", **_LLAMA_LIKE, "head_dim": 16, "use_bias": True},
    "glm": {"model_type": "glm", **_LLAMA_LIKE, "head_dim": 16, "attention_bias": True},
    "glm4": {"model_type": "glm4", **_LLAMA_LIKE, "head_dim": 16, "attention_bias": True},
    "ministral": {
        "model_type": "ministral",
        **_LLAMA_LIKE,
        "head_dim": 16,
        "sliding_window": 16,
        "layer_types": _SLIDING_THEN_FULL,
    },
    "ministral3": {"model_type": "ministral3", **_LLAMA_LIKE, "head_dim": 16},
    "seed_oss": {"model_type": "seed_oss", **_LLAMA_LIKE, "head_dim": 16, "attention_bias": True},
    "seed_oss-out-bias": {
        "model_type": "seed_oss",
        **_LLAMA_LIKE,
        "head_dim": 16,
        "attention_bias": False,
        "attention_out_bias": True,
        "mlp_bias": True,
    },
    "hunyuan_v1_dense": {"model_type": "hunyuan_v1_dense", **_LLAMA_LIKE, "head_dim": 16, "attention_bias": True},
    # every layer attends over a 16-token window (shorter than the simulated 32-token sequences)
    "starcoder2": {"model_type": "starcoder2", **_LLAMA_LIKE, "sliding_window": 16},
    # Falcon-7B's layout: one key/value head, attention and MLP side by side after one LayerNorm
    "falcon-mqa-parallel": {"model_type": "falcon", **_SIZES, "multi_query": True, "parallel_attn": True},
    # Falcon-40B's: grouped key/value heads, ln_attn and ln_mlp
    "falcon-new-architecture": {"model_type": "falcon", **_SIZES, "new_decoder_architecture": True, "num_kv_heads": 2},
    # the rest of Falcon's options: full multi-head attention, sequential block, biases, a narrower MLP
    "falcon-sequential-bias": {
        "model_type": "falcon",
        **_SIZES,
        "multi_query": False,
        "parallel_attn": False,
        "bias": True,
        "ffn_hidden_size": 96,
    },
}
# the attention and MLP projections (paths in a decoder layer) LoRA must wrap
TARGETS = {
    "olmo": ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"),
    **dict.fromkeys(
        ("olmo2", "olmo3", "smollm3", "exaone4", "ernie4_5", "ernie4_5-bias", "ministral", "ministral3"),
        ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"),
    ),
    **dict.fromkeys(("glm", "glm4"), ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")),
    **dict.fromkeys(
        ("seed_oss", "seed_oss-out-bias", "hunyuan_v1_dense"),
        ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"),
    ),
    "starcoder2": ("self_attn.q_proj", "self_attn.o_proj", "mlp.c_fc", "mlp.c_proj"),
    **dict.fromkeys(
        ("falcon-mqa-parallel", "falcon-new-architecture", "falcon-sequential-bias"),
        ("self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
    ),
}


def _config_file(tmp_path, name: str, **extra):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**CONFIGS[name], **extra}), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_counted_parameters_are_transformers_models(tmp_path, name) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = resolve_model(str(_config_file(tmp_path, name)))
    assert spec.family == CONFIGS[name]["model_type"] and not spec.is_moe
    config = AutoConfig.for_model(**CONFIGS[name])
    config._attn_implementation = "eager"
    reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())  # tied weights once
    assert count_parameters(spec).total == expected
    assert arch_of(spec).total_params == expected  # the throughput model's count from the config alone
    built = build_model(spec, device="meta")
    assert {n for n, _ in built.named_parameters()} == {n for n, _ in reference.named_parameters()}


@pytest.mark.parametrize("name", ["olmo3", "exaone4", "ministral"])
def test_sliding_window_layers_are_the_ones_layer_types_names(tmp_path, name) -> None:
    arch = arch_of(resolve_model(str(_config_file(tmp_path, name))))
    assert (arch.num_window_layers, arch.attention_window_tokens) == (2, 16)


def test_falcon_fused_query_key_value_by_hand(tmp_path) -> None:
    """The fused projection's outputs: heads + 2 x key/value heads, each of head_dim = 64 / 4 = 16."""
    for name, kv_heads in (("falcon-mqa-parallel", 1), ("falcon-new-architecture", 2), ("falcon-sequential-bias", 4)):
        model = build_model(resolve_model(str(_config_file(tmp_path, name))), device="meta")
        attention = model.transformer.h[0].self_attention
        assert tuple(attention.query_key_value.weight.shape) == ((4 + 2 * kv_heads) * 16, 64)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_lora_targets_found_and_steps_simulate(tmp_path, name) -> None:
    from tunecost.simulate import simulate_step
    from tunecost.simulate.modules import SimLinear
    from tunecost.simulate.prepare import transform

    path = _config_file(tmp_path, name)
    job = dense_lora_job(path)
    model = build_model(resolve_model(str(path)), device="meta", dtype=torch.bfloat16)
    transform(model, job)
    layer = decoder_layers(model)[0]
    for target in TARGETS[name]:
        module = layer.get_submodule(target)
        assert isinstance(module, SimLinear), target
        assert module.lora_rank == 4 and module.lora_A.requires_grad, target
    lora = simulate_step(job, use_cache=False)
    full = simulate_step(FineTuneJob(model=str(path), method="full", batch_size=2, seq_len=32), use_cache=False)
    assert lora.peak_bytes > 0 and full.peak_bytes > 0
    assert 0 < lora.breakdown_bytes["trainable_params"] < full.breakdown_bytes["trainable_params"]
    assert lora.breakdown_bytes["frozen_weights"] > 0 and full.breakdown_bytes.get("frozen_weights", 0) == 0


def test_falcon_runs_as_a_fused_kernel_without_a_mask(tmp_path) -> None:
    """Falcon calls torch SDPA itself and always builds a 4-D mask for it: simulated as a fused kernel, its
    attention modules say "sdpa" while the model builds no mask, and the step keeps no (B, heads, L, L) scores,
    which eager attention does (batch 2 x 4 heads x 256^2 per layer)."""
    from tunecost.simulate import simulate_step
    from tunecost.simulate.fused_attention import MASK_FREE_SDPA
    from tunecost.simulate.prepare import build_prepared

    path = _config_file(tmp_path, "falcon-new-architecture")
    fused = FineTuneJob(model=str(path), method="lora", lora=_DENSE_LORA, batch_size=2, seq_len=256)
    prepared = build_prepared(fused, num_units=None)
    assert prepared.model.config._attn_implementation == MASK_FREE_SDPA
    assert all(layer.self_attention.config._attn_implementation == "sdpa" for layer in prepared.model.transformer.h)
    eager = FineTuneJob(model=str(path), method="lora", lora=_DENSE_LORA, batch_size=2, seq_len=256, attention="eager")
    scores_bytes = 2 * 4 * 256 * 256 * 2  # one layer's bf16 attention probabilities
    assert simulate_step(eager, use_cache=False).peak_bytes - simulate_step(fused, use_cache=False).peak_bytes > (
        scores_bytes
    )


def test_falcon_with_alibi_is_simulated_with_eager_attention_only(tmp_path) -> None:
    from tunecost.simulate import simulate_step

    path = _config_file(tmp_path, "falcon-sequential-bias", alibi=True)
    with pytest.raises(TunecostError, match="ALiBi"):
        simulate_step(dense_lora_job(path), use_cache=False)
    eager = FineTuneJob(model=str(path), method="lora", lora=_DENSE_LORA, batch_size=2, seq_len=32, attention="eager")
    assert simulate_step(eager, use_cache=False).peak_bytes > 0


# hub id -> (catalog name, parameters the config gives, what the model card / checkpoint says)
CATALOG = {
    # OLMo-1B-hf card: "OLMo 1B" (a size class, no exact count). By hand from the config: tied embedding
    # 50304 x 2048 + 16 x (4 x 2048^2 + 3 x 2048 x 8192), parameter-free LayerNorms
    "allenai/OLMo-1B-hf": ("olmo-1b", 50304 * 2048 + 16 * (4 * 2048**2 + 3 * 2048 * 8192)),
    # OLMo-7B-hf card: "OLMo 7B"; untied head: 2 x 50304 x 4096 + 32 x (4 x 4096^2 + 3 x 4096 x 11008); 1.6 % under 7B
    "allenai/OLMo-7B-hf": ("olmo-7b", 2 * 50304 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008)),
    # OLMo-2-1124-7B card: "OLMo 2 7B"; untied head, per layer q/k/v/o, gate/up/down, two post-norms and q/k norms
    # over all 32 heads of 128, and the final norm: 7.30 B, 4.3 % over the card's 7B
    "allenai/OLMo-2-1124-7B": (
        "olmo-2-7b",
        2 * 100352 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096 + 2 * 4096) + 4096,
    ),
    # OLMo-2-1124-13B: model.safetensors.index.json total_size 54,864,793,600 bytes of float32 (mauer4/Attention-
    # From-Scratch@381a295f weights/allenai/OLMo-2-1124-13B) = 13,716,198,400; the card says "OLMo 2 13B"
    "allenai/OLMo-2-1124-13B": ("olmo-2-13b", 54_864_793_600 // 4),
    # StarCoder2-7B card: "a 7B parameter model"; tied head, q/k/v/o and c_fc/c_proj with biases, two LayerNorms with
    # biases per layer and the final one: 7.17 B, 2.5 % over the card's 7B
    "bigcode/starcoder2-7b": (
        "starcoder2-7b",
        49152 * 4608
        + 32 * (2 * 4608**2 + 2 * 4608 * 512 + 2 * 4608 * 18432 + (4608 + 2 * 512 + 4608 + 18432 + 4608) + 4 * 4608)
        + 2 * 4608,
    ),
    # Falcon-7B card: "a 7B parameters causal decoder-only model" (1.1 % over the count); its pytorch_model.bin.index
    # .json (tenstorrent/tt-buda@97caab79 pybuda/test/falcon/models/falcon7b) totals 14,434,379,520 bytes of bf16,
    # the tied head stored twice: 14,434,379,520 / 2 - 65024 x 4544
    "tiiuae/falcon-7b": ("falcon-7b", 14_434_379_520 // 2 - 65024 * 4544),
    # Falcon-40B card: "a 40B parameters causal decoder-only model" (the count is 3.3 % over it); its index
    # (Decentralised-AI/falcon-40b@56dde4bf) totals 83,671,941,120 bytes of bf16, the tied head stored twice
    "tiiuae/falcon-40b": ("falcon-40b", 83_671_941_120 // 2 - 65024 * 8192),
}


@pytest.mark.parametrize("hub_id", sorted(CATALOG))
def test_catalog_hub_ids_resolve_with_the_published_sizes(hub_id) -> None:
    name, expected = CATALOG[hub_id]
    spec = resolve_model(hub_id)
    assert spec.name == name and spec.hub_id == hub_id and not spec.is_moe
    assert count_parameters(spec).total == expected
    assert arch_of(spec).total_params == expected


@pytest.mark.parametrize(
    ("hub_id", "card"),
    [("allenai/OLMo-7B-hf", 7e9), ("tiiuae/falcon-7b", 7e9), ("allenai/OLMo-2-1124-13B", 13_716_198_400)],
)
def test_within_two_percent_of_the_card_where_the_card_is_that_precise(hub_id, card) -> None:
    assert count_parameters(resolve_model(hub_id)).total == pytest.approx(card, rel=0.02)


def test_falcon_and_starcoder2_target_names_read_as_attention_and_mlp(tmp_path) -> None:
    """A PEFT adapter_config.json and a validation row naming Falcon's (StarCoder2's) modules read as tunecost's
    attention and mlp targets."""
    from tunecost.validate.mapping import lora_targets
    from tunecost.workload.frameworks import ConfigFile, parse_config_file
    from tunecost.workload.frameworks.adapters import FRAMEWORK_PEFT_LORA

    falcon = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]
    for names in (falcon, ["q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"]):
        path = tmp_path / "adapter_config.json"
        path.write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": names}))
        job = FRAMEWORK_PEFT_LORA.read(ConfigFile(path=str(path), data=parse_config_file(path)))
        assert job.options["lora_targets"] == "attention,mlp"
    assert lora_targets("; ".join(falcon)) == ("attention", "mlp")
