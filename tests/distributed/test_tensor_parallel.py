"""Tensor parallelism (DTensor's `parallelize_module`, torchtitan's Llama plan) of one rank: the fake-process-group
simulation against 2 real gloo ranks (same step, same recorder), and the collectives Megatron's layout implies
(hand counts on the tiny Llama: 2 layers, hidden 64, vocabulary 512, 2 x 64 tokens, fp32)."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_jobs import tiny_job

from tunecost.distributed.sharded_step import simulate_fsdp_rank
from tunecost.distributed.tensor_parallel import simulate_tp_rank
from tunecost.errors import TunecostError
from tunecost.workload.job import FineTuneJob, LoraConfig

NUM_LAYERS, HIDDEN, VOCAB, BATCH, SEQ = 2, 64, 512, 2, 64
HIDDEN_BYTES = BATCH * SEQ * HIDDEN * 4  # one (B, S, H) fp32 activation
LOGITS_BYTES = BATCH * SEQ * VOCAB * 4
TOKEN_BYTES = BATCH * SEQ * 4  # one fp32 per token


def _job(method: str = "full") -> FineTuneJob:
    return dataclasses.replace(tiny_job("tiny-llama-2l", method, LoraConfig(rank=8)), seq_len=SEQ)


def _signature(step):
    return [(c.op, c.phase, c.nbytes, c.dtype, c.group_size) for c in step.collectives]


@pytest.fixture(scope="module")
def simulated():
    """`simulated(sp)`: rank 0 of the job on a fake process group of 2, made once per layout."""
    runs: dict = {}

    def run(sp: bool):
        if sp not in runs:
            runs[sp] = simulate_tp_rank(_job(), tp=2, sequence_parallel=sp, granule_bytes=1)
        return runs[sp]

    return run


@pytest.fixture(scope="module")
def measured():
    """`measured(sp)`: one launch of 2 gloo ranks per layout, shared by this module's tests."""
    from tunecost.distributed.tp_measure import measure_tp_ranks

    runs: dict = {}

    def run(sp: bool):
        if sp not in runs:
            runs[sp] = measure_tp_ranks(_job(), tp=2, sequence_parallel=sp)
        return runs[sp]

    return run


LAYOUTS = pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])


@LAYOUTS
@pytest.mark.long
@pytest.mark.xdist_group("gloo-ranks")
def test_gloo_peak_within_3_percent_of_the_fake_run(simulated, measured, sp):
    sim = simulated(sp)
    ranks = measured(sp)
    assert [r.step.rank for r in ranks] == [0, 1]
    for r in ranks:
        assert abs(sim.peak_bytes - r.step.peak_bytes) <= 0.03 * r.step.peak_bytes, f"rank {r.step.rank}"
        assert r.step.static_bytes == sim.static_bytes


@LAYOUTS
@pytest.mark.long
@pytest.mark.xdist_group("gloo-ranks")
def test_gloo_collectives_equal_the_fake_run(simulated, measured, sp):
    sim = simulated(sp)
    for r in measured(sp):
        assert _signature(r.step) == _signature(sim)


@LAYOUTS
@pytest.mark.long
@pytest.mark.xdist_group("gloo-ranks")
def test_sharded_model_computes_the_unsharded_loss(measured, sp):
    """transformers' attention on local heads (it reshapes with -1 heads) and the sharded MLP give the loss of the
    same weights on one process."""
    for r in measured(sp):
        assert r.loss == pytest.approx(r.unsharded_loss, rel=1e-5)


@pytest.mark.long
@pytest.mark.xdist_group("gloo-ranks")
def test_gloo_with_activation_checkpointing():
    """Checkpointed layers re-run their forward (and its collectives) in backward: still the same bytes and calls."""
    from tunecost.distributed.tp_measure import measure_tp_ranks

    job = dataclasses.replace(_job(), gradient_checkpointing=True)
    sim = simulate_tp_rank(job, tp=2, sequence_parallel=True, granule_bytes=1)
    assert any(c.phase == "recompute" for c in sim.collectives)
    for r in measure_tp_ranks(job, tp=2, sequence_parallel=True):
        assert abs(sim.peak_bytes - r.step.peak_bytes) <= 0.03 * r.step.peak_bytes
        assert _signature(r.step) == _signature(sim)
        assert r.loss == pytest.approx(r.unsharded_loss, rel=1e-5)


def test_megatron_collectives_without_sequence_parallelism(simulated):
    """Forward: the embedding's partial sums and each layer's o_proj and down_proj outputs all-reduced, and loss
    parallelism's three all-reduces of one value per token (the logits' max, the sum of exponentials, the target's
    logit); backward: one all-reduce per attention and MLP input (q/k/v and gate/up share it) and one for the LM
    head's input. The logits stay sharded."""
    totals = simulated(False).collective_totals()
    per_pass = 1 + 2 * NUM_LAYERS
    assert totals[("all_reduce", "forward")] == (per_pass + 3, per_pass * HIDDEN_BYTES + 3 * TOKEN_BYTES)
    assert totals[("all_reduce", "backward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert set(totals) == {("all_reduce", "forward"), ("all_reduce", "backward")}


def test_megatron_collectives_with_sequence_parallelism(simulated):
    """Each activation all-reduce becomes a reduce-scatter (the embedding and row-parallel outputs) and an
    all-gather (the attention, MLP and LM head inputs) of the same size; backward swaps them. The norms' weight
    gradients are partial sums (each rank saw its part of the sequence): DTensor all-reduces one whenever an AdamW
    op reads it (lerp_ once, addcmul_ twice), 3 x 5 norms of 64 fp32."""
    totals = simulated(True).collective_totals()
    per_pass = 1 + 2 * NUM_LAYERS
    num_norms = 2 * NUM_LAYERS + 1
    assert totals[("reduce_scatter", "forward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert totals[("all_gather", "forward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert totals[("all_reduce", "forward")] == (3, 3 * TOKEN_BYTES)
    assert totals[("reduce_scatter", "backward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert totals[("all_gather", "backward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert totals[("all_reduce", "optimizer")] == (3 * num_norms, 3 * num_norms * HIDDEN * 4)
    assert len(totals) == 6
    assert all(c.group_size == 2 and c.dtype == "float32" for c in simulated(True).collectives)


def test_gathered_logits_without_loss_parallelism():
    """loss_parallel=False: the logits are all-gathered (B x S x V) and the loss runs on them whole."""
    step = simulate_tp_rank(_job(), tp=2, sequence_parallel=False, granule_bytes=1, loss_parallel=False)
    totals = step.collective_totals()
    per_pass = 1 + 2 * NUM_LAYERS
    assert totals[("all_gather", "forward")] == (1, LOGITS_BYTES)
    assert totals[("all_reduce", "forward")] == (per_pass, per_pass * HIDDEN_BYTES)


def test_parameters_and_states_split_as_the_plan_shards(simulated):
    """Sharded: every linear, the embedding and the LM head (1/2 each); replicated: the norms (3 x 64 fp32 x 2
    layers + the final norm). AdamW: two fp32 states per parameter element, split the same way."""
    unsharded = simulate_fsdp_rank(_job(), world_size=1, granule_bytes=1).static_bytes
    norms = (2 * NUM_LAYERS + 1) * HIDDEN * 4
    for sp in (False, True):
        static = simulated(sp).static_bytes
        assert static["sharded_params"] == (unsharded["sharded_params"] - norms) // 2 + norms
        assert static["optimizer_states"] == (unsharded["optimizer_states"] - 2 * norms) // 2 + 2 * norms


def test_sequence_parallelism_shrinks_the_activations(simulated):
    assert simulated(True).peak_bytes < simulated(False).peak_bytes


def _lora_job() -> FineTuneJob:
    lora = LoraConfig(rank=8, targets=("attention", "mlp"))
    return dataclasses.replace(tiny_job("tiny-llama-2l", "lora", lora, gradient_checkpointing=True), seq_len=SEQ)


def test_lora_factors_split_as_sharded_lora_layers():
    """Column-parallel (q, k, v, gate, up): B split by output rows, A whole; row-parallel (o, down): A split by input
    columns, B whole. r = 8 per layer: q 8x64 + (64x8)/2, k and v 8x64 + (32x8)/2, o (8x64)/2 + 64x8, gate and up
    8x64 + (128x8)/2, down (8x128)/2 + 64x8; AdamW keeps two fp32 states of each; the norms stay frozen (with SP
    too: SequenceParallel's new parameters would train them)."""
    per_layer = (512 + 256) + 2 * (512 + 128) + (256 + 512) + 2 * (512 + 512) + (512 + 512)
    for sp in (False, True):
        step = simulate_tp_rank(_lora_job(), tp=2, sequence_parallel=sp, granule_bytes=1)
        assert step.static_bytes["optimizer_states"] == 2 * NUM_LAYERS * per_layer * 4


@pytest.mark.long
@pytest.mark.xdist_group("gloo-ranks")
def test_gloo_lora_with_sequence_parallelism():
    """LoRA on attention and MLP, checkpointed, TP + SP: the same bytes and calls on 2 gloo ranks, and the unsharded
    loss (the measurement sets every B to a nonzero ramp first). The replicated factors' gradients (A of the 5
    column-parallel linears, B of the 2 row-parallel ones, per layer) are partial sums that the AdamW step
    all-reduces 3 times each, as the norms' under full fine-tuning; the frozen norms have none."""
    from tunecost.distributed.tp_measure import measure_tp_ranks

    job = _lora_job()
    sim = simulate_tp_rank(job, tp=2, sequence_parallel=True, granule_bytes=1)
    num_replicated_factors = 7 * NUM_LAYERS
    assert sim.collective_totals()[("all_reduce", "optimizer")][0] == 3 * num_replicated_factors
    for r in measure_tp_ranks(job, tp=2, sequence_parallel=True):
        assert abs(sim.peak_bytes - r.step.peak_bytes) <= 0.03 * r.step.peak_bytes
        assert _signature(r.step) == _signature(sim)
        assert r.loss == pytest.approx(r.unsharded_loss, rel=1e-5)


def test_qlora_is_refused_under_tp():
    with pytest.raises(TunecostError, match="--method qlora"):
        simulate_tp_rank(_job("qlora"), tp=2, sequence_parallel=False)


def test_degrees_the_model_cannot_split():
    with pytest.raises(TunecostError, match="key-value heads"):
        simulate_tp_rank(_job(), tp=4, sequence_parallel=False)  # 2 key-value heads
    with pytest.raises(TunecostError, match="sequence length"):
        simulate_tp_rank(dataclasses.replace(_job(), seq_len=63), tp=2, sequence_parallel=True)


# ---- one TP rank's step at full depth (tp_single_gpu_step) -------------------------------------------------------


def _depth_job(num_layers: int) -> FineTuneJob:
    return dataclasses.replace(tiny_job(f"tiny-llama-{num_layers}l", "full", LoraConfig(rank=8)), seq_len=SEQ)


@pytest.fixture(scope="module")
def rank_step():
    """`rank_step(num_layers, tp, sp)`: tp_single_gpu_step of the tiny Llama at that depth, made once."""
    from tunecost.distributed.tp_single_step import tp_single_gpu_step

    runs: dict = {}

    def run(num_layers: int, tp: int, sp: bool):
        key = (num_layers, tp, sp)
        if key not in runs:
            job = _depth_job(num_layers)
            runs[key] = tp_single_gpu_step(job, tp=tp, sequence_parallel=sp, granule_bytes=1, use_cache=False)
        return runs[key]

    return run


def _layer_activation_bytes(rank_step, tp: int, sp: bool) -> float:
    """Activations one decoder layer keeps for backward: the forward's end at 4 layers minus at 2, halved."""
    deep, shallow = rank_step(4, tp, sp), rank_step(2, tp, sp)
    return (deep.segments["forward:post"]["activations"] - shallow.segments["forward:post"]["activations"]) / 2


def test_rank_weights_are_one_over_tp_of_the_sharded_linears(rank_step):
    """Per layer: q, o (64 x 64), k, v (64 x 32: 2 key-value heads of 16), gate, up, down (64 x 128) split in
    two, the two norms (64 each) whole; the final norm (64) is spread over the layers. Root: the embedding and
    the LM head (512 x 64 each) split in two, the rotary buffers (inv_freq and original_inv_freq, 8 fp32 each) whole."""
    linear_bytes = (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) * 4
    norm_bytes = 2 * 64 * 4 + 64 * 4 // NUM_LAYERS
    step = rank_step(2, 2, False)
    assert step.layer_weight_bytes == linear_bytes // 2 + norm_bytes
    assert step.layer_trainable_bytes == step.layer_weight_bytes  # full fine-tuning
    assert step.root_weight_bytes == 2 * VOCAB * HIDDEN * 4 // 2 + 2 * 8 * 4
    assert step.segments["optimizer:opt"]["optimizer_states"] == 2 * step.trainable_bytes  # AdamW, fp32


@pytest.mark.long
def test_rank_activations_per_layer_shrink_with_tp_and_sp(rank_step):
    """tp=1 keeps what one GPU keeps; tp=2 less (q/k/v, attention, MLP inside the parallel region are halved);
    sequence parallelism halves, per norm, its input (the residual, B x S x H), its normalized input (B x S x H)
    and its rsqrt (B x S x 1), two norms per layer: 2 x (2 x B S H + B S) x 4 bytes / 2."""
    from tunecost.distributed.single_step import single_gpu_step

    one_gpu = (
        single_gpu_step(_depth_job(4), granule_bytes=1, use_cache=False).segments["forward:post"]["activations"]
        - single_gpu_step(_depth_job(2), granule_bytes=1, use_cache=False).segments["forward:post"]["activations"]
    ) / 2
    tp1 = _layer_activation_bytes(rank_step, 1, False)
    tp2 = _layer_activation_bytes(rank_step, 2, False)
    tp2_sp = _layer_activation_bytes(rank_step, 2, True)
    assert tp1 == one_gpu
    assert tp2 < tp1
    assert tp2 - tp2_sp == 2 * (2 * BATCH * SEQ * HIDDEN + BATCH * SEQ) * 4 / 2


def test_rank_step_scaled_from_two_depths_equals_the_full_trace(rank_step):
    """Traced at 1 and 2 layers and scaled to 4 = traced at 4 (identical layers), segment by segment."""
    from tunecost.distributed.tp_single_step import tp_single_gpu_step

    scaled = rank_step(4, 2, True)
    full = tp_single_gpu_step(
        _depth_job(4), tp=2, sequence_parallel=True, granule_bytes=1, use_cache=False, full_depth=True
    )
    assert {k: full.segments[k] for k in scaled.segments} == scaled.segments
    assert full.layer_weight_bytes == scaled.layer_weight_bytes


@pytest.mark.long
def test_llama_2_70b_rank_at_tp8_in_seconds():
    """Full width on fake tensors (1 and 2 layers traced): Llama-2-70B's config (hidden 8192, intermediate 28672,
    64 heads and 8 key-value heads of 128, vocabulary 32000), bf16, 4096 tokens. Per layer: q and o 8192 x 8192,
    k and v 8192 x 1024, gate, up and down 8192 x 28672 over 8 ranks, the two norms (8192) whole, plus 1/80 of the
    final norm; root: the embedding and LM head over 8 ranks and the rotary buffers (2 x 64 fp32)."""
    from tunecost.distributed.tp_single_step import tp_single_gpu_step

    job = FineTuneJob(model="meta-llama/Llama-2-70b-hf", method="full", batch_size=1, seq_len=4096)
    step = tp_single_gpu_step(job, tp=8, sequence_parallel=True, granule_bytes=1, use_cache=False)
    hidden, inter, kv, vocab, layers = 8192, 28672, 1024, 32000, 80
    linear_bytes = (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter) * 2
    assert step.layer_weight_bytes == linear_bytes // 8 + 2 * hidden * 2 + hidden * 2 // layers
    assert step.root_weight_bytes == 2 * vocab * hidden * 2 // 8 + 2 * 64 * 4
    # a rank's FLOPs are its local ops': the matmuls and attention split 8 ways, only the norms, rotary embedding
    # and residual adds (elementwise, under 1 % of the work) whole
    one_gpu = tp_single_gpu_step(job, tp=1, sequence_parallel=False, granule_bytes=1, use_cache=False)
    for phase in ("forward", "backward"):
        share = step.flops_by_phase[phase] / one_gpu.flops_by_phase[phase]
        assert 1 / 8 <= share <= 1.01 / 8, phase


def test_a_tied_head_shares_the_embeddings_shard(tmp_path):
    """A model whose LM head is its embedding (tie_word_embeddings, e.g. Qwen2.5-0.5B) keeps one vocabulary shard
    per rank for both: untied, the head would hold a second copy."""
    import json

    from tiny_jobs import CONFIGS

    config = json.loads((CONFIGS / "tiny-llama-2l.json").read_text())
    path = tmp_path / "tied.json"
    path.write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tied = dataclasses.replace(_job(), model=str(path))
    static = {
        name: simulate_tp_rank(job, tp=2, sequence_parallel=False, granule_bytes=1).static_bytes["sharded_params"]
        for name, job in (("tied", tied), ("untied", _job()))
    }
    head_shard = config["vocab_size"] * config["hidden_size"] * 4 // 2  # fp32
    assert static["untied"] - static["tied"] == head_shard


def test_a_fake_process_group_leaves_the_excepthook_as_it_was():
    """torch's init_process_group prefixes uncaught tracebacks with the rank and never undoes it: after many
    simulated ranks, one traceback would carry a prefix per group."""
    import sys

    from tunecost.distributed.sharded_step import fake_process_group

    before = sys.excepthook
    for _ in range(2):
        with fake_process_group(2):
            assert sys.excepthook is not before
    assert sys.excepthook is before


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_qwen3_per_head_norms_are_replicated(tmp_path, sp):
    """Qwen3's q_norm and k_norm (per head, run on the rank's own heads) are outside the Llama plan: replicated,
    so the optimizer's foreach update sees DTensors only (a mix of DTensors and tensors is an error there)."""
    import json

    from tiny_jobs import CONFIGS

    config = json.loads((CONFIGS / "tiny-llama-2l.json").read_text())
    path = tmp_path / "qwen3.json"
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    qwen3_config = {**config, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": head_dim}
    path.write_text(json.dumps(qwen3_config))
    qwen3 = dataclasses.replace(_job(), model=str(path))
    static = {
        name: simulate_tp_rank(job, tp=2, sequence_parallel=sp, granule_bytes=1).static_bytes["sharded_params"]
        for name, job in (("qwen3", qwen3), ("llama", _job()))
    }
    assert static["qwen3"] - static["llama"] == NUM_LAYERS * 2 * head_dim * 4  # both norms whole on each rank


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_nemotron_splits_as_llama_without_a_gate(tmp_path, sp):
    """Nemotron's MLP is up_proj and down_proj (squared ReLU, no gate_proj): the plan leaves the gate out; its
    LayerNorms carry a bias, whole on each rank like the norms' weights."""
    import json

    from tiny_jobs import CONFIGS

    config = json.loads((CONFIGS / "tiny-llama-2l.json").read_text())
    path = tmp_path / "nemotron.json"
    nemotron = {
        **{k: v for k, v in config.items() if k not in ("rms_norm_eps", "hidden_act")},
        "model_type": "nemotron",
        "architectures": ["NemotronForCausalLM"],
        "hidden_act": "relu2",
        "head_dim": config["hidden_size"] // config["num_attention_heads"],
    }
    path.write_text(json.dumps(nemotron))
    job = dataclasses.replace(_job(), model=str(path))
    static = {
        name: simulate_tp_rank(j, tp=2, sequence_parallel=sp, granule_bytes=1).static_bytes["sharded_params"]
        for name, j in (("nemotron", job), ("llama", _job()))
    }
    gate_shard = NUM_LAYERS * config["hidden_size"] * config["intermediate_size"] * 4 // 2
    norm_biases = (2 * NUM_LAYERS + 1) * config["hidden_size"] * 4
    assert static["llama"] - static["nemotron"] == gate_shard - norm_biases


def test_a_rank_whose_optimizer_steps_tensor_by_tensor_is_not_traced_deeper(monkeypatch):
    """DTensor runs the multi-tensor AdamW step one tensor at a time, so an optimizer op allocates for one traced
    unit alone and no deeper trace makes the step whole (`full_depth.whole_step`): the rank of the 4-layer Llama is
    traced at one and two layers only, its allocations those of the two-layer trace."""
    from tunecost.distributed import tp_single_step

    depths: list[int] = []
    trace = tp_single_step.trace_tp_step

    def counted(prepared, *args, **kwargs):
        depths.append(prepared.plan.num_layers)
        return trace(prepared, *args, **kwargs)

    monkeypatch.setattr(tp_single_step, "trace_tp_step", counted)
    step = tp_single_step.tp_single_gpu_step(_depth_job(4), tp=2, sequence_parallel=True, use_cache=False)
    assert depths == [1, 2] and step.allocations
