"""Korthikanti et al. 2022's per-layer activation forms (their section 4 and Table 2) and the Llama block's
term-by-term count, against the paper's worked numbers and tunecost's traced step (docs/multi-gpu.md, "Activation
memory per layer vs Korthikanti et al. 2022")."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunecost.distributed.activation_formulas import (
    gpt_attention_bytes,
    gpt_layer_terms_bytes,
    gpt_layernorm_bytes,
    gpt_mlp_bytes,
    korthikanti_layer_activation_bytes,
    llama_layer_activation_bytes,
    llama_layer_terms_bytes,
    traced_layer_activation_bytes,
)
from tunecost.distributed.single_step import single_gpu_step
from tunecost.errors import TunecostError
from tunecost.workload.job import FineTuneJob

GPT3 = dict(s=2048, b=1, h=12288, a=96)  # GPT-3 175B (Korthikanti et al. section 4.1 and 5)
MT_NLG = dict(s=2048, b=1, h=20480, a=128)  # MT-NLG 530B


def test_section_4_1_breakdown():
    # attention 11sbh + 5as^2b, MLP 19sbh, layer norms 4sbh (section 4.1)
    s, b, h, a = 64, 2, 32, 4
    sbh = s * b * h
    assert sum(gpt_attention_bytes(s, b, h, a).values()) == 11 * sbh + 5 * a * s * s * b
    assert sum(gpt_mlp_bytes(s, b, h).values()) == 19 * sbh
    assert sum(gpt_layernorm_bytes(s, b, h).values()) == 4 * sbh


@pytest.mark.parametrize(("model", "scores", "selective_saving"), [(GPT3, 80, 0.70), (MT_NLG, 64, 0.65)])
def test_paper_worked_numbers(model, scores, selective_saving):
    # section 5: 5as/h = 80 for GPT-3 and 64 for MT-NLG; selective recomputation saves 70% and 65% of activations
    s, b, h, a = model["s"], model["b"], model["h"], model["a"]
    assert 5 * a * s / h == scores
    none = korthikanti_layer_activation_bytes(s, b, h, a)
    assert none == s * b * h * (34 + scores)
    selective = korthikanti_layer_activation_bytes(s, b, h, a, recompute="selective")
    assert 1 - selective / none == pytest.approx(selective_saving, abs=0.005)


@settings(max_examples=40, deadline=None)
@given(
    s=st.sampled_from([128, 2048, 4096]),
    b=st.integers(1, 4),
    h=st.sampled_from([1024, 12288]),
    a=st.sampled_from([8, 96]),
    tp=st.sampled_from([1, 2, 8]),
    sp=st.booleans(),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_table_2_is_the_sum_of_its_terms(s, b, h, a, tp, sp, recompute):
    sp = sp and tp > 1
    closed = korthikanti_layer_activation_bytes(s, b, h, a, tp=tp, sequence_parallel=sp, recompute=recompute)
    terms = gpt_layer_terms_bytes(s, b, h, a, tp=tp, sequence_parallel=sp, recompute=recompute)
    assert sum(terms.values()) == pytest.approx(closed)


def test_table_2_rows():
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    f = korthikanti_layer_activation_bytes
    assert f(s, b, h, a, tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert f(s, b, h, a, tp=t, sequence_parallel=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert f(s, b, h, a, tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert f(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective") == pytest.approx(34 * sbh / t)
    assert f(s, b, h, a, recompute="full") == 2 * sbh
    with pytest.raises(TunecostError, match="sequence parallelism"):
        f(s, b, h, a, sequence_parallel=True)


def test_llama_closed_form_at_tp1():
    # sbh(20 + 4 kv hd / h + 8f/h) + sb(8 + 4a) in 16 bits (docs/multi-gpu.md)
    s, b, h, a, kv, f = 4096, 1, 8192, 64, 8, 28672
    expected = s * b * h * (20 + 4 * kv * (h // a) / h + 8 * f / h) + s * b * (8 + 4 * a)
    assert llama_layer_activation_bytes(s, b, h=h, a=a, kv=kv, f=f) == expected


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([2, 4, 8]), keeps=st.booleans(), recompute=st.sampled_from(["none", "selective"]))
def test_llama_sequence_parallel_splits_everything_megatron_keeps(tp, keeps, recompute):
    kw = dict(h=4096, a=32, kv=8, f=14336, tp=tp, recompute=recompute)
    one = llama_layer_activation_bytes(4096, 1, h=4096, a=32, kv=8, f=14336, recompute=recompute)
    sp = llama_layer_activation_bytes(4096, 1, sequence_parallel=True, keeps_gathered_inputs=keeps, **kw)
    gathered = 2 * 2 * 4096 * 4096 * (1 - 1 / tp)  # the QKV and MLP inputs, kept whole by DTensor
    assert sp == pytest.approx(one / tp + (gathered if keeps else 0))
    assert llama_layer_activation_bytes(4096, 1, **kw) > sp


# tiny dense Llama configs (2 layers): the fixture's GQA config and one with other head and MLP ratios
CONFIGS = {
    "gqa": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2),
    "wide": dict(hidden_size=96, intermediate_size=352, num_attention_heads=6, num_key_value_heads=1),
}


CASES = [("gqa", "bf16", False), ("wide", "fp32", False), ("wide", "bf16", True)]  # (config, dtype, recompute)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """{case: (traced per-layer bytes, the config)} for full fine-tuning, seq 64, batch 2."""
    out = {}
    for name, dtype, recompute in CASES:
        dims = CONFIGS[name]
        config = {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 256,
            "num_hidden_layers": 2,
            "max_position_embeddings": 256,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            **dims,
        }
        path = tmp_path_factory.mktemp(name) / "config.json"
        path.write_text(json.dumps(config))
        job = FineTuneJob(
            model=str(path),
            method="full",
            compute_dtype=dtype,
            batch_size=2,
            seq_len=64,
            gradient_checkpointing=recompute,
        )
        step = single_gpu_step(job, granule_bytes=1)
        out[name, dtype, recompute] = (traced_layer_activation_bytes(step.segments, step.num_layers), dims)
    return out


@pytest.mark.parametrize(("name", "dtype", "recompute"), CASES)
def test_llama_form_matches_traced_step(traced, name, dtype, recompute):
    per_layer, dims = traced[name, dtype, recompute]
    formula = llama_layer_activation_bytes(
        64,
        2,
        h=dims["hidden_size"],
        a=dims["num_attention_heads"],
        kv=dims["num_key_value_heads"],
        f=dims["intermediate_size"],
        d=2 if dtype == "bf16" else 4,
        recompute="full" if recompute else "none",
    )
    assert per_layer == formula


def test_llama_terms_named():
    terms = llama_layer_terms_bytes(8, 1, h=8, a=2, kv=1, f=16)
    assert {"q", "k_v", "logsumexp", "swiglu", "input_norm_fp32_input", "post_attention_norm_output"} <= set(terms)
