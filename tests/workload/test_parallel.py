"""ParallelPlan validates itself with one-line errors."""

from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.parallel import ParallelPlan, micro_batches_per_step


def test_valid_plan_counts_nodes():
    plan = ParallelPlan(num_gpus=16, gpus_per_node=8, strategy="fsdp2", expert_parallel=8)
    assert plan.num_nodes == 2
    assert not plan.intra_node
    assert ParallelPlan(num_gpus=4, gpus_per_node=8, strategy="ddp").intra_node
    assert ParallelPlan(num_gpus=4, strategy="ddp").num_nodes == 1  # no GPUs per node given: one node
    plan.check_experts(8)


def test_default_plan_is_one_gpu():
    plan = ParallelPlan()
    assert (plan.num_gpus, plan.strategy, plan.num_nodes, plan.intra_node) == (1, "single", 1, True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_gpus=12, gpus_per_node=8, strategy="fsdp2"), "whole nodes of 8"),
        (dict(num_gpus=0), "at least 1"),
        (dict(strategy="zero9"), "unknown strategy 'zero9'"),
        (dict(num_gpus=8, strategy="fsdp2", expert_parallel=3), "divide the 8 GPUs"),
        (dict(num_gpus=8), "8 GPUs needs a multi-GPU strategy"),
        (dict(gpus_per_node=0), "GPUs per node must be at least 1"),
        (dict(num_gpus=4, strategy="ddp", offload="optimizer"), "for zero1/zero2/zero3 only; not for ddp"),
        (dict(num_gpus=4, strategy="fsdp2", offload="optimizer"), "not for fsdp2"),
        (dict(num_gpus=4, strategy="ddp", offload="params"), "for zero3/fsdp1/fsdp2 only; not for ddp"),
        (dict(num_gpus=4, strategy="zero2", offload="params"), "for zero3/fsdp1/fsdp2 only; not for zero2"),
        (dict(num_gpus=4, strategy="fsdp2-shard-grad-op", offload="params"), "not for fsdp2-shard-grad-op"),
        (dict(num_gpus=4, strategy="zero3", offload="nvme"), "unknown offload 'nvme'"),
    ],
)
def test_bad_plans(kwargs, message):
    with pytest.raises(TunecostError, match=message):
        ParallelPlan(**kwargs)


def test_expert_parallel_must_divide_the_experts():
    with pytest.raises(TunecostError, match="does not divide the model's 60 experts"):
        ParallelPlan(num_gpus=8, strategy="fsdp2", expert_parallel=8).check_experts(60)


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_zero_2_and_3_do_not_run_under_a_pipeline(strategy):
    """DeepSpeed's PipelineEngine asserts a ZeRO stage below 2; zero1, FSDP and DDP take a pipeline."""
    with pytest.raises(TunecostError, match=f"{strategy} with --pp 2: DeepSpeed runs ZeRO-2 and ZeRO-3 without"):
        ParallelPlan(num_gpus=4, strategy=strategy, pp=2)
    for other in ("zero1", "fsdp2", "ddp"):
        ParallelPlan(num_gpus=4, strategy=other, pp=2)


def test_micro_batches_per_step_divide_the_global_batch_by_micro_batch_times_data_parallel():
    assert micro_batches_per_step(128, 2, 8) == 8
    with pytest.raises(ValueError, match="128 is not a multiple of micro-batch 3 x data-parallel 8"):
        micro_batches_per_step(128, 3, 8)
