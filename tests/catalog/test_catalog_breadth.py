"""The catalog's breadth: the common open models of the last three years (Yi, Mistral 7B, Llama 1/2/3.x, Code Llama,
Qwen 1.5/2/2.5/2.5-Coder/3, Gemma 1/2/3, Phi, DeepSeek-V2-Lite, OLMo/OLMo 2/OLMoE, Falcon, StarCoder2) resolve offline
by hub id and by common spelling, each to a catalog entry that says where its config came from and when; and the
older Llama-family and Qwen2-family checkpoints (Yi, LLaMA 1, Code Llama 34B/70B, Qwen1.5, Qwen2-72B) have the
parameter count `tunecost models` shows (tunecost.models.params.count_parameters) within 3 % of the size their
publisher or the hub states.

Left out, for want of simulator support for their architecture (tunecost.models.families.SUPPORTED_FAMILIES):
microsoft/Phi-3-small-8k/128k-instruct (model_type phi3small: remote code, not in transformers),
microsoft/Phi-3.5-MoE-instruct (phimoe), deepseek-ai/DeepSeek-V3 and -V3-Base (deepseek_v3) and
deepseek-ai/deepseek-moe-16b-base/-chat (model_type deepseek: remote code, not in transformers).
Left out for want of its config: codellama/CodeLlama-70b-Python-hf (no copy of its hub config.json was found)."""

from __future__ import annotations

from datetime import date

import pytest

from tunecost.models.catalog import resolve_model
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
    # Mistral AI's announcements: Mistral Small v24.09, 22 billion parameters (mistral.ai/news/september-24-release);
    # Mistral Small 3, a 24B-parameter model (mistral.ai/news/mistral-small-3);
    # Ministral 8B (mistral.ai/news/ministraux)
    ("mistralai/Ministral-8B-Instruct-2410", "ministral-8b", None, 8.0),
    ("mistralai/Mistral-Small-Instruct-2409", "mistral-small-22b", None, 22.0),
    ("mistralai/Mistral-Small-24B-Base-2501", "mistral-small-24b", "mistralai/Mistral-Small-24B-Instruct-2501", 24.0),
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


# catalog name -> the hub ids that name it (base, chat/instruct and re-uploads with the same architecture)
BREADTH = {
    # 01.ai Yi and Yi-1.5
    "yi-6b": ["01-ai/Yi-6B", "01-ai/Yi-6B-Chat"],
    "yi-9b": ["01-ai/Yi-9B"],
    "yi-34b": ["01-ai/Yi-34B", "01-ai/Yi-34B-Chat"],
    "yi-1.5-6b": ["01-ai/Yi-1.5-6B", "01-ai/Yi-1.5-6B-Chat"],
    "yi-1.5-9b": ["01-ai/Yi-1.5-9B", "01-ai/Yi-1.5-9B-Chat"],
    "yi-1.5-34b": ["01-ai/Yi-1.5-34B", "01-ai/Yi-1.5-34B-Chat"],
    # Mistral 7B, every version
    "mistral-7b-v0.1": ["mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"],
    "mistral-7b-v0.2": ["mistralai/Mistral-7B-Instruct-v0.2"],
    "mistral-7b-v0.3": ["mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"],
    # LLaMA 1
    "llama-7b": ["huggyllama/llama-7b"],
    "llama-13b": ["huggyllama/llama-13b"],
    "llama-30b": ["huggyllama/llama-30b"],
    "llama-65b": ["huggyllama/llama-65b"],
    # Llama 2
    "llama-2-7b": ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"],
    "llama-2-13b": ["meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf"],
    "llama-2-70b": ["meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"],
    # Llama 3, 3.1, 3.2, 3.3
    "llama-3-8b": ["meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"],
    "llama-3-70b": ["meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct"],
    "llama-3.1-8b": [
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-8B",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
    ],
    "llama-3.1-70b": [
        "meta-llama/Llama-3.1-70B",
        "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Meta-Llama-3.1-70B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
    ],
    "llama-3.1-405b": ["meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.1-405B-Instruct"],
    "llama-3.2-1b": ["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"],
    "llama-3.2-3b": ["meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"],
    # Code Llama (base, Python, Instruct)
    "codellama-7b": ["codellama/CodeLlama-7b-hf", "codellama/CodeLlama-7b-Instruct-hf"],
    "codellama-7b-python": ["codellama/CodeLlama-7b-Python-hf"],
    "codellama-13b": ["codellama/CodeLlama-13b-hf", "codellama/CodeLlama-13b-Instruct-hf"],
    "codellama-13b-python": ["codellama/CodeLlama-13b-Python-hf"],
    "codellama-34b": [
        "codellama/CodeLlama-34b-hf",
        "codellama/CodeLlama-34b-Instruct-hf",
        "codellama/CodeLlama-34b-Python-hf",
    ],
    "codellama-70b": ["codellama/CodeLlama-70b-hf"],
    "codellama-70b-instruct": ["codellama/CodeLlama-70b-Instruct-hf"],
    # Qwen1.5
    "qwen1.5-0.5b": ["Qwen/Qwen1.5-0.5B", "Qwen/Qwen1.5-0.5B-Chat"],
    "qwen1.5-1.8b": ["Qwen/Qwen1.5-1.8B", "Qwen/Qwen1.5-1.8B-Chat"],
    "qwen1.5-4b": ["Qwen/Qwen1.5-4B", "Qwen/Qwen1.5-4B-Chat"],
    "qwen1.5-7b": ["Qwen/Qwen1.5-7B", "Qwen/Qwen1.5-7B-Chat"],
    "qwen1.5-14b": ["Qwen/Qwen1.5-14B", "Qwen/Qwen1.5-14B-Chat"],
    "qwen1.5-32b": ["Qwen/Qwen1.5-32B", "Qwen/Qwen1.5-32B-Chat"],
    "qwen1.5-72b": ["Qwen/Qwen1.5-72B", "Qwen/Qwen1.5-72B-Chat"],
    "qwen1.5-110b": ["Qwen/Qwen1.5-110B", "Qwen/Qwen1.5-110B-Chat"],
    "qwen1.5-moe-a2.7b": ["Qwen/Qwen1.5-MoE-A2.7B", "Qwen/Qwen1.5-MoE-A2.7B-Chat"],
    # Qwen2
    "qwen2-0.5b": ["Qwen/Qwen2-0.5B", "Qwen/Qwen2-0.5B-Instruct"],
    "qwen2-1.5b": ["Qwen/Qwen2-1.5B", "Qwen/Qwen2-1.5B-Instruct"],
    "qwen2-7b": ["Qwen/Qwen2-7B", "Qwen/Qwen2-7B-Instruct"],
    "qwen2-57b-a14b": ["Qwen/Qwen2-57B-A14B", "Qwen/Qwen2-57B-A14B-Instruct"],
    "qwen2-72b": ["Qwen/Qwen2-72B", "Qwen/Qwen2-72B-Instruct"],
    # Qwen2.5 and Qwen2.5-Coder
    **{
        f"qwen2.5-{s.lower()}": [f"Qwen/Qwen2.5-{s}", f"Qwen/Qwen2.5-{s}-Instruct"]
        for s in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B")
    },
    **{
        f"qwen2.5-coder-{s.lower()}": [f"Qwen/Qwen2.5-Coder-{s}", f"Qwen/Qwen2.5-Coder-{s}-Instruct"]
        for s in ("0.5B", "1.5B", "3B", "7B", "14B", "32B")
    },
    # Qwen3 (dense and MoE)
    **{f"qwen3-{s.lower()}": [f"Qwen/Qwen3-{s}", f"Qwen/Qwen3-{s}-Base"] for s in ("0.6B", "1.7B", "4B", "8B", "14B")},
    "qwen3-32b": ["Qwen/Qwen3-32B"],
    "qwen3-30b-a3b": ["Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"],
    "qwen3-235b-a22b": ["Qwen/Qwen3-235B-A22B"],
    # Gemma 1, 2, 3
    "gemma-2b": ["google/gemma-2b", "google/gemma-2b-it"],
    "gemma-7b": ["google/gemma-7b", "google/gemma-7b-it"],
    "gemma-2-2b": ["google/gemma-2-2b", "google/gemma-2-2b-it"],
    "gemma-2-9b": ["google/gemma-2-9b", "google/gemma-2-9b-it"],
    "gemma-2-27b": ["google/gemma-2-27b", "google/gemma-2-27b-it"],
    "gemma-3-1b": ["google/gemma-3-1b-pt", "google/gemma-3-1b-it"],
    "gemma-3-4b": ["google/gemma-3-4b-pt", "google/gemma-3-4b-it"],
    "gemma-3-12b": ["google/gemma-3-12b-pt", "google/gemma-3-12b-it"],
    "gemma-3-27b": ["google/gemma-3-27b-pt", "google/gemma-3-27b-it"],
    # Phi
    "phi-1_5": ["microsoft/phi-1_5"],
    "phi-2": ["microsoft/phi-2"],
    "phi-3-mini-4k": ["microsoft/Phi-3-mini-4k-instruct"],
    "phi-3-mini-128k": ["microsoft/Phi-3-mini-128k-instruct"],
    "phi-3-medium-4k": ["microsoft/Phi-3-medium-4k-instruct"],
    "phi-3-medium-128k": ["microsoft/Phi-3-medium-128k-instruct"],
    "phi-3.5-mini": ["microsoft/Phi-3.5-mini-instruct"],
    "phi-4": ["microsoft/phi-4"],
    # Ministral 8B, Mistral Small (22B 2409, 24B 2501)
    "ministral-8b": ["mistralai/Ministral-8B-Instruct-2410"],
    "mistral-small-22b": ["mistralai/Mistral-Small-Instruct-2409"],
    "mistral-small-24b": ["mistralai/Mistral-Small-24B-Base-2501", "mistralai/Mistral-Small-24B-Instruct-2501"],
    # DeepSeek-V2-Lite
    "deepseek-v2-lite": ["deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite-Chat"],
    # OLMo, OLMo 2, OLMoE
    "olmo-1b": ["allenai/OLMo-1B-hf"],
    "olmo-7b": ["allenai/OLMo-7B-hf"],
    "olmo-2-7b": ["allenai/OLMo-2-1124-7B"],
    "olmo-2-13b": ["allenai/OLMo-2-1124-13B"],
    "olmo-2-32b": ["allenai/OLMo-2-0325-32B"],
    "olmoe-1b-7b": ["allenai/OLMoE-1B-7B-0924", "allenai/OLMoE-1B-7B-0924-Instruct"],
    # Falcon
    "falcon-7b": ["tiiuae/falcon-7b", "tiiuae/falcon-7b-instruct"],
    "falcon-40b": ["tiiuae/falcon-40b", "tiiuae/falcon-40b-instruct"],
    "falcon-180b": ["tiiuae/falcon-180B", "tiiuae/falcon-180B-chat"],
    # StarCoder2
    "starcoder2-3b": ["bigcode/starcoder2-3b"],
    "starcoder2-7b": ["bigcode/starcoder2-7b"],
    "starcoder2-15b": ["bigcode/starcoder2-15b"],
}
HUB_IDS = [(hub_id, name) for name, hub_ids in BREADTH.items() for hub_id in hub_ids]

# common spellings: the catalog name (any case) and a hub id without its namespace
SPELLINGS = [
    ("llama-2-7b", "llama-2-7b"),
    ("Llama-2-7b-hf", "llama-2-7b"),
    ("Llama-2-13b-chat-hf", "llama-2-13b"),
    ("Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("llama-3.1-8b", "llama-3.1-8b"),
    ("Llama-3.3-70B-Instruct", "llama-3.1-70b"),
    ("mistral-7b-v0.3", "mistral-7b-v0.3"),
    ("Mistral-7B-Instruct-v0.2", "mistral-7b-v0.2"),
    ("qwen3-8b", "qwen3-8b"),
    ("Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("Qwen2.5-Coder-32B-Instruct", "qwen2.5-coder-32b"),
    ("qwen1.5-110b", "qwen1.5-110b"),
    ("CodeLlama-34b-Python-hf", "codellama-34b"),
    ("Yi-34B", "yi-34b"),
    ("gemma-2-9b-it", "gemma-2-9b"),
    ("Phi-3-mini-4k-instruct", "phi-3-mini-4k"),
    ("OLMoE-1B-7B-0924", "olmoe-1b-7b"),
    ("falcon-180B", "falcon-180b"),
    ("starcoder2-15b", "starcoder2-15b"),
]


@pytest.mark.parametrize(("hub_id", "name"), HUB_IDS, ids=[h for h, _ in HUB_IDS])
def test_common_open_models_resolve_offline_by_hub_id_with_their_source(hub_id: str, name: str) -> None:
    spec = resolve_model(hub_id)
    assert spec.name == name
    assert hub_id == spec.hub_id or hub_id in spec.aliases
    assert spec.source.strip()
    assert date.fromisoformat(spec.as_of) <= date.today()


@pytest.mark.parametrize(("typed", "name"), SPELLINGS, ids=[t for t, _ in SPELLINGS])
def test_common_spellings_resolve(typed: str, name: str) -> None:
    assert resolve_model(typed).name == name
    assert resolve_model(typed.upper()).name == name


def test_a_repository_name_two_models_share_is_not_guessed(monkeypatch) -> None:
    """A hub id without its namespace names a model only when one catalog model has it."""
    from dataclasses import replace

    from tunecost.errors import TunecostError
    from tunecost.models import catalog as models

    catalog = dict(models.model_catalog())
    twin = replace(catalog["llama-2-7b"], name="llama-2-7b-twin", hub_id="someone/Llama-2-7b-hf", aliases=())
    monkeypatch.setattr(models, "model_catalog", lambda: {**catalog, twin.name: twin})
    with pytest.raises(TunecostError, match="unknown model"):
        models.resolve_model("Llama-2-7b-hf")
    assert models.resolve_model("meta-llama/Llama-2-7b-hf").name == "llama-2-7b"
