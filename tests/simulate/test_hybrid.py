"""The hybrid decoders: Qwen3.5 (gated DeltaNet and gated attention, dense and MoE), Qwen3-Next (fused DeltaNet
projections, experts every second layer here) and Granite 4.0's hybrid (Mamba2 and attention, with routed experts
or dense). Each config.json reads as its text model with transformers' parameters, LoRA reaches both token mixers,
a step traced a period of four layers at a time scales to the full depth, the kernels keep what fla's and
mamba-ssm's save, and the throughput model counts the work the simulator traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.estimate.calibrated import GATED_DELTA_TIME_NOTE, MAMBA2_TIME_NOTE, software_notes
from tunecost.estimate.estimators import EstimateRequest
from tunecost.estimate.throughput.counts import analytic_step_counts
from tunecost.models.anatomy import decoder_layers, layer_pattern
from tunecost.models.build import build_model
from tunecost.models.catalog import resolve_model
from tunecost.models.families import arch_of
from tunecost.models.params import count_parameters
from tunecost.simulate import simulate_step
from tunecost.workload.job import FineTuneJob, LoraConfig

DELTANET = ("tiny-qwen3_5", "tiny-qwen3_5-moe", "tiny-qwen3-next")
FIXTURES = (*DELTANET, "tiny-granite-hybrid", "tiny-granite-hybrid-dense")
_LORA = LoraConfig(rank=4, alpha=8, targets=("attention", "mlp"))
# the projections LoRA wraps in layer 0 (a DeltaNet or Mamba2 layer) and layer 3 (attention)
_QWEN3_5 = ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b", "linear_attn.out_proj")
_GRANITE = ("mamba.in_proj", "mamba.out_proj")
WRAPPED = {
    "tiny-qwen3_5": (*_QWEN3_5, "mlp.gate_proj"),
    "tiny-qwen3_5-moe": _QWEN3_5,
    "tiny-qwen3-next": ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba", "linear_attn.out_proj"),
    "tiny-granite-hybrid": _GRANITE,  # its shared MLP sits beside the experts: an `experts` target there
    "tiny-granite-hybrid-dense": (*_GRANITE, "shared_mlp.input_linear"),  # the only MLP: an `mlp` target
}


def _job(path: str, method: str = "lora", **kw) -> FineTuneJob:
    return FineTuneJob(model=path, method=method, lora=_LORA, batch_size=2, seq_len=128, **kw)


def _text_config(path: str) -> dict:
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    return raw.get("text_config", raw)


@pytest.mark.parametrize("name", FIXTURES)
def test_counted_parameters_are_transformers_text_models(config_path, name) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = resolve_model(config_path(name))
    text = _text_config(config_path(name))
    assert spec.family == text["model_type"]
    assert spec.is_moe == bool(text.get("num_experts") or text.get("num_local_experts"))  # Granite's dense: 0
    reference = AutoModelForCausalLM.from_config(AutoConfig.for_model(**text))
    expected = sum(p.numel() for p in reference.parameters())
    assert count_parameters(spec).total == expected
    assert arch_of(spec).total_params == expected
    assert layer_pattern(spec) == (0, 4, 2)  # three linear-time layers, then attention; twice


def test_qwen3_5_heads_are_untied_by_default(config_path) -> None:
    """Qwen3_5(Moe)Config's tie_word_embeddings default (the checkpoint's, not its text config's) is False."""
    assert resolve_model(config_path("tiny-qwen3_5")).config["tie_word_embeddings"] is False


@pytest.mark.parametrize("name", FIXTURES)
def test_lora_reaches_both_token_mixers(config_path, name) -> None:
    from tunecost.simulate.modules import SimLinear
    from tunecost.simulate.prepare import transform

    job = _job(config_path(name))
    model = build_model(resolve_model(job.model), device="meta", dtype=torch.bfloat16)
    transform(model, job)
    linear, attention = decoder_layers(model)[0], decoder_layers(model)[3]
    wrapped = [linear.get_submodule(p) for p in WRAPPED[name]]
    wrapped += [attention.get_submodule(f"self_attn.{p}") for p in ("q_proj", "o_proj")]
    assert all(isinstance(m, SimLinear) and m.lora_rank == 4 for m in wrapped)
    shared = getattr(linear, "shared_mlp", None)
    assert shared is None or (shared.input_linear.lora_rank is None) == (name == "tiny-granite-hybrid")


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_step_traced_per_period_scales_to_the_full_depth(config_path, name, method) -> None:
    job = _job(config_path(name), method, gradient_checkpointing=False)
    full = simulate_step(job, num_layers_to_trace=99, use_cache=False)
    scaled = simulate_step(job, use_cache=False)
    assert full.layers_traced == (8,)
    assert scaled.peak_bytes == pytest.approx(full.peak_bytes, rel=0.01)
    assert scaled.flops_per_step == pytest.approx(full.flops_per_step, rel=1e-6)


def test_the_delta_rule_keeps_what_flas_kernel_saves() -> None:
    """fla 0.6's ChunkGatedDeltaRuleFunction with q/k l2-normalised in the kernel saves q, its fp32 inverse norms,
    k, its inverse norms, v, the fp32 chunk-cumulated gate, beta and A (one 64-wide block row per token and value
    head); the chunk states h (B, chunks, HV, K, V) are not kept."""
    from tunecost.simulate.gated_delta import _ChunkGatedDeltaRule

    b, t, h, hv, k, v = 2, 130, 2, 4, 16, 32
    bf16 = {"device": "meta", "dtype": torch.bfloat16, "requires_grad": True}
    q, key = torch.empty(b, t, h, k, **bf16), torch.empty(b, t, h, k, **bf16)
    value, beta = torch.empty(b, t, hv, v, **bf16), torch.empty(b, t, hv, **bf16)
    g = torch.empty(b, t, hv, device="meta", dtype=torch.float32, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append((tuple(x.shape), x.dtype)) or x, lambda x: x):
        out = _ChunkGatedDeltaRule.apply(q, key, value, g, beta)
    assert out.shape == value.shape
    f32 = torch.float32
    assert saved == [
        ((b, t, h, k), torch.bfloat16),
        ((b, t, h), f32),
        ((b, t, h, k), torch.bfloat16),
        ((b, t, h), f32),
        ((b, t, hv, v), torch.bfloat16),
        ((b, t, hv), f32),
        ((b, t, hv), torch.bfloat16),
        ((b, t, hv, 64), torch.bfloat16),
    ]
    grads = torch.autograd.grad(out, (q, key, value, g, beta), torch.empty_like(out))
    assert [x.shape for x in grads] == [x.shape for x in (q, key, value, g, beta)]


def test_the_fused_kernel_keeps_what_mamba_ssm_saves() -> None:
    """MambaSplitConv1dScanCombinedFn (mamba-ssm, with a gated RMSNorm and out_proj) saves its input zxbcdt, the
    scan's output (B, L, H, P) and the norm's fp32 inverse RMS per group and token, beside its weights."""
    from tunecost.simulate.mamba2 import _SplitConv1dScan

    b, t, heads, head_dim, groups, state, hidden = 2, 70, 4, 8, 1, 16, 24
    dim, conv_dim = heads * head_dim, heads * head_dim + 2 * groups * state
    meta = {"device": "meta", "dtype": torch.bfloat16}
    zxbcdt = torch.empty(b, t, dim + conv_dim + heads, requires_grad=True, **meta)
    weights = [torch.empty(conv_dim, 4, **meta), torch.empty(conv_dim, **meta), torch.empty(heads, **meta)]
    weights += [torch.empty(heads, device="meta"), torch.empty(heads, **meta), torch.empty(dim, **meta)]
    weights += [torch.empty(hidden, dim, **meta), None]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append((tuple(x.shape), x.dtype)) or x, lambda x: x):
        out = _SplitConv1dScan.apply(zxbcdt, *weights, (heads, head_dim, groups, 32))
    assert out.shape == (b, t, hidden)
    activations = [s for s in saved if s[0][0] == b or s[0] == (groups * b * t,)]
    assert activations == [
        ((b, t, dim + conv_dim + heads), torch.bfloat16),
        ((b, t, heads, head_dim), torch.bfloat16),
        ((groups * b * t,), torch.float32),
    ]
    (grad,) = torch.autograd.grad(out, (zxbcdt,), torch.empty_like(out))
    assert grad.shape == zxbcdt.shape


@pytest.mark.parametrize("name", FIXTURES)
def test_the_throughput_model_counts_what_the_simulator_traces(config_path, name) -> None:
    job = _job(config_path(name), gradient_checkpointing=False)
    sim = simulate_step(job, use_cache=False).total_counts
    spec = resolve_model(job.model)
    ours = analytic_step_counts(spec, job)
    assert ours.flops_by_class["ssm_scan"] == pytest.approx(sim.flops_by_class["ssm_scan"], rel=1e-9)
    # every projection, shared expert and router; the simulator files q/k/v/o with the attention kernel, which
    # scores every pair (forward 4 b l^2 width, backward 2.5x); layer 0's input projections get no input gradient
    # there (the frozen embedding needs none); mamba-ssm's kernel computes the frozen out_proj's weight gradient too
    arch, tokens = arch_of(spec), job.batch_size * job.seq_len
    matmuls = ("attention", "dense_matmul", "expert_matmul", "router")
    linear = sum(ours.flops_by_class[c] for c in matmuls) - ours.flops_by_class["attention"]
    if arch.num_ssd_layers:
        inner = arch.ssd_heads * arch.ssd_head_dim
        linear += arch.num_ssd_layers * 2 * tokens * inner * arch.hidden
        linear -= 2 * tokens * arch.hidden * (2 * inner + 2 * arch.ssd_groups * arch.ssd_state + arch.ssd_heads)
    else:
        key, value = arch.delta_key_heads * arch.delta_key_dim, arch.delta_value_heads * arch.delta_value_dim
        linear -= 2 * tokens * arch.hidden * (2 * key + 2 * value + 2 * arch.delta_value_heads)
    kernel = arch.num_attention_layers * 4.0 * tokens * job.seq_len * arch.num_heads * arch.head_dim * 3.5
    traced = sum(sim.flops_by_class.get(c, 0.0) for c in matmuls) - kernel
    assert linear == pytest.approx(traced, rel=1e-3)


def test_qlora_runs_the_mamba_layers_on_transformers_pytorch_path(config_path) -> None:
    """mamba-ssm's kernel reads out_proj.weight, which bitsandbytes packs: a QLoRA step runs transformers' own
    Mamba2 code (as without mamba-ssm), which keeps more than the kernel, and says so."""
    from tunecost.simulate.prepare import build_prepared

    for method, bound in (("qlora", False), ("lora", True)):
        prepared = build_prepared(_job(config_path("tiny-granite-hybrid"), method), num_units=None)
        assert ("forward" in vars(decoder_layers(prepared.model)[0].mamba)) is bound  # the kernel's forward
    qlora = simulate_step(_job(config_path("tiny-granite-hybrid"), "qlora"), use_cache=False)
    assert any("PyTorch path" in a for a in qlora.assumptions)


@pytest.mark.parametrize(
    ("hub_id", "total", "layers"),
    [
        ("Qwen/Qwen3.5-9B", 9e9, (8, 24)),
        ("Qwen/Qwen3.5-35B-A3B", 35e9, (10, 30)),
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", 80e9, (12, 36)),
    ],
)
def test_catalog_models_resolve_with_the_size_in_their_names(hub_id, total, layers) -> None:
    spec = resolve_model(hub_id)
    assert spec.is_moe == (total > 9e9) and count_parameters(spec).total == pytest.approx(total, abs=0.5e9)
    arch = arch_of(spec)
    assert (arch.num_attention_layers, arch.num_delta_layers) == layers


@pytest.mark.parametrize("name", DELTANET)
def test_liger_binds_what_its_qwen3_5_patch_binds(config_path, name) -> None:
    """apply_liger_kernel_to_qwen3_5(_moe) (liger-kernel 0.8.5): every Qwen3_5RMSNorm (q/k norms included, offset 1,
    not in place), not the gated norm; SwiGLU on the dense MLPs and the shared experts; the fused loss. Qwen3-Next's
    patch (apply_liger_kernel_to_qwen3_next) binds the same."""
    from tunecost.simulate.liger import install_liger

    spec = resolve_model(config_path(name))
    model = build_model(spec, device="meta", dtype=torch.bfloat16)
    install_liger(model, spec.family)
    bound = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if "forward" in vars(m)}
    glu = {"shared_expert", "mlp"} if spec.family == "qwen3_next" else {"shared_expert" if spec.is_moe else "mlp"}
    assert bound == {"input_layernorm", "post_attention_layernorm", "q_norm", "k_norm", "norm", *glu}
    assert not any("forward" in vars(m) for m in model.modules() if type(m).__name__.endswith("RMSNormGated"))
    eager, liger = (
        simulate_step(_job(config_path(name), liger_kernel=on), use_cache=False).peak_bytes for on in (False, True)
    )
    assert liger < eager


@pytest.mark.parametrize(
    ("name", "note"),
    [("tiny-qwen3_5", GATED_DELTA_TIME_NOTE), ("tiny-granite-hybrid", MAMBA2_TIME_NOTE)],
    ids=["gated DeltaNet", "Mamba2"],
)
def test_a_hybrids_linear_time_layers_are_said_to_be_counted(config_path, name, note) -> None:
    """The note that `estimate` gives each row (end to end: the `long` test below)."""
    h100 = resolve_gpu_name("H100").gpu
    assert note in software_notes(EstimateRequest(job=_job(config_path(name)), gpu=h100))
    assert note not in software_notes(EstimateRequest(job=_job("Qwen/Qwen2.5-0.5B"), gpu=h100))


@pytest.mark.long  # 15-20 s each on 2 cores: the batch search traces the torch fallbacks of the mixers
@pytest.mark.parametrize(("name", "mixer"), [("tiny-qwen3_5", "gated DeltaNet"), ("tiny-granite-hybrid", "Mamba2")])
def test_estimate_says_its_linear_time_layers_are_counted_not_calibrated(cli_json, config_path, name, mixer) -> None:
    rows = cli_json("estimate", model=config_path(name), method="lora", gpu="H100", seq_len=128, queries=100, epochs=1)
    assert all(f"{mixer} layers: counted as" in row["notes"] for row in rows)


def test_context_parallelism_of_a_hybrid_is_one_clear_error(cli_error, config_path) -> None:
    args = ["estimate", "--model", config_path("tiny-qwen3_5"), "--method", "lora", "--gpu", "H100", "--seq-len"]
    line = cli_error([*args, "128", "--queries", "100", "--epochs", "1", "--gpus", "2", "--cp", "2"])
    assert "context parallelism is modelled for attention layers" in line
