"""The family records: every supported family has one, and its pattern and counts builder are what runs."""

from __future__ import annotations

import dataclasses

import pytest

from tunecost.errors import TunecostError
from tunecost.models.anatomy import layer_pattern
from tunecost.models.catalog import model_catalog, resolve_model
from tunecost.models.families import FAMILIES, HYBRID_FAMILIES, arch_of


@pytest.mark.parametrize(
    ("model", "pattern", "expected"),
    [
        ("blackmamba-1.5b", "alternating", (0, 2, 15)),  # Mamba and MoE blocks alternate: 15 pairs
        ("deepseek-v2-lite", "dense_prefix", (1, 1, 26)),  # first_k_dense_replace 1, then 26 MoE layers
        ("mixtral-8x7b", "uniform", (0, 1, 32)),
    ],
)
def test_layer_pattern_follows_the_family_record(model: str, pattern: str, expected: tuple[int, int, int]) -> None:
    spec = resolve_model(model)
    assert FAMILIES[spec.family].pattern == pattern
    assert layer_pattern(spec) == expected


def test_every_catalog_family_builds_its_counts_with_its_own_name() -> None:
    for spec in {s.family: s for s in model_catalog().values()}.values():
        arch = arch_of(spec)
        assert arch.family == spec.family
        assert arch.num_layers == spec.num_layers
    assert all(FAMILIES[f].pattern == "hybrid" for f in HYBRID_FAMILIES)


def test_a_family_without_a_record_is_refused_by_name() -> None:
    spec = dataclasses.replace(resolve_model("mixtral-8x7b"), family="gpt2")
    with pytest.raises(TunecostError, match="not 'gpt2'"):
        arch_of(spec)


LLAMA_LAYOUT = sorted(name for name, f in FAMILIES.items() if f.arch is None)


@pytest.mark.parametrize("name", LLAMA_LAYOUT)
def test_a_decoder_default_is_the_transformers_config_class_default(name: str) -> None:
    # where a config.json leaves head_dim or tie_word_embeddings out, transformers' config class decides
    from transformers import CONFIG_MAPPING

    decoder = FAMILIES[name].decoder
    config = CONFIG_MAPPING[name](hidden_size=1024, num_attention_heads=8, num_key_value_heads=8)
    assert (getattr(config, "head_dim", None) or 1024 // 8) == (decoder.head_dim or 1024 // 8)
    assert config.tie_word_embeddings == decoder.tied


def test_a_decoder_record_sets_the_counts_its_fields_name() -> None:
    spec = resolve_model("mixtral-8x7b")
    config = {k: v for k, v in spec.config.items() if k != "head_dim"}
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]

    def counts(family: str, **extra: object) -> object:
        return arch_of(dataclasses.replace(spec, family=family, config={**config, **extra}))

    qwen2, mixtral = counts("qwen2_moe"), counts("mixtral")  # Qwen2's q, k, v biases are always there
    assert qwen2.norm_params - mixtral.norm_params == layers * (32 + 2 * 8) * 128
    olmo = counts("olmo")  # parameter-free LayerNorms: no norm weights at all
    assert counts("llama").norm_params - olmo.norm_params == (2 * layers + 1) * hidden
    assert counts("gemma2", sliding_window=4096).num_window_layers == (layers + 1) // 2
    assert counts("qwen3", sliding_window=4096, max_window_layers=8).num_window_layers == 0  # no use_sliding_window
    assert counts("qwen3", sliding_window=4096, max_window_layers=8, use_sliding_window=True).num_window_layers == 24
