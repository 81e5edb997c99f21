"""Tensor parallelism of Mixtral's MoE block (`distributed.tp_experts`): every expert split on its intermediate
dimension, the router whole; the fake-process-group simulation against 2 real gloo ranks, and hand counts on the
tiny Mixtral (2 layers, hidden 64, 8 experts of intermediate 128, top-2, vocabulary 512, 2 x 64 tokens, fp32)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tunecost.distributed.megatron_sp import kept_gathered_inputs
from tunecost.distributed.tensor_parallel import simulate_tp_rank
from tunecost.distributed.tp_experts import rank_blocks_of_halves
from tunecost.errors import TunecostError
from tunecost.workload.job import FineTuneJob, LoraConfig

from .tiny_jobs import tiny_job

LAYERS, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K, VOCAB, BATCH, SEQ = 2, 64, 128, 8, 2, 512, 2, 64
TOKENS = BATCH * SEQ


def _job(method: str = "full", targets: tuple[str, ...] = ("attention",)) -> FineTuneJob:
    job = tiny_job("tiny-mixtral-2l", method, LoraConfig(rank=8, targets=targets))
    return dataclasses.replace(job, seq_len=SEQ)


def test_each_ranks_rows_are_its_gate_then_its_up():
    """gate rows 0..3 and up rows 4..7 of one expert, tp 2: rank 0 holds gate 0-1 and up 0-1, rank 1 the rest."""
    gate_up = torch.arange(8.0).view(1, 8, 1)
    ranks = rank_blocks_of_halves(gate_up, 2).flatten().tolist()
    assert ranks == [0, 1, 4, 5, 2, 3, 6, 7]


def test_experts_and_linears_split_in_half_router_and_norms_whole():
    """Per layer: attention q, o 64x64, k, v 64x32 and the experts 8 x (2 x 128 x 64 + 64 x 128) split in two; the
    router (8 x 64) and the two norms whole; the embedding and head (512 x 64) split, the final norm whole."""
    attention = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * 32
    experts = EXPERTS * 3 * INTERMEDIATE * HIDDEN
    whole = LAYERS * (EXPERTS * HIDDEN + 2 * HIDDEN) + HIDDEN
    expected = (LAYERS * (attention + experts) + 2 * VOCAB * HIDDEN) // 2 + whole
    for sp in (False, True):
        step = simulate_tp_rank(_job(), tp=2, sequence_parallel=sp, granule_bytes=1)
        assert step.static_bytes["sharded_params"] == 4 * expected


def test_block_collectives_are_a_dense_mlps_plus_the_routing_weights():
    """Forward: the embedding's and each layer's attention and MoE all-reduce of (B, S, H). Backward: each layer's
    tokens' gradient from attention and from the experts, and the routing weights' (T x top-k), all-reduced."""
    step = simulate_tp_rank(_job(), tp=2, sequence_parallel=False, granule_bytes=1)
    calls = [(c.op, c.phase, c.nbytes) for c in step.collectives]
    hidden_bytes = TOKENS * HIDDEN * 4
    assert calls.count(("all_reduce", "forward", hidden_bytes)) == 1 + 2 * LAYERS
    assert calls.count(("all_reduce", "backward", hidden_bytes)) == 2 * LAYERS + 1
    assert calls.count(("all_reduce", "backward", TOKENS * TOP_K * 4)) == LAYERS


@pytest.mark.long
@pytest.mark.xdist_group("gloo-ranks")
def test_gloo_lora_on_attention_experts_and_router_with_sequence_parallelism():
    """LoRA on every group, TP 2 + SP: the same peak and collectives on 2 gloo ranks as on the fake process group,
    and the loss of the same weights unsharded (every B set to a nonzero ramp), so the split of gate and up rows
    and of the experts' factors computes what one process does."""
    from tunecost.distributed.tp_measure import measure_tp_ranks

    job = _job("lora", ("attention", "experts", "router"))
    sim = simulate_tp_rank(job, tp=2, sequence_parallel=True, granule_bytes=1)
    for r in measure_tp_ranks(job, tp=2, sequence_parallel=True):
        assert abs(sim.peak_bytes - r.step.peak_bytes) <= 0.03 * r.step.peak_bytes
        assert [(c.op, c.phase, c.nbytes) for c in r.step.collectives] == [
            (c.op, c.phase, c.nbytes) for c in sim.collectives
        ]
        assert r.loss == pytest.approx(r.unsharded_loss, rel=1e-5)


def test_per_expert_linears_of_hf_2024_are_refused():
    with pytest.raises(TunecostError, match="hf-2024"):
        simulate_tp_rank(dataclasses.replace(_job(), stack="hf-2024"), tp=2, sequence_parallel=False)


def test_megatron_keeps_the_moe_blocks_gathered_tokens():
    """Megatron's SP re-gathers a dense MLP's input in backward, but its MoE token dispatcher keeps the gathered
    tokens: only attention's input is an excess over the shard."""
    assert kept_gathered_inputs(_job()) == ("qkv_input",)
    assert kept_gathered_inputs(_job("lora", ("attention", "experts"))) == ("qkv_input",)
