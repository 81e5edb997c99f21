"""Every catalog model is found offline by its hub id and by each alias, in any case, each name belongs to one
model only, and each entry says where its config came from and when (an ISO date)."""

from __future__ import annotations

from collections import Counter
from datetime import date

import pytest

from tunecost.models.catalog import model_catalog, resolve_model

CATALOG = model_catalog()
NAMES = [(n, s.name) for s in CATALOG.values() for n in (s.hub_id, *s.aliases) if n]


@pytest.mark.parametrize(("hub_id", "name"), NAMES, ids=[n for n, _ in NAMES])
def test_hub_ids_and_aliases_resolve_offline(hub_id: str, name: str) -> None:
    assert resolve_model(hub_id).name == name
    assert resolve_model(hub_id.upper()).name == name


def test_each_hub_name_names_one_model() -> None:
    counts = Counter(n.lower() for n, _ in NAMES)
    assert [n for n, c in counts.items() if c > 1] == []


@pytest.mark.parametrize("spec", list(CATALOG.values()), ids=lambda s: s.name)
def test_source_says_where_and_when(spec) -> None:
    assert spec.source.strip()
    assert date.fromisoformat(spec.as_of) <= date.today()


def _dense_count_by_hand(config: dict) -> int:
    """A decoder-only dense model's parameters from its config.json alone: embeddings (once if tied), per layer
    q/k/v/o (q/k/v biases in Qwen2; q/k RMSNorms of head_dim in Qwen3 and Gemma 3), the gated MLP (3 x hidden x
    MLP) and the layer's RMSNorms (two; Gemma 2 and 3 have four), and the final norm."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or h // heads
    family = config["model_type"]
    attention = h * heads * head_dim * 2 + 2 * h * kv * head_dim
    if family == "qwen2":
        attention += (heads + 2 * kv) * head_dim
    if family in ("qwen3", "gemma3_text"):
        attention += 2 * head_dim
    norms = 4 * h if family in ("gemma2", "gemma3_text") else 2 * h
    per_layer = attention + 3 * h * inter + norms
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings", family.startswith("gemma")) else 2)
    return embeddings + config["num_hidden_layers"] * per_layer + h


@pytest.mark.parametrize(
    "name",
    [
        "llama-3-8b",
        "mistral-7b-v0.3",
        "qwen2.5-7b",
        "qwen3-8b",
        "gemma-7b",
        "gemma-2-9b",
        "gemma-3-1b",
        "gemma-3-27b",
        "yi-1.5-34b",
        "tinyllama-1.1b",
        "codellama-7b",
        "codellama-13b",
    ],
)
def test_counted_parameters_match_a_hand_count_of_the_config(name: str) -> None:
    from tunecost.models.params import count_parameters

    spec = CATALOG[name]
    assert count_parameters(spec).total == _dense_count_by_hand(spec.config)


@pytest.mark.parametrize(
    ("mirror", "name"),
    [
        ("unsloth/llama-3-8b-bnb-4bit", "llama-3-8b"),
        ("unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit", "llama-3.1-8b"),
        ("unsloth/mistral-7b-v0.3", "mistral-7b-v0.3"),
        ("unsloth/Qwen2.5-7B-Instruct-unsloth-bnb-4bit", "qwen2.5-7b"),
        ("NousResearch/Meta-Llama-3.1-8B", "llama-3.1-8b"),  # axolotl's examples
        ("NousResearch/Llama-3.2-1B", "llama-3.2-1b"),
        ("mistral-community/Mixtral-8x22B-v0.1", "mixtral-8x22b"),
        ("huggyllama/llama-7b", "llama-7b"),
    ],
)
def test_a_reupload_is_its_original(mirror: str, name: str) -> None:
    """unsloth's, NousResearch's, mistral-community's and huggyllama's re-uploads keep the original's config.json:
    found offline as the catalog model."""
    assert resolve_model(mirror).name == name


def test_an_unsloth_reupload_of_a_model_outside_the_catalog_is_an_error() -> None:
    from tunecost.errors import TunecostError

    with pytest.raises(TunecostError, match="not in the catalog"):
        resolve_model("unsloth/zephyr-sft-bnb-4bit")


def test_a_same_named_repository_elsewhere_is_not_a_reupload() -> None:
    from tunecost.errors import TunecostError

    with pytest.raises(TunecostError, match="not in the catalog"):
        resolve_model("someone/Meta-Llama-3.1-8B")
