"""FP8 training's memory in the step simulator (docs/fp8.md): on a tiny Llama, what each recipe adds to the peak
and to its categories follows the rule, counted here by hand from the config (no granule rounding)."""

from __future__ import annotations

import json

import pytest

from tunecost.errors import TunecostError
from tunecost.simulate import simulate_step
from tunecost.workload.job import FineTuneJob, LoraConfig

H, FFN, KV, L, VOCAB = 64, 96, 32, 3, 200  # hidden, intermediate, key/value width (2 heads x 16), layers, vocab
BATCH, SEQ = 2, 16
TOKENS = BATCH * SEQ
# q, k, v, o, gate, up, down of one layer: (in, out)
LINEARS = [(H, H), (H, KV), (H, KV), (H, H), (H, FFN), (H, FFN), (FFN, H)]


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    config = {
        "model_type": "llama",
        "tie_word_embeddings": False,
        "hidden_size": H,
        "intermediate_size": FFN,
        "num_hidden_layers": L,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
    }
    path = tmp_path_factory.mktemp("fp8") / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _sim(path, fp8: str, method: str = "full", *, fp8_params: bool = False):
    job = FineTuneJob(
        model=str(path),
        method=method,
        lora=LoraConfig(targets=("attention", "mlp")),
        batch_size=BATCH,
        seq_len=SEQ,
        fp8=fp8,
        fp8_params=fp8_params,
        gradient_checkpointing=False,
    )
    return simulate_step(job, num_layers_to_trace=99, granule_bytes=1, use_cache=False)


@pytest.fixture(scope="module")
def sims(config_file):
    return {r: _sim(config_file, r) for r in ("none", "tensorwise", "te-delayed")}


def _added(sims, recipe: str) -> dict[str, int]:
    base, fp8 = sims["none"].breakdown_bytes, sims[recipe].breakdown_bytes
    return {k: fp8.get(k, 0) - base.get(k, 0) for k in set(base) | set(fp8) if fp8.get(k, 0) != base.get(k, 0)}


def test_torchao_adds_only_the_largest_linears_cast_temporaries(sims) -> None:
    # largest of grad-out twice + weight + input, one byte each (the down projection's is 2*32*64 + 96*64 + 32*96)
    expected = max(2 * TOKENS * o + i * o + TOKENS * i for i, o in LINEARS)
    assert _added(sims, "tensorwise") == {"temporaries": expected}
    assert sims["tensorwise"].peak_bytes - sims["none"].peak_bytes == expected


def test_transformer_engine_caches_fp8_weights_and_saves_fp8_inputs(sims) -> None:
    weights = L * sum(2 * i * o for i, o in LINEARS)  # row- and column-wise FP8 copies of every linear
    inputs = L * sum(TOKENS * i for i, _ in LINEARS)  # column-wise FP8 input per linear
    grad_out = max(2 * TOKENS * o for _, o in LINEARS)
    assert _added(sims, "te-delayed") == {"buffers": weights, "activations": inputs, "temporaries": grad_out}
    assert sims["te-delayed"].peak_bytes - sims["none"].peak_bytes == weights + inputs + grad_out
    assert any("Transformer Engine" in a for a in sims["te-delayed"].assumptions)


def test_torchao_beside_lora_keeps_the_frozen_weights_bf16_gradient(config_file, sims) -> None:
    lora_none, lora = _sim(config_file, "none", "lora"), _sim(config_file, "tensorwise", "lora")
    expected = max(2 * TOKENS * o + i * o + TOKENS * i + 2 * i * o for i, o in LINEARS)
    assert lora.peak_bytes - lora_none.peak_bytes == expected


@pytest.mark.parametrize(("method", "weights"), [("full", "trainable_params"), ("lora", "frozen_weights")])
def test_fp8_primary_weights_keep_one_fp8_copy_beside_the_weight(config_file, method, weights) -> None:
    """TE's fp8_model_init: each linear's bf16 weight (2 bytes) held as its FP8 row-wise copy (1 byte), the
    column-wise copy cached beside it; nothing else changes."""
    plain, primary = _sim(config_file, "te-delayed", method), _sim(config_file, "te-delayed", method, fp8_params=True)
    elements = L * sum(i * o for i, o in LINEARS)
    added = {
        k: primary.breakdown_bytes.get(k, 0) - plain.breakdown_bytes.get(k, 0)
        for k in set(plain.breakdown_bytes) | set(primary.breakdown_bytes)
    }
    assert {k: v for k, v in added.items() if v} == {"buffers": -elements, weights: -elements}
    assert plain.peak_bytes - primary.peak_bytes == 2 * elements
    assert any("fp8 primary weights" in a for a in primary.assumptions)


def test_fp8_primary_weights_need_transformer_engine() -> None:
    with pytest.raises(TunecostError, match="--fp8-params: .* use --fp8 te-delayed"):
        FineTuneJob(model="tiny-mixtral", method="lora", fp8="tensorwise", fp8_params=True)
