"""The model catalog (data/models/*.json), model resolution, and parameter counts computed from each config
(built on the meta device) against the published totals."""

from __future__ import annotations

import json
import math

import pytest

from tunecost.errors import TunecostError
from tunecost.models.catalog import SUPPORTED_FAMILIES, model_catalog, resolve_model
from tunecost.models.params import count_parameters

CATALOG = model_catalog()
REQUIRED_MODELS = (  # the catalog's minimum (the BlackMamba entries are tested below when present)
    "mixtral-8x7b",
    "mixtral-8x22b",
    "olmoe-1b-7b",
    "qwen1.5-moe-a2.7b",
    "qwen3-30b-a3b",
    "deepseek-v2-lite",
    "llama-3.1-8b",
)
PUBLISHED_TOTAL = [s for s in CATALOG.values() if s.published_total_params]
# Models whose published "activated" figure excludes the input embedding; checked separately below.
ACTIVE_WITHOUT_INPUT_EMBEDDING = ("deepseek-v2-lite", "granite-3.0-3b-a800m", "gpt-oss-20b", "gpt-oss-120b")
PUBLISHED_ACTIVE = [
    s for s in CATALOG.values() if s.published_active_params and s.name not in ACTIVE_WITHOUT_INPUT_EMBEDDING
]


def test_required_models_present() -> None:
    assert set(REQUIRED_MODELS) <= set(CATALOG)


@pytest.mark.parametrize("spec", list(CATALOG.values()), ids=lambda s: s.name)
def test_catalog_entry_schema(spec) -> None:
    assert spec.family in SUPPORTED_FAMILIES
    assert spec.source and spec.as_of
    assert spec.num_layers > 0 and spec.hidden_size > 0 and spec.vocab_size > 0
    assert 1 <= spec.default_experts_per_token <= spec.num_experts
    if spec.published_total_params:
        assert spec.published_params_source


def test_mixtral_facts() -> None:
    spec = resolve_model("mixtral-8x7b")
    assert (spec.num_experts, spec.default_experts_per_token, spec.num_layers) == (8, 2, 32)
    assert spec.is_moe and not resolve_model("llama-3.1-8b").is_moe


def test_mixtral_8x7b_params() -> None:
    # Mistral AI, "Mixtral of experts" (2023-12-11): 46.7 B total, 12.9 B used per token (top-2); within 1 %.
    counts = count_parameters(resolve_model("mixtral-8x7b"))
    assert counts.total == pytest.approx(46.7e9, rel=0.01)
    assert counts.active == pytest.approx(12.9e9, rel=0.01)
    assert counts.experts_per_token == 2 and counts.num_experts == 8
    # Hand count of the routed experts: 32 layers x 8 experts x 3 x 4096 x 14336 = 45,097,156,608
    assert counts.routed_experts == 32 * 8 * 3 * 4096 * 14336
    # active = total - routed + routed * 2/8
    assert counts.active == counts.total - counts.routed_experts + counts.routed_experts * 2 // 8
    # untied input embedding + output head: 2 x 32000 x 4096
    assert counts.embedding == 2 * 32000 * 4096


def test_active_params_follow_top_k() -> None:
    spec = resolve_model("mixtral-8x7b")
    dense = count_parameters(spec, experts_per_token=8)
    top1 = count_parameters(spec, experts_per_token=1)
    assert dense.active == dense.total
    assert top1.active < count_parameters(spec).active < dense.active


@pytest.mark.parametrize("spec", PUBLISHED_TOTAL, ids=lambda s: s.name)
def test_total_params_match_published(spec) -> None:
    # Within 2 %, or within the rounding of the published figure itself ("1.5B" is anything in [1.45, 1.55) B).
    published = spec.published_total_params
    assert abs(count_parameters(spec).total - published) <= max(0.02 * published, _half_last_digit(published))


def _half_last_digit(x: float) -> float:
    """Half a unit in the last significant digit of a published figure: 1.5e9 -> 5e7, 46.7e9 -> 5e7."""
    digits = f"{x:.6g}".replace(".", "").split("e")[0].rstrip("0").lstrip("0") or "0"
    return 0.5 * 10 ** (math.floor(math.log10(abs(x))) - len(digits) + 1)


def test_half_last_digit() -> None:
    assert _half_last_digit(1.5e9) == pytest.approx(5e7)
    assert _half_last_digit(46.7e9) == pytest.approx(5e7)
    assert _half_last_digit(2.8e9) == pytest.approx(5e7)
    assert _half_last_digit(8e9) == pytest.approx(5e8)


@pytest.mark.parametrize("spec", PUBLISHED_ACTIVE, ids=lambda s: s.name)
def test_active_params_match_published(spec) -> None:
    assert count_parameters(spec).active == pytest.approx(spec.published_active_params, rel=0.05)


@pytest.mark.parametrize(
    ("name", "input_embedding"),
    [
        # Model card: 2.4 B activated. Counted with both embeddings tunecost gets ~2.66 B (+11 %); the card's
        # figure leaves out the input embedding (102400 x 2048 = 209.7 M): 2.66 - 0.21 = 2.45 B, within 5 %.
        ("deepseek-v2-lite", 102400 * 2048),
        # Granite model card: 800 M active. Counted: 0.883 B with the (tied) embedding of 49155 x 1536 = 75.5 M;
        # without it 0.807 B, within 5 %.
        ("granite-3.0-3b-a800m", 49155 * 1536),
        # gpt-oss model card, Table 1: 3.61 B / 5.13 B active ("unembedding parameters are counted towards active,
        # but not embeddings"); the README rounds them to 3.6 B and 5.1 B.
        ("gpt-oss-20b", 201088 * 2880),
        ("gpt-oss-120b", 201088 * 2880),
    ],
)
def test_active_excludes_input_embedding(name, input_embedding) -> None:
    spec = resolve_model(name)
    counts = count_parameters(spec)
    assert spec.vocab_size * spec.hidden_size == input_embedding
    assert counts.active - input_embedding == pytest.approx(spec.published_active_params, rel=0.05)


def _blackmamba_present() -> bool:
    return "blackmamba-2.8b" in CATALOG


@pytest.mark.skipif(
    not _blackmamba_present(),
    reason="blackmamba-2.8b is not in the model catalog yet (its entry and model code are added by another worker)",
)
def test_blackmamba_2_8b_params() -> None:
    # BlackMamba paper / model card: 2.78 B total, 0.63 B active at top-1.
    spec = resolve_model("blackmamba-2.8b")
    counts = count_parameters(spec, experts_per_token=1)
    assert counts.total == pytest.approx(2.78e9, rel=0.02)
    assert counts.active == pytest.approx(0.63e9, rel=0.05)


@pytest.mark.parametrize(
    "typed", ["Mixtral-8x7B", "mistralai/Mixtral-8x7B-v0.1", "MISTRALAI/mixtral-8x7b-v0.1", "mixtral_8x7b"]
)
def test_resolve_by_name_or_hub_id(typed: str) -> None:
    assert resolve_model(typed).name == "mixtral-8x7b"


def test_a_name_spelled_without_its_punctuation_is_the_one_it_matches() -> None:
    assert resolve_model("llama2-70b").name == "llama-2-70b"  # MLPerf's llama2_70b_lora
    assert resolve_model("Llama2_70B").name == "llama-2-70b"


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(TunecostError) as info:
        resolve_model("mixtral-8x9b")
    message = str(info.value)
    assert message.startswith("unknown model 'mixtral-8x9b'.")
    assert "Did you mean" in message
    for name in REQUIRED_MODELS:
        assert name in message


def test_a_name_without_its_version_suggests_the_versions() -> None:
    with pytest.raises(
        TunecostError, match=r"Did you mean 'mistral-7b-v0\.1', 'mistral-7b-v0\.2' or 'mistral-7b-v0\.3'\?"
    ):
        resolve_model("mistral-7b")


def test_an_uncached_hub_id_in_an_offline_session_is_an_error() -> None:
    """Tests never reach the Hub (tests/conftest.py sets HF_HUB_OFFLINE; the download: tests/models/test_hub.py)."""
    with pytest.raises(TunecostError, match="not in the catalog: config.json .* not in the local Hugging Face cache"):
        resolve_model("no-such-org/no-such-model-xyz")


def _tiny_config() -> dict:
    return {**CATALOG["tiny-mixtral"].config, "num_hidden_layers": 2}


def test_local_config_file_and_folder(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config()))
    for name in (str(tmp_path / "config.json"), str(tmp_path)):
        spec = resolve_model(name)
        assert spec.family == "mixtral" and spec.num_experts == 8 and spec.num_layers == 2
        assert spec.local_path == str(tmp_path)
    counts = count_parameters(resolve_model(str(tmp_path)))
    # a 2-layer tiny Mixtral: the 4-layer tiny catalog entry minus two layers' parameters
    four = count_parameters(CATALOG["tiny-mixtral"])
    per_layer = (four.total - four.embedding - 256) // 4  # minus embeddings and the final norm (hidden 256)
    assert counts.total == four.total - 2 * per_layer


def test_unsupported_model_type_says_what(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 768}))
    with pytest.raises(TunecostError, match=r"unsupported architecture model_type='gpt2'; tunecost supports: mixtral"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("name", ["tests/fixtures/none.json", "some/dir/model", "config.json", "a/b.json"])
def test_a_missing_config_path_is_a_one_line_error(name: str) -> None:
    """A path that does not exist is said so, never read as a hub id (huggingface_hub refuses "a/b/c" ids with
    a ValueError of its own)."""
    with pytest.raises(TunecostError, match=r"^no model config at .*: no such file or folder$"):
        resolve_model(name)


def test_bad_local_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TunecostError, match="not valid JSON"):
        resolve_model(str(tmp_path / "config.json"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TunecostError, match="no config.json at"):
        resolve_model(str(empty))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[1, 2]", "a model config is a JSON object, found a list"),
        (b"\xff\xfe\x00binary", "not a text file"),
        (b'{"model_type": "mixtral", "hidden_size": "x"}', "transformers rejects this mixtral config: .*hidden_size"),
    ],
)
def test_local_config_that_is_not_a_config(tmp_path, content, message) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(TunecostError, match=message):
        resolve_model(str(tmp_path))


def test_local_config_missing_keys_take_transformers_defaults(tmp_path) -> None:
    """A minimal config is the model transformers would build from it (Mixtral's defaults: 8 experts, top-2,
    32 layers), not a dense model; keys the user gave win."""
    from transformers import MixtralConfig

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral", "num_hidden_layers": 2}))
    spec = resolve_model(str(tmp_path))
    defaults = MixtralConfig()
    assert spec.num_experts == defaults.num_local_experts == 8 and spec.is_moe
    assert spec.default_experts_per_token == defaults.num_experts_per_tok
    assert spec.num_layers == 2 and spec.hidden_size == defaults.hidden_size
    assert "transformers_version" not in spec.config and "architectures" not in spec.config


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("NousResearch/Llama-2-70b-hf", "llama-2-70b"),
        ("Qwen/Qwen-7B-Chat", "qwen-7b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
    ],
)
def test_hub_id_aliases_resolve_offline(typed: str, name: str) -> None:
    assert resolve_model(typed).name == name


def test_qwen1_as_qwen2_has_qwen1s_tensors() -> None:
    """Qwen-7B's own modelling code, counted by hand from its config.json (hidden 4096, 32 layers, fused c_attn
    4096 -> 3 x 4096 with bias, c_proj 4096 -> 4096, w1 and w2 4096 -> 11008, mlp.c_proj 11008 -> 4096, two
    RMSNorms per layer, a final RMSNorm, untied 151936-row embedding and lm_head): the Qwen2 form has the same."""
    h, layers, ffn, vocab = 4096, 32, 22016 // 2, 151936
    per_layer = (h * 3 * h + 3 * h) + h * h + 2 * h * ffn + ffn * h + 2 * h
    hand = 2 * vocab * h + layers * per_layer + h
    assert count_parameters(resolve_model("Qwen/Qwen-7B")).total == hand


@pytest.mark.parametrize(
    ("hub_id", "name", "group_size"),
    [
        ("TheBloke/Mistral-7B-v0.1-GPTQ", "mistral-7b-v0.1", 128),
        ("TheBloke/Llama-2-70B-GPTQ", "llama-2-70b", -1),
        ("TheBloke/Mixtral-8x7B-Instruct-v0.1-GPTQ", "mixtral-8x7b", -1),
        ("qwen/qwen-72b-chat-int4", "qwen-72b", 128),
    ],
)
def test_gptq_checkpoints_resolve_to_their_base_model(hub_id: str, name: str, group_size: int) -> None:
    from tunecost.models.catalog import gptq_checkpoint

    assert resolve_model(hub_id).name == name
    checkpoint = gptq_checkpoint(hub_id)
    assert checkpoint is not None and checkpoint.group_size == group_size and checkpoint.bits == 4
    assert checkpoint.source.startswith("https://huggingface.co/")
    assert gptq_checkpoint(name) is None  # a base model is not a GPTQ checkpoint


def test_learned_positions_bound_the_sequence_length() -> None:
    """GPTBigCode looks positions up in a learned table (`wpe`, config n_positions); rotary families have none."""
    santacoder = resolve_model("santacoder")
    assert santacoder.max_positions == santacoder.config["n_positions"] == 2048
    santacoder.check_seq_len(2048)
    with pytest.raises(TunecostError, match="4096 tokens exceeds its 2048 learned position embeddings"):
        santacoder.check_seq_len(4096)
    mistral = resolve_model("mistral-7b-v0.1")
    assert mistral.max_positions is None
    mistral.check_seq_len(10**6)


_TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4}
_TEXT |= {"num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300}
_VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2}
_VISION |= {"image_size": 28, "patch_size": 14}
# (the checkpoint's config without its sub-configs, its text_config, its vision_config, the text family read)
VISION_LANGUAGE = {
    # Gemma 3: a sparse text_config as on the hub (no model_type: Gemma3Config builds a Gemma3TextConfig)
    "gemma3": (
        {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 4},
        {**_TEXT, "sliding_window": 32},
        {**_VISION, "model_type": "siglip_vision_model"},
        "gemma3_text",
    ),
    # Ministral 3: the text model named in text_config (ministral3), a Pixtral vision tower
    "mistral3": (
        {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"]},
        {**_TEXT, "model_type": "ministral3"},
        {**_VISION, "model_type": "pixtral", "head_dim": 16},
        "ministral3",
    ),
}


@pytest.mark.parametrize("name", sorted(VISION_LANGUAGE))
def test_vision_language_config_is_its_text_model(tmp_path, name: str) -> None:
    """A vision-language config.json is read as its text model: the parameters of transformers' own
    ...ForConditionalGeneration less its vision tower and projector, and the source says what is left out."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config, text, vision, family = VISION_LANGUAGE[name]
    (tmp_path / "config.json").write_text(json.dumps({**config, "text_config": text, "vision_config": vision}))
    spec = resolve_model(str(tmp_path))
    assert spec.family == family and spec.hidden_size == 64 and spec.num_layers == 3
    assert "vision tower and projector are not counted" in spec.not_modelled
    with torch.device("meta"):
        full = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(str(tmp_path)))
    left_out = {"vision_tower", "multi_modal_projector"}
    text_params = sum(p.numel() for n, p in full.named_parameters() if not left_out & set(n.split(".")))
    assert count_parameters(spec).total == text_params


def test_the_vision_tower_left_out_is_said_with_the_simulated_step() -> None:
    """Gemma 3 4B is catalogued as its text model; the step's assumptions say what is left out."""
    from tunecost.simulate import simulate_step
    from tunecost.workload.job import FineTuneJob, LoraConfig

    spec = resolve_model("google/gemma-3-4b-it")
    assert spec.name == "gemma-3-4b" and "vision tower" in spec.not_modelled
    job = FineTuneJob(model=spec.name, method="lora", lora=LoraConfig(targets=("attention",)), seq_len=64)
    sim = simulate_step(job.with_(stack="hf-peft"), use_cache=False)
    assert sim.assumptions[0] == f"gemma-3-4b: {spec.not_modelled}"
    assert not any(
        "vision tower" in a
        for a in simulate_step(job.with_(model="gemma-3-1b", stack="hf-peft"), use_cache=False).assumptions
    )
