"""simulate_step: layer scaling against full traces, FLOPs against a hand count, weight storage
parts, the result cache, and one-line errors for what is unsupported."""

from __future__ import annotations

import json

import pytest

from tunecost.errors import TunecostError
from tunecost.simulate import simulate_step
from tunecost.workload.job import FineTuneJob, LoraConfig

SMALL = dict(H=128, I=256, V=2048, NH=4, NKV=2, HD=32, E=8, N=6)  # tests/fixtures/simulate/small-mixtral.json


def _job(config_path, **kw) -> FineTuneJob:
    base = dict(
        model=config_path("small-mixtral"), compute_dtype="fp32", batch_size=2, seq_len=64, lora=LoraConfig(rank=8)
    )
    base.update(kw)
    return FineTuneJob(**base)


@pytest.mark.parametrize(
    "options",
    [
        dict(method="qlora", gradient_checkpointing=True),
        dict(method="full", gradient_checkpointing=False),
        dict(method="lora", gradient_checkpointing=False, experts_per_token=8),
    ],
)
def test_scaled_two_depths_match_full_trace(config_path, options):
    job = _job(config_path, **options)
    full = simulate_step(job, num_layers_to_trace=99, use_cache=False)
    scaled = simulate_step(job, use_cache=False)
    assert full.layers_traced == (6,) and scaled.layers_traced == (1, 2)
    assert scaled.peak_bytes == pytest.approx(full.peak_bytes, rel=0.01)
    assert scaled.flops_per_step == pytest.approx(full.flops_per_step, rel=1e-6)
    for part, nbytes in full.weight_bytes.items():
        assert scaled.weight_bytes[part] == pytest.approx(nbytes, rel=1e-6)


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-deepseek-v3", "tiny-glm4-moe"])
def test_scaling_with_a_dense_prefix_layer(config_path, name):
    job = FineTuneJob(
        model=config_path(name),
        method="qlora",
        compute_dtype="fp32",
        batch_size=2,
        seq_len=32,
        lora=LoraConfig(rank=8),
    )
    full = simulate_step(job, num_layers_to_trace=99, use_cache=False)
    scaled = simulate_step(job, num_layers_to_trace=3, use_cache=False)
    assert scaled.layers_traced == (2, 3)  # the dense layer plus one and two MoE layers
    assert scaled.peak_bytes == pytest.approx(full.peak_bytes, rel=0.01)
    assert scaled.flops_per_step == pytest.approx(full.flops_per_step, rel=1e-6)


def _hand_count(B, L, k, r, *, method, checkpointing):
    """Matmul FLOPs of one step of small-mixtral, written out from the config (FlopCounter conventions:
    2 FLOPs per multiply-add; attention scores over the full L x L; attention backward = 2.5 x forward)."""
    H, FF, V, NH, NKV, HD, E, N = (SMALL[x] for x in ("H", "I", "V", "NH", "NKV", "HD", "E", "N"))
    T, S = B * L, B * L * k  # tokens, routed (token, expert) pairs
    proj = 2 * T * H * (NH * HD) + 2 * 2 * T * H * (NKV * HD) + 2 * T * (NH * HD) * H  # q, k, v, o
    sdpa = 4 * B * NH * L * L * HD
    router = 2 * T * H * E
    experts = S * (2 * H * 2 * FF + 2 * FF * H)  # gate+up, down on routed tokens only
    lm_head = 2 * T * H * V
    if method == "full":
        layer_fwd = proj + sdpa + router + experts
        fwd = N * layer_fwd + lm_head
        bwd = N * (2 * (proj + router + experts) + 2.5 * sdpa) + 2 * lm_head  # input and weight gradients
        return fwd + bwd + (N * layer_fwd if checkpointing else 0)
    # QLoRA on experts (gate, up, down) and the router: frozen bases get input gradients only
    lora_pair = lambda n_in, n_out: 2 * S * r * (n_in + n_out)  # noqa: E731  x@A then @B
    lora = 2 * lora_pair(H, FF) + lora_pair(FF, H)
    merge = 2 * E * r * H  # router LoRA: W + s * B @ A
    layer_fwd = proj + sdpa + router + experts + lora + merge
    fwd = N * layer_fwd + lm_head
    later = proj + 2.5 * sdpa + 2 * router + 2 * merge + experts + 2 * lora  # layers whose input needs grad
    # layer 0 without checkpointing: its input (the frozen embedding) needs no gradient, so attention has no
    # backward at all, the router only its weight gradient, gate/up no input gradient, their LoRA no input
    # gradient (x@A: dA only). transformers' activation_checkpointing_enable() makes the embedding output require
    # grad (enable_input_require_grads), so with checkpointing layer 0 is like the others.
    first = router + 2 * merge + 2 * S * FF * H + 2 * (2 * S * H * r + 4 * S * r * FF) + 2 * lora_pair(FF, H)
    if checkpointing:
        first = later
    bwd = lm_head + first + (N - 1) * later
    return fwd + bwd + (N * layer_fwd if checkpointing else 0)


@pytest.mark.parametrize(
    ("method", "checkpointing", "k"), [("full", False, 2), ("full", True, 8), ("qlora", True, 2), ("qlora", False, 8)]
)
def test_flops_match_hand_count(config_path, method, checkpointing, k):
    B, L, r = 2, 64, 8
    job = _job(config_path, method=method, gradient_checkpointing=checkpointing, experts_per_token=k)
    sim = simulate_step(job, use_cache=False)
    expected = _hand_count(B, L, k, r, method=method, checkpointing=checkpointing)
    assert sim.total_counts.matmul_flops == pytest.approx(expected, rel=0.02)
    if checkpointing:
        assert sim.counts["recompute"].matmul_flops > 0
    else:
        assert "recompute" not in sim.counts


def test_qlora_weight_storage_parts(config_path):
    H, FF, V, NH, NKV, HD, E, N = (SMALL[x] for x in ("H", "I", "V", "NH", "NKV", "HD", "E", "N"))
    sim = simulate_step(_job(config_path, method="qlora", compute_dtype="bf16"), use_cache=False)
    w = sim.weight_bytes
    assert w["experts/weights_4bit"] == N * E * (2 * FF * H + H * FF) // 2  # 0.5 byte per weight
    assert w["attention/weights_4bit"] == N * (2 * H * NH * HD + 2 * H * NKV * HD) // 2
    blocks_per_expert = 2 * FF * H // 64 + H * FF // 64
    assert w["experts/quant_constants"] >= N * E * blocks_per_expert  # one 8-bit absmax per 64 weights + more
    assert w["embedding/frozen_weights"] == w["lm_head/loss/frozen_weights"] == V * H * 2  # bf16, unquantized
    assert w["router/frozen_weights"] == N * E * H * 2


def test_results_are_cached_in_memory_and_on_disk(config_path, isolated_cache):
    from tunecost.simulate import cache

    job = _job(config_path, method="qlora")
    first = simulate_step(job)
    files = list(isolated_cache.glob("simulate/*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["peak_bytes"] == first.peak_bytes
    assert simulate_step(job) is first  # in-process hit
    cache.clear_memory()
    again = simulate_step(job)  # from disk
    assert again == first
    other = simulate_step(job.with_(batch_size=3))
    assert other.peak_bytes > first.peak_bytes
    assert len(list(isolated_cache.glob("simulate/*.json"))) == 2


def test_variable_lengths_use_the_longest_query(config_path):
    job = _job(config_path, method="qlora", seq_len=None, lengths=(10, 50, 37, 20))
    sim = simulate_step(job, use_cache=False)
    assert sim.seq_len == 50
    assert sim.peak_bytes == simulate_step(job.with_(lengths=None, seq_len=50), use_cache=False).peak_bytes


def test_unsupported_architecture_is_named(write_file):
    path = write_file("config.json", json.dumps({"model_type": "gpt2", "vocab_size": 10, "hidden_size": 8}))
    with pytest.raises(TunecostError, match="unsupported architecture model_type='gpt2'"):
        simulate_step(FineTuneJob(model=str(path), method="qlora"), use_cache=False)


def test_unsupported_method_and_targets_are_named(config_path):
    with pytest.raises(TunecostError, match="BlackMamba full fine-tuning only.*not qlora"):
        simulate_step(FineTuneJob(model=config_path("tiny-blackmamba"), method="qlora"), use_cache=False)
    with pytest.raises(TunecostError, match="dense model"):
        simulate_step(FineTuneJob(model="llama-3.1-8b", method="lora"), use_cache=False)
    with pytest.raises(TunecostError, match="unsupported software stack"):
        simulate_step(_job(config_path).with_(stack="hf-2019"), use_cache=False)
    with pytest.raises(TunecostError, match="unsupported method"):
        FineTuneJob(model="mixtral-8x7b", method="dora")
