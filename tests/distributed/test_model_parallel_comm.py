"""Tensor-, context- and pipeline-parallel collectives per step, against hand counts (docs/multi-gpu.md,
`tunecost.distributed.model_parallel_comm`), and the pipeline bubble (Narayanan et al. 2021, section 2.2)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunecost.distributed import comm
from tunecost.distributed.model_parallel_comm import (
    model_parallel_collectives,
    pipeline_bubble_seconds,
    point_to_point_seconds,
    ring_exposed_seconds,
    stages_share_node,
)
from tunecost.distributed.pipeline import bubble_fraction
from tunecost.errors import TunecostError
from tunecost.workload.parallel import ParallelPlan

# a toy model: 4 layers, hidden 8, 8 heads (head dim 1), 4 key-value heads, 16 tokens, bf16
MODEL = dict(hidden=8, num_layers=4, num_heads=8, num_kv_heads=4, bytes_per_element=2)


def collectives(plan: ParallelPlan, **kwargs):
    return model_parallel_collectives(plan, **{"batch": 1, "seq_len": 16, **MODEL, **kwargs})


def rows(cs, group: str):
    return sorted((c.op, c.phase, c.nbytes, c.count) for c in cs if c.group == group)


def test_tp_all_reduces_by_hand():
    # tp 2, one micro-batch, 4 layers: 2 all-reduces of b s h d = 1 x 16 x 8 x 2 = 256 bytes per layer forward
    # and 2 backward; the embedding's forward all-reduce and the LM head's input-gradient all-reduce once each;
    # loss parallel's 3 reductions of one fp32 value per token (1 x 16 x 4 bytes)
    cs = collectives(ParallelPlan(num_gpus=2, strategy="ddp", tp=2))
    assert rows(cs, "tp") == [
        ("all_reduce", "backward", 256, 1),
        ("all_reduce", "backward", 256, 8),
        ("all_reduce", "forward", 64, 3),
        ("all_reduce", "forward", 256, 1),
        ("all_reduce", "forward", 256, 8),
    ]
    assert all(c.ranks == 2 and c.intra_node for c in cs)


def test_tp_recompute_repeats_forward_in_backward():
    # Megatron re-runs the layer's 2 row-parallel all-reduces; PyTorch's non-reentrant checkpoint stops before the
    # last (nothing saved needs the MLP's output): 1 per layer, as DTensor TP's recorded step shows
    plan = ParallelPlan(num_gpus=2, strategy="ddp", tp=2)
    plain = sum(c.count for c in collectives(plan) if c.phase == "backward")
    megatron = sum(
        c.count for c in collectives(plan, recompute=True, recompute_early_stop=False) if c.phase == "backward"
    )
    torch_ckpt = sum(c.count for c in collectives(plan, recompute=True) if c.phase == "backward")
    assert megatron - plain == 2 * MODEL["num_layers"]
    assert torch_ckpt - plain == MODEL["num_layers"]
    # with SP: both all-gathers again (the gathered inputs are saved) and the attention's reduce-scatter
    sp = ParallelPlan(num_gpus=2, strategy="ddp", tp=2, sequence_parallel=True)
    extra = [(c.op, c.count) for c in collectives(sp, recompute=True) if "recomputed" in c.what]
    assert sorted(extra) == [("all_gather", 8), ("reduce_scatter", 4)]


def test_sequence_parallel_by_hand():
    cs = collectives(ParallelPlan(num_gpus=2, strategy="ddp", tp=2, sequence_parallel=True))
    layer = [(c.op, c.phase, c.count) for c in cs if c.count == 8]
    assert sorted(layer) == [
        ("all_gather", "backward", 8),
        ("all_gather", "forward", 8),
        ("reduce_scatter", "backward", 8),
        ("reduce_scatter", "forward", 8),
    ]
    regather = collectives(ParallelPlan(num_gpus=2, strategy="ddp", tp=2, sequence_parallel=True, tp_impl="megatron"))
    assert len(regather) == len(cs) + 1


def test_cp_ring_by_hand():
    # cp 2 over 16 tokens: 8 per rank; K and V block: 1 x 8 tokens x 4 kv heads x head dim 1 x 2 x 2 bytes = 128
    plan = ParallelPlan(num_gpus=2, strategy="ddp", cp=2)
    ring = rows(collectives(plan, rotate_method="alltoall"), "cp")
    assert ring == [("send", "backward", 128, 4), ("send", "backward", 128, 8), ("send", "forward", 128, 4)]
    gathered = rows(collectives(plan), "cp")  # PyTorch's default: one all-gather of every rank's block
    assert gathered[:2] == [("all_gather", "backward", 256, 4), ("all_gather", "forward", 256, 4)]


def test_pp_sends_by_hand():
    # pp 4, 8 micro-batches of b = 2: activation 2 x 16 x 8 x 2 = 512 bytes; stage 0 sends forward and receives
    # gradients; a middle stage sends and receives both ways; the last only receives activations
    plan = ParallelPlan(num_gpus=4, strategy="single", pp=4, micro_batches=8)
    first = rows(collectives(plan, batch=2, stage=0), "pp")
    assert first == [("recv", "backward", 512, 8), ("send", "forward", 512, 8)]
    assert len(rows(collectives(plan, batch=2, stage=1), "pp")) == 4
    last = rows(collectives(plan, batch=2, stage=3), "pp")
    assert last == [("recv", "forward", 512, 8), ("send", "backward", 512, 8)]


def test_pp_placement_megatron_order():
    # 16 GPUs, 8 per node, tp 2 x dp 2 x pp 4: stages are 4 ranks apart, so stages 0-1 share node 0 and 1-2 do not
    plan = ParallelPlan(num_gpus=16, gpus_per_node=8, strategy="ddp", tp=2, pp=4)
    assert stages_share_node(plan, 0, 1) and not stages_share_node(plan, 1, 2)
    sends = [c for c in collectives(plan, stage=1) if c.group == "pp"]
    assert {(c.op, c.phase, c.intra_node) for c in sends} == {
        ("send", "forward", False),
        ("recv", "forward", True),
        ("send", "backward", True),
        ("recv", "backward", False),
    }


def test_interleaved_sends_per_chunk():
    plan = ParallelPlan(
        num_gpus=4, strategy="single", pp=4, micro_batches=4, pipeline_schedule="interleaved-1f1b", virtual_stages=2
    )
    send = [c for c in collectives(plan, stage=0, num_layers=8) if c.op == "send" and c.phase == "forward"]
    assert send[0].count == 2 * 4


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 4), layers=st.sampled_from([4, 8]))
def test_no_model_parallelism_no_collectives(batch, layers):
    plan = ParallelPlan(num_gpus=4, strategy="ddp")
    assert (
        model_parallel_collectives(
            plan, batch=batch, seq_len=32, hidden=8, num_layers=layers, num_heads=4, num_kv_heads=2, bytes_per_element=2
        )
        == ()
    )


def test_a_pipeline_rank_counts_the_tp_collectives_of_its_own_layers():
    """32 layers over 4 stages: torchtitan's split deals them 8, 9, 8, 7, Megatron's (no embedding or head
    weights) 8 each; a rank's per-layer TP all-reduces follow its own layers, 2 forward and 2 backward per layer
    and micro-batch."""
    shape = dict(MODEL, num_layers=32)
    for weights, layers in (((1, 1), [8, 9, 8, 7]), ((0, 0), [8, 8, 8, 8])):
        plan = ParallelPlan(
            num_gpus=8, strategy="single", tp=2, pp=4, micro_batches=4,
            first_stage_less_layers=weights[0], last_stage_less_layers=weights[1],
        )  # fmt: skip
        for stage, n in enumerate(layers):
            cs = model_parallel_collectives(plan, batch=1, seq_len=16, stage=stage, **shape)
            per_layer = {c.what: c.count for c in cs if c.group == "tp" and "-parallel)" in c.what}
            assert per_layer == {
                "layer outputs (row-parallel)": 2 * 4 * n,
                "input gradients (column-parallel)": 2 * 4 * n,
            }


def _bus_bytes(cs) -> float:
    return sum(c.count * c.nbytes * comm.BUS_FACTORS[c.op](c.ranks) for c in cs)


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([2, 4]), batch=st.integers(1, 4), recompute=st.booleans(), pp=st.sampled_from([1, 2]))
def test_sequence_parallel_moves_what_all_reduce_moves(tp, batch, recompute, pp):
    plain = ParallelPlan(num_gpus=tp * pp, strategy="single", tp=tp, pp=pp)
    sp = ParallelPlan(num_gpus=tp * pp, strategy="single", tp=tp, pp=pp, sequence_parallel=True)
    for stage in range(pp):
        kw = dict(batch=batch, recompute=recompute, recompute_early_stop=False, stage=stage)  # Megatron's recompute
        small = ("loss parallel reductions", "norm weight gradients")  # per token or per norm, not activations
        a = [c for c in collectives(plain, **kw) if c.group == "tp" and c.what not in small]
        b = [c for c in collectives(sp, **kw) if c.group == "tp" and c.what not in small]
        assert _bus_bytes(b) == pytest.approx(_bus_bytes(a))


@settings(max_examples=30, deadline=None)
@given(cp=st.sampled_from([2, 4, 8]), tp=st.sampled_from([1, 2]), batch=st.integers(1, 3))
def test_bytes_scale_one_over_cp(cp, tp, batch):
    base = collectives(ParallelPlan(num_gpus=tp, strategy="single", tp=tp), batch=batch)
    split = collectives(ParallelPlan(num_gpus=tp * cp, strategy="single", tp=tp, cp=cp), batch=batch)
    tp_base = {(c.op, c.phase, c.what): c.nbytes for c in base}
    for c in split:
        if c.group == "tp":
            assert c.nbytes == tp_base[(c.op, c.phase, c.what)] / cp
        elif c.op == "send":  # one ring step: this rank's K and V block, 1/cp of the sequence's
            assert c.nbytes * cp == batch * 16 * (MODEL["num_kv_heads"] // tp) * 1 * 2 * 2


def test_bubble():
    assert bubble_fraction("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("gpipe", 4, 8) == bubble_fraction("1f1b", 4, 8)
    assert bubble_fraction("interleaved-1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert bubble_fraction("1f1b", 1, 8) == 0.0
    # (pp - 1) micro-batch times idle, over v
    assert pipeline_bubble_seconds(0.5, "1f1b", 4, 8) == pytest.approx(1.5)
    assert pipeline_bubble_seconds(0.5, "interleaved-1f1b", 4, 8, 2) == pytest.approx(0.75)
    with pytest.raises(TunecostError, match="schedule"):
        bubble_fraction("zb", 4, 8)


def test_times():
    assert point_to_point_seconds(1e9, 50e9, 1e-5) == pytest.approx(0.02001)
    assert comm.collective_seconds("send", 1e9, 2, 50e9) == pytest.approx(0.02)
    assert ring_exposed_seconds(2.0, 1.5, 3) == pytest.approx(1.5)
    assert ring_exposed_seconds(1.0, 1.5, 3) == 0.0


def test_bad_input():
    with pytest.raises(TunecostError, match="stage"):
        collectives(ParallelPlan(num_gpus=2, strategy="single", pp=2), stage=2)
    with pytest.raises(TunecostError, match="rotate"):
        collectives(ParallelPlan(num_gpus=2, strategy="single", cp=2), rotate_method="ring")
    with pytest.raises(TunecostError, match="--tp 8"):
        collectives(ParallelPlan(num_gpus=8, strategy="single", tp=8))


def test_gathered_logits_without_loss_parallel():
    # the LM head's vocabulary-sharded logits all-gathered once per micro-batch: 1 x 16 tokens x 32 x 2 bytes
    cs = collectives(ParallelPlan(num_gpus=2, strategy="ddp", tp=2), gathered_logits_vocab=32)
    assert [(c.op, c.phase, c.nbytes, c.count) for c in cs if "logits" in c.what] == [
        ("all_gather", "forward", 1024, 1)
    ]


def test_seconds_on_links():
    from tunecost.distributed.model_parallel_comm import collective_seconds_on_links

    links = dict(
        node_bus_bandwidth_bytes_per_s=400e9,
        node_latency_seconds=0.0,
        nic_bus_bandwidth_bytes_per_s=50e9,
        nic_latency_seconds=0.0,
        nics_per_node=8,
    )
    plan = ParallelPlan(num_gpus=16, gpus_per_node=8, strategy="ddp", tp=2, pp=4)
    by_kind = {(c.op, c.phase): c for c in collectives(plan, stage=1) if c.group == "pp"}
    across, within = by_kind["send", "forward"], by_kind["send", "backward"]
    assert collective_seconds_on_links(across, **links) == pytest.approx(across.nbytes / 50e9)  # one NIC
    assert collective_seconds_on_links(within, **links) == pytest.approx(within.nbytes / 400e9)
    assert collective_seconds_on_links(by_kind["recv", "forward"], **links) == 0.0
    tp = next(c for c in collectives(plan) if c.op == "all_reduce")
    assert collective_seconds_on_links(tp, **links) == pytest.approx(tp.nbytes * 2 * (1 / 2) / 400e9)


@pytest.mark.parametrize("sp", [False, True])
def test_derived_collectives_equal_dtensor_recorded(sp):
    """The collectives `model_parallel_collectives` counts for a tiny Llama at tp 2 are those PyTorch's DTensor TP
    issues (one rank on a fake process group, `tensor_parallel.simulate_tp_rank`): op, phase, bytes and calls."""
    from collections import Counter

    from tunecost.distributed.tensor_parallel import simulate_tp_rank
    from tunecost.workload.job import FineTuneJob

    config = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128}
    config |= {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
    path = Path(tempfile.mkdtemp()) / "tiny-llama.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    job = FineTuneJob(model=str(path), method="full", batch_size=2, seq_len=64, gradient_checkpointing=False)
    step = simulate_tp_rank(job, tp=2, sequence_parallel=sp)
    recorded = Counter((c.op, c.phase, c.nbytes) for c in step.collectives)
    plan = ParallelPlan(num_gpus=2, strategy="single", tp=2, sequence_parallel=sp)
    derived: Counter = Counter()
    shape = dict(hidden=64, num_layers=2, num_heads=4, num_kv_heads=2, bytes_per_element=2)
    for c in model_parallel_collectives(plan, batch=2, seq_len=64, **shape):
        derived[c.op, c.phase, c.nbytes] += c.count
    assert recorded == derived
