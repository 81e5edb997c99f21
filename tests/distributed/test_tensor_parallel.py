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


def test_megatron_collectives_without_sequence_parallelism(simulated):
    """Forward: the embedding's partial sums and each layer's o_proj and down_proj outputs all-reduced, the logits
    all-gathered (vocabulary shards); backward: one all-reduce per attention and MLP input (q/k/v and gate/up share
    it) and one for the LM head's input."""
    totals = simulated(False).collective_totals()
    per_pass = 1 + 2 * NUM_LAYERS
    assert totals[("all_reduce", "forward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert totals[("all_gather", "forward")] == (1, LOGITS_BYTES)
    assert totals[("all_reduce", "backward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert set(totals) == {("all_reduce", "forward"), ("all_gather", "forward"), ("all_reduce", "backward")}


def test_megatron_collectives_with_sequence_parallelism(simulated):
    """Each all-reduce becomes a reduce-scatter (the embedding and row-parallel outputs) and an all-gather (the
    attention, MLP and LM head inputs), each the size of the all-reduce; backward swaps them."""
    totals = simulated(True).collective_totals()
    per_pass = 1 + 2 * NUM_LAYERS
    assert totals[("reduce_scatter", "forward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert totals[("all_gather", "forward")] == (per_pass + 1, per_pass * HIDDEN_BYTES + LOGITS_BYTES)
    assert totals[("reduce_scatter", "backward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert totals[("all_gather", "backward")] == (per_pass, per_pass * HIDDEN_BYTES)
    assert all(c.group_size == 2 and c.dtype == "float32" for c in simulated(True).collectives)


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


def test_lora_is_refused_under_tp():
    with pytest.raises(TunecostError, match="--method full"):
        simulate_tp_rank(_job("lora"), tp=2, sequence_parallel=False)


def test_degrees_the_model_cannot_split():
    with pytest.raises(TunecostError, match="key-value heads"):
        simulate_tp_rank(_job(), tp=4, sequence_parallel=False)  # 2 key-value heads
    with pytest.raises(TunecostError, match="sequence length"):
        simulate_tp_rank(dataclasses.replace(_job(), seq_len=63), tp=2, sequence_parallel=True)
