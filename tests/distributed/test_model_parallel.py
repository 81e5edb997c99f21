"""A model-parallel rank as a single-GPU step: the plan's checks, the pipeline cut (the stages' states add up to
the model's, activations scale with the micro-batches in flight), memory and step time per rank."""

from __future__ import annotations

import pytest
from tiny_jobs import tiny_job

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.distributed.model_parallel import (
    data_parallel_plan,
    model_parallel_rank_memory,
    stage_steps,
)
from tunecost.distributed.model_parallel_step import model_parallel_step_time
from tunecost.distributed.rank_memory import rank_memory, single_gpu_step
from tunecost.distributed.timing import default_links
from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import LoraConfig
from tunecost.workload.parallel import ParallelPlan

STATES = ("frozen_weights", "trainable_params", "gradients", "optimizer_states")


@pytest.fixture(scope="module")
def job_step():
    job = tiny_job("tiny-llama-2l", "full", LoraConfig(rank=8))
    return job, single_gpu_step(job, granule_bytes=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_gpus=12, strategy="ddp", tp=8), r"--tp 8 x --pp 1 x --cp 1 = 8 does not divide the 12 GPUs"),
        (dict(num_gpus=8, strategy="ddp", tp=0), r"--tp: the degree must be at least 1"),
        (dict(num_gpus=2, strategy="ddp", sequence_parallel=True), r"needs --tp 2 or more"),
        (dict(num_gpus=2, strategy="ddp", pp=2, pipeline_schedule="zb"), r"unknown pipeline schedule 'zb'"),
        (dict(num_gpus=4, strategy="ddp", pp=4, micro_batches=6, pipeline_schedule="interleaved-1f1b"), r"multiple"),
        (dict(num_gpus=4, strategy="ddp", pp=2, virtual_stages=2), r"only with interleaved-1f1b"),
    ],
)
def test_a_layout_that_does_not_divide_is_one_error(kwargs, message):
    with pytest.raises(TunecostError, match=message):
        ParallelPlan(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(tp=3), r"--tp 3 does not divide the model's 64 attention heads"),
        (dict(tp=16), r"--tp 16 does not divide the model's 8 key-value heads"),
        (dict(pp=3), r"--pp 3 does not divide the model's 80 decoder layers"),
        (dict(cp=3), r"--cp 3 does not divide 4096 tokens of the job's sequence \(--seq-len\)"),
        (dict(tp=2, sequence_parallel=True), None),
    ],
)
def test_degrees_must_divide_heads_layers_and_sequence(kwargs, message):
    degree = kwargs.get("tp", 1) * kwargs.get("pp", 1) * kwargs.get("cp", 1)
    plan = ParallelPlan(num_gpus=degree, strategy="ddp", **kwargs)
    shape = dict(num_heads=64, num_kv_heads=8, num_layers=80, seq_len=4096)
    if message is None:
        plan.check_model(**shape)
        return
    with pytest.raises(TunecostError, match=message):
        plan.check_model(**shape)


def test_the_data_parallel_part_is_what_the_model_parallel_degrees_leave():
    plan = ParallelPlan(num_gpus=32, gpus_per_node=8, strategy="fsdp2", tp=4, pp=2)
    dp = data_parallel_plan(plan)
    assert (plan.dp, dp.num_gpus, dp.gpus_per_node, dp.strategy) == (4, 4, 2, "fsdp2")
    alone = data_parallel_plan(ParallelPlan(num_gpus=16, gpus_per_node=8, strategy="fsdp2", tp=8, pp=2))
    assert (alone.num_gpus, alone.strategy) == (1, "single")
    assert ParallelPlan(num_gpus=16, strategy="fsdp2", tp=8, pp=2, sequence_parallel=True).layout_name == "tp8+sp pp2"
    assert ParallelPlan(num_gpus=32, strategy="fsdp2", tp=8, pp=2).layout_name == "tp8 pp2 fsdp2"
    assert ParallelPlan(num_gpus=8, strategy="zero3").layout_name == "zero3"


def test_the_stages_hold_the_model_between_them(job_step):
    """Summed over the two stages, each state is the model's; each stage holds half the decoder layers."""
    _job, step = job_step
    stages = stage_steps(step, ParallelPlan(num_gpus=2, strategy="ddp", pp=2, micro_batches=2))
    key = "optimizer:opt"
    for category in STATES:
        whole = step.segments[key].get(category, 0)
        assert abs(sum(s.segments[key].get(category, 0) for s in stages.values()) - whole) <= 2, category
    assert all(s.num_layers == step.num_layers // 2 for s in stages.values())
    assert sum(s.weight_bytes for s in stages.values()) == pytest.approx(step.weight_bytes, abs=4)


def test_activations_scale_with_the_micro_batches_in_flight(job_step):
    _job, step = job_step

    def first(m: int):
        plan = ParallelPlan(num_gpus=2, strategy="ddp", pp=2, micro_batches=m, pipeline_schedule="gpipe")
        return stage_steps(step, plan)[0].segments["backward:stage"]

    assert first(4)["activations"] == pytest.approx(2 * first(2)["activations"], abs=2)  # GPipe holds all m
    assert first(4)["p2p_buffers"] == 2 * first(2)["p2p_buffers"]  # a receive buffer per micro-batch


def test_sequence_parallelism_sends_a_sequence_shard_between_stages(job_step):
    _job, step = job_step

    def buffers(sequence_parallel: bool) -> int:
        plan = ParallelPlan(
            num_gpus=4, strategy="ddp", tp=2, pp=2, micro_batches=4, sequence_parallel=sequence_parallel
        )
        return stage_steps(step, plan)[0].segments["backward:stage"]["p2p_buffers"]

    assert buffers(True) * 2 == buffers(False)


def test_no_model_parallelism_is_the_data_parallel_rank(job_step):
    job, step = job_step
    plan = ParallelPlan(num_gpus=4, strategy="fsdp2")
    assert model_parallel_rank_memory(step, job, plan).peak_bytes == rank_memory(step, job, plan).peak_bytes


def test_a_pipeline_rank_needs_less_than_the_whole_model_and_idles_in_the_bubble(job_step):
    job, step = job_step
    whole = rank_memory(step, job, ParallelPlan())
    plan = ParallelPlan(num_gpus=2, strategy="ddp", pp=2, micro_batches=4)
    staged = model_parallel_rank_memory(step, job, plan)
    assert staged.peak_bytes < whole.peak_bytes
    assert staged.breakdown_bytes["p2p_buffers"] == 4 * job.batch_size * job.seq_len * 64 * 4  # m x (b s h) fp32
    links = default_links(resolve_gpu_name("H100").gpu, 8)
    stage = stage_steps(step, plan)[0]
    spec = resolve_model(job.model)
    timed, collectives = model_parallel_step_time(stage, plan, links, 1.0, spec=spec)
    per_micro_batch = 1.0 / 2
    assert timed.compute_seconds == pytest.approx(4 * per_micro_batch)
    assert timed.bubble_seconds / timed.step_seconds == pytest.approx(1 / 5, rel=0.02)  # (pp-1)/(m+pp-1)
    sends = [c for c in collectives if c.op == "send"]
    assert sum(c.count for c in sends) == 4  # the first stage sends each micro-batch's activation forward once
    assert sum(c.count for c in collectives if c.op == "recv") == 4  # and receives its gradient back


def test_tp_comm_overlap_hides_the_tp_collectives_under_the_gemms(job_step):
    """--tp-comm-overlap: the TP collectives hide under the linears' GEMMs (the layers' compute beside attention);
    what exceeds them stays exposed."""
    from tunecost.distributed.model_parallel_step import attention_share, model_parallel_comm

    _, step = job_step
    spec = resolve_model(step.model)
    links = default_links(resolve_gpu_name("H100").gpu, 8)
    plain = ParallelPlan(num_gpus=2, strategy="ddp", tp=2, sequence_parallel=True)
    overlapped = ParallelPlan(num_gpus=2, strategy="ddp", tp=2, sequence_parallel=True, tp_comm_overlap=True)
    collectives, exposed = model_parallel_comm(step, plain, links, spec, layer_seconds=1e-9)
    tp_seconds = sum(c.count * c.seconds for c in collectives)
    assert exposed == pytest.approx(tp_seconds) and tp_seconds > 0
    assert model_parallel_comm(step, overlapped, links, spec, layer_seconds=1.0)[1] == 0.0
    layer_seconds = 1e-6
    gemm = step.num_layers * layer_seconds * (1 - attention_share(step.seq_len, spec.hidden_size))
    _, partly = model_parallel_comm(step, overlapped, links, spec, layer_seconds=layer_seconds)
    assert partly == pytest.approx(max(0.0, tp_seconds - gemm))


def test_tp_comm_overlap_needs_tensor_parallelism():
    with pytest.raises(TunecostError, match="--tp-comm-overlap .* needs --tp 2 or more"):
        ParallelPlan(num_gpus=2, strategy="ddp", tp_comm_overlap=True)


@pytest.mark.parametrize("seq_len", [4096, 32768])
def test_the_search_adds_context_parallelism_for_long_sequences(seq_len: int) -> None:
    from tunecost.distributed.layouts import CP_SEARCH_MIN_SEQ_LEN, model_parallel_choices
    from tunecost.workload.job import FineTuneJob

    spec = resolve_model("meta-llama/Llama-3.1-8B")
    job = FineTuneJob(model="meta-llama/Llama-3.1-8B", method="full", seq_len=seq_len)
    choices = model_parallel_choices(spec, job, given=None, searching=True, gpus_per_node=8)
    with_cp = [c for c in choices if c.cp > 1]
    if seq_len < CP_SEARCH_MIN_SEQ_LEN:
        assert not with_cp
    else:  # CP beside the widest TP within the node, each dividing the sequence with it, across nodes too
        assert {c.cp for c in with_cp} == {2, 4, 8, 16, 32}
        assert all(c.tp == 8 and c.pp == 1 and c.sequence_parallel and not seq_len % (c.cp * c.tp) for c in with_cp)
    assert all(c.cp == 1 for c in choices[: len(choices) - len(with_cp)])
    lora, qlora = job.with_(method="lora"), job.with_(method="qlora")
    assert [c.degree for c in model_parallel_choices(spec, lora, given=None, searching=True, gpus_per_node=8)] == [1]
    # asked again when no data-parallel layout holds the job: LoRA's frozen weights shard as a full fine-tune's do
    assert model_parallel_choices(spec, lora, given=None, searching=True, gpus_per_node=8, lora=True) == choices
    kw = dict(given=None, searching=True, gpus_per_node=8, lora=True)
    assert [c.degree for c in model_parallel_choices(spec, qlora, **kw)] == [1]  # 4-bit weights are not sharded


def test_liger_kernels_leave_tensor_parallelism_out_of_the_search_and_a_given_tp_is_an_error() -> None:
    """Liger's kernels take local tensors, not the TP plan's DTensors (tracing them under TP fails): the search
    keeps PP and CP, and --tp with --liger-kernel is one error naming both."""
    from tunecost.distributed.layouts import check_model_parallel, model_parallel_choices
    from tunecost.errors import TunecostError
    from tunecost.workload.job import FineTuneJob
    from tunecost.workload.parallel import ModelParallel

    spec = resolve_model("meta-llama/Llama-3.1-8B")
    job = FineTuneJob(model="meta-llama/Llama-3.1-8B", method="full", seq_len=32768, liger_kernel=True)
    choices = model_parallel_choices(spec, job, given=None, searching=True, gpus_per_node=8)
    assert {c.tp for c in choices} == {1} and {c.pp for c in choices} > {1} and {c.cp for c in choices} > {1}
    counts = {"H100-80GB-SXM": [8]}
    check_model_parallel(spec, 32768, ModelParallel(pp=2), counts, liger=True)
    with pytest.raises(TunecostError, match=r"^--tp 2 with Liger's kernels is not modelled"):
        check_model_parallel(spec, 32768, ModelParallel(tp=2), counts, liger=True)


def test_the_search_leaves_out_zero_2_and_3_under_a_pipeline():
    from tunecost.distributed.layouts import layout_plans
    from tunecost.workload.parallel import MULTI_GPU_STRATEGIES, ModelParallel

    layouts = [ModelParallel(), ModelParallel(pp=2), ModelParallel(tp=2, pp=2)]
    plans = layout_plans(
        8, MULTI_GPU_STRATEGIES, gpus_per_node=8, expert_degree=1, offload="none", model_parallel=layouts
    )
    piped = {p.strategy for p in plans if p.pp > 1}
    assert piped and not piped & {"zero2", "zero3"} and "zero1" in piped
    assert {"zero2", "zero3"} <= {p.strategy for p in plans if p.pp == 1}


def test_the_bubble_holds_forward_and_backward_only(job_step):
    """The optimizer steps once after the pipeline drains: the bubble is (pp-1) micro-batches of forward and
    backward, whatever the micro-batch count, and never above (pp-1)/(m+pp-1) of the step."""
    job, step = job_step
    links = default_links(resolve_gpu_name("H100").gpu, 8)
    spec = resolve_model(job.model)
    for m in (4, 8):
        plan = ParallelPlan(num_gpus=2, strategy="ddp", pp=2, micro_batches=m)
        stage = stage_steps(step, plan)[0]
        optimizer = 0.3  # a single-GPU step of 1 s at accumulation m: 0.3 s of optimizer, 0.7 s of m micro-batches
        whole = (0.7 + optimizer) / m
        timed, _ = model_parallel_step_time(stage, plan, links, whole, spec=spec, optimizer_fraction=optimizer)
        assert timed.bubble_seconds == pytest.approx(0.7 / m / 2, rel=0.01)  # a micro-batch's, on its stage
        assert timed.bubble_seconds / timed.step_seconds <= 1 / (m + 1)


def test_the_search_tries_pipelines_whose_stages_do_not_divide_the_layers() -> None:
    """Llama-3.1-405B's 126 layers over 4 or 8 stages are dealt as torchtitan deals them (and timed at the slowest
    rank's pace), so the search weighs them beside the stages that divide the layers."""
    from tunecost.distributed.layouts import model_parallel_choices
    from tunecost.workload.job import FineTuneJob

    spec = resolve_model("meta-llama/Llama-3.1-405B")
    job = FineTuneJob(model="meta-llama/Llama-3.1-405B", method="full", seq_len=4096)
    choices = model_parallel_choices(spec, job, given=None, searching=True, gpus_per_node=8)
    assert spec.num_layers == 126 and {c.pp for c in choices} == {1, 2, 4, 8}


def test_a_pipeline_step_exposes_its_slowest_ranks_communication(job_step):
    """The pipeline moves at its slowest rank's pace, compute and communication: two stages of one layer each tie
    (the first rank's sends), an LM head worth 5 layers makes the last rank the slowest (its receives)."""
    job, step = job_step
    plan = ParallelPlan(num_gpus=2, strategy="ddp", pp=2, micro_batches=4)
    stage, spec = stage_steps(step, plan)[0], resolve_model(job.model)
    links = default_links(resolve_gpu_name("H100").gpu, 8)

    def forward_pp(head: float) -> set[str]:
        _, collectives = model_parallel_step_time(stage, plan, links, 1.0, spec=spec, head_layers=head)
        return {c.op for c in collectives if c.what.startswith("PP") and c.phase == "forward"}

    assert forward_pp(0.0) == {"send"} and forward_pp(5.0) == {"recv"}
