"""The older Llama-family and Qwen2-family checkpoints in the catalog (Yi, LLaMA 1, Code Llama 34B/70B, Qwen1.5,
Qwen2-72B): each hub id and alias resolves offline to its catalog entry, and the parameter count `tunecost models`
shows (tunecost.models.params.count_parameters) is within 3 % of the size its publisher or the hub states."""

from __future__ import annotations

import pytest

from tunecost.catalog.models import resolve_model
from tunecost.models.params import count_parameters

# (hub id, catalog name, an alias or None, published size in billions of parameters)
MODELS = [
    # 01.ai blog "Dive Deeper into Yi-9B" (2024-03-18): "approximately 8.8B parameters"; no Yi-9B-Chat exists
    ("01-ai/Yi-9B", "yi-9b", None, 8.8),
    # Open LLM Leaderboard request files for 01-ai/Yi-34B and Yi-34B-Chat (hub safetensors metadata): 34.389B
    ("01-ai/Yi-34B", "yi-34b", "01-ai/Yi-34B-Chat", 34.389),
    # LLaMA paper (Touvron et al. 2023), Table 2: 6.7B, 13.0B, 32.5B, 65.2B
    ("huggyllama/llama-7b", "llama-7b", None, 6.7),
    ("huggyllama/llama-13b", "llama-13b", None, 13.0),
    ("huggyllama/llama-30b", "llama-30b", None, 32.5),
    ("huggyllama/llama-65b", "llama-65b", None, 65.2),
    # Code Llama paper (Roziere et al. 2023) and model cards: 34B, 70B
    ("codellama/CodeLlama-34b-hf", "codellama-34b", "codellama/CodeLlama-34b-Instruct-hf", 34.0),
    ("codellama/CodeLlama-70b-hf", "codellama-70b", None, 70.0),
    # Qwen1.5 blog (qwenlm.github.io/blog/qwen1.5): 4B, 14B, 32B
    ("Qwen/Qwen1.5-4B", "qwen1.5-4b", "Qwen/Qwen1.5-4B-Chat", 4.0),
    ("Qwen/Qwen1.5-14B", "qwen1.5-14b", "Qwen/Qwen1.5-14B-Chat", 14.0),
    ("Qwen/Qwen1.5-32B", "qwen1.5-32b", "Qwen/Qwen1.5-32B-Chat", 32.0),
    # Open LLM Leaderboard request files (hub safetensors metadata): Qwen1.5-7B 7.721B, Qwen1.5-72B 72.288B
    ("Qwen/Qwen1.5-7B", "qwen1.5-7b", "Qwen/Qwen1.5-7B-Chat", 7.721),
    ("Qwen/Qwen1.5-72B", "qwen1.5-72b", "Qwen/Qwen1.5-72B-Chat", 72.288),
    # Qwen2 blog (qwenlm.github.io/blog/qwen2), model table: Qwen2-72B 72.71B
    ("Qwen/Qwen2-72B", "qwen2-72b", "Qwen/Qwen2-72B-Instruct", 72.71),
]

# Open LLM Leaderboard request file for Qwen/Qwen1.5-0.5B (hub safetensors metadata): 0.62B. The checkpoint stores the
# tied lm_head as its own tensor, so that figure counts the embedding twice; tunecost counts a tied weight once.
QWEN15_05B_STORED = 0.62


@pytest.mark.parametrize(("hub_id", "name", "alias", "published"), MODELS, ids=[m[0] for m in MODELS])
def test_hub_id_and_alias_resolve_and_size_matches_the_card(hub_id, name, alias, published) -> None:
    spec = resolve_model(hub_id)
    assert spec.name == name
    assert spec.hub_id == hub_id
    if alias is not None:
        assert alias in spec.aliases
        assert resolve_model(alias).name == name
    total = count_parameters(spec).total
    assert total == pytest.approx(published * 1e9, rel=0.03)


def test_qwen1_5_0_5b_resolves_and_its_stored_size_matches_the_hub() -> None:
    spec = resolve_model("Qwen/Qwen1.5-0.5B")
    assert spec.name == "qwen1.5-0.5b"
    assert resolve_model("Qwen/Qwen1.5-0.5B-Chat").name == "qwen1.5-0.5b"
    assert spec.config["tie_word_embeddings"] is True
    counts = count_parameters(spec)
    assert counts.total + counts.embedding == pytest.approx(QWEN15_05B_STORED * 1e9, rel=0.03)
