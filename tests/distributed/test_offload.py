"""DeepSpeed ZeRO CPU offload: the states that leave the GPU, the host's share (hand counts on the tiny Mixtral,
full fine-tuning in fp32: AdamW keeps 8 bytes per parameter, the fp32 gradient 4), the PCIe copies of a step,
(strategies that do not offload: `test_plan.py`)."""

from __future__ import annotations

import pytest
from test_setups import links_at
from tiny_jobs import tiny_job

from tunecost.distributed.rank_memory import rank_memory, rank_segment_bytes, single_gpu_step
from tunecost.distributed.timing import phase_seconds, step_time
from tunecost.workload.job import LoraConfig
from tunecost.workload.parallel import ParallelPlan

BUSBW = 1e9  # bytes/s on every link (PCIe to the host included), no latency
N = 4


@pytest.fixture(scope="module")
def full():
    job = tiny_job("tiny-mixtral-2l", "full", LoraConfig(rank=8))
    return job, single_gpu_step(job, granule_bytes=1)


def _opt_segment(step, job, strategy: str, offload: str) -> dict[str, int]:
    plan = ParallelPlan(num_gpus=N, strategy=strategy, offload=offload)
    return rank_segment_bytes(step.segments["optimizer:opt"], "optimizer", step, job, plan)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_optimizer_offload_moves_states_and_gradients_to_the_host(full, strategy):
    job, step = full
    on_gpu, kept = _opt_segment(step, job, strategy, "optimizer"), _opt_segment(step, job, strategy, "none")
    assert "optimizer_states" in kept and "gradients" in kept
    assert not {"optimizer_states", "gradients"} & set(on_gpu)
    assert on_gpu["trainable_params"] == kept["trainable_params"]  # the 16-bit (here fp32) weights stay
    params = step.trainable_bytes // 4
    memory = rank_memory(step, job, ParallelPlan(num_gpus=N, strategy=strategy, offload="optimizer"))
    assert memory.host_bytes == -(-(params * (8 + 4)) // N)  # AdamW states + fp32 gradients, 1/N each


def test_parameter_offload_moves_the_stored_weights_too(full):
    job, step = full
    on_gpu = _opt_segment(step, job, "zero3", "params")
    assert "trainable_params" not in on_gpu and "frozen_weights" not in on_gpu
    memory = rank_memory(step, job, ParallelPlan(num_gpus=N, strategy="zero3", offload="params"))
    params = step.trainable_bytes // 4
    assert memory.host_bytes == -(-(params * 12 + step.weight_bytes) // N)
    assert memory.peak_bytes < rank_memory(step, job, ParallelPlan(num_gpus=N, strategy="zero3")).peak_bytes


def _copies(step, strategy: str, offload: str, expert_parallel: int = 1) -> dict[str, float]:
    plan = ParallelPlan(num_gpus=N, strategy=strategy, offload=offload, expert_parallel=expert_parallel)
    _timed, collectives = step_time(step, plan, links_at(BUSBW), compute_seconds=1.0)
    out: dict[str, float] = {}
    for c in collectives:
        if c.op in ("device_to_host", "host_to_device"):
            out[c.op] = out.get(c.op, 0.0) + c.count * c.nbytes
            assert c.seconds == pytest.approx(c.nbytes / BUSBW)
    return out


@pytest.mark.parametrize("expert_parallel", [1, 2])
@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_optimizer_offload_copies_the_gradient_partition_out_and_the_update_back(full, strategy, expert_parallel):
    """A rank's partition is 1/N of the trainable bytes with or without EP (1/EP of the experts, shared by N/EP)."""
    _job, step = full
    copies = _copies(step, strategy, "optimizer", expert_parallel)
    assert copies["device_to_host"] == pytest.approx(step.trainable_bytes / N)
    assert copies["host_to_device"] == pytest.approx(step.trainable_bytes / N)
    assert _copies(step, strategy, "none") == {}


def test_parameter_offload_fetches_every_shard_in_forward_and_backward(full):
    _job, step = full
    copies = _copies(step, "zero3", "params")
    assert copies["host_to_device"] == pytest.approx(2 * step.weight_bytes / N)
    assert copies["device_to_host"] == pytest.approx(step.trainable_bytes / N)


def test_the_updated_partition_is_exposed(full):
    """The copy back after the optimizer step has nothing to hide under: the exposed time grows by at least it."""
    _job, step = full
    plan = dict(num_gpus=N, strategy="zero2")
    with_offload, _ = step_time(step, ParallelPlan(**plan, offload="optimizer"), links_at(BUSBW), 1.0)
    without, _ = step_time(step, ParallelPlan(**plan), links_at(BUSBW), 1.0)
    grown = with_offload.exposed_comm_seconds - without.exposed_comm_seconds
    assert grown >= step.trainable_bytes / N / BUSBW * (1 - 1e-9)


@pytest.mark.parametrize("strategy", ["fsdp1", "fsdp2"])
def test_fsdps_cpu_offload_keeps_every_state_on_the_host_and_fetches_each_shard(full, strategy):
    """FSDP's CPU offload (FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy): parameter and gradient
    shards and the optimizer on the host, the optimizer's own states (no ZeRO fp32 master copy), the same copies
    per step as ZeRO-3's parameter offload."""
    job, step = full
    on_gpu = _opt_segment(step, job, strategy, "params")
    assert not {"trainable_params", "frozen_weights", "gradients", "optimizer_states"} & set(on_gpu)
    memory = rank_memory(step, job, ParallelPlan(num_gpus=N, strategy=strategy, offload="params"))
    params = step.trainable_bytes // 4
    optimizer = max(c.get("optimizer_states", 0) for c in step.segments.values())
    assert memory.host_bytes == -(-(optimizer + params * 4 + step.weight_bytes) // N)
    assert memory.peak_bytes < rank_memory(step, job, ParallelPlan(num_gpus=N, strategy=strategy)).peak_bytes
    assert any("FSDP CPU offload" in a for a in memory.assumptions)
    copies = _copies(step, strategy, "params")
    assert copies["host_to_device"] == pytest.approx(2 * step.weight_bytes / N)
    assert copies["device_to_host"] == pytest.approx(step.trainable_bytes / N)


@pytest.mark.parametrize(
    ("strategy", "offload", "fused", "elements"),
    [
        ("zero2", "optimizer", False, 7),
        ("zero3", "params", False, 7),
        ("fsdp2", "params", False, 20),
        ("fsdp2", "params", True, 7),
    ],
)
def test_an_offloaded_optimizer_steps_on_the_host(full, strategy, offload, fused, elements):
    """The optimizer step moves to the CPU: the rank's 1/N of the parameters x the elements AdamW reads and
    writes per parameter (DeepSpeedCPUAdam: fp32) through the host's memory, which the N ranks of the node share."""
    _job, step = full
    plan = ParallelPlan(num_gpus=N, strategy=strategy, offload=offload)
    timed, _ = step_time(step, plan, links_at(BUSBW), 1.0, fused_adamw=fused)
    forward, backward, _gpu = phase_seconds(step, 1.0)
    params = step.trainable_bytes / step.trainable_bytes_per_param
    host = params / N * elements * 4 / (BUSBW / N)  # fp32 here: 4 bytes an element
    assert timed.compute_seconds == pytest.approx(forward + backward + host)


def test_a_no_sync_micro_batch_steps_no_optimizer(full):
    _job, step = full
    plan = ParallelPlan(num_gpus=N, strategy="fsdp2", offload="params")
    timed, _ = step_time(step, plan, links_at(BUSBW), 1.0, sync_gradients=False)
    forward, backward, _ = phase_seconds(step, 1.0)
    assert timed.compute_seconds == pytest.approx(forward + backward)


def test_a_host_step_counts_once_per_accumulated_step(full):
    """A micro-step carries 1/accumulation of the host's optimizer step, as of the GPU's."""
    _job, step = full
    plan = ParallelPlan(num_gpus=N, strategy="zero2", offload="optimizer")
    once, _ = step_time(step, plan, links_at(BUSBW), 1.0, optimizer_seconds=0.1)
    fourth, _ = step_time(step, plan, links_at(BUSBW), 1.0, optimizer_seconds=0.1, accumulation=4)
    host = once.compute_seconds - 0.9
    assert fourth.compute_seconds == pytest.approx(0.9 + host / 4)


def _adamw_elements_moved(**options) -> tuple[int, int, set[str]]:
    """(elements read, elements written, names of the written arguments) per parameter of a real torch AdamW step
    on a CPU parameter, tallied op by op: distinct parameter-sized tensors read, and those an op's schema marks
    written or returns new."""
    import torch
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    n = 4096
    param = torch.nn.Parameter(torch.randn(n))
    param.grad = torch.randn(n)
    optimizer = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01, **options)
    optimizer.step()  # the states exist from here on
    tally: list = [0, 0, set()]

    def sized(xs) -> set[int]:
        return {t.data_ptr() for t in pytree.tree_leaves(xs) if isinstance(t, torch.Tensor) and t.numel() == n}

    class Tally(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            schema = func._schema
            written = [(s.name, a) for a, s in zip(args, schema.arguments) if s.alias_info and s.alias_info.is_write]
            written = [(name, a) for name, a in written if sized(a)]
            new = [
                o
                for o, r in zip(pytree.tree_leaves(out) if out is not None else [], schema.returns)
                if not r.alias_info
            ]
            tally[0] += len(sized((args, kwargs)))
            tally[1] += len(sized([a for _, a in written])) + len(sized(new))
            tally[2] |= {name for name, _ in written}
            return out

    with Tally():
        optimizer.step()
    return tally[0], tally[1], tally[2]


def test_the_elements_torch_adamw_moves_on_cpu_are_the_ones_counted():
    from tunecost.workload import offload

    reads, writes, _ = _adamw_elements_moved(foreach=False)  # what CPU tensors get unless fused=True
    assert (reads, writes) == (12, 8) and reads + writes == offload.CPU_ADAM_ELEMENTS_SINGLE_TENSOR
    reads, writes, names = _adamw_elements_moved(fused=True)
    # the schema marks the gradients mutable for unscaling by a grad scaler; without one they are only read
    assert reads == 4 and "grads" in names and reads + writes - 1 == offload.CPU_ADAM_ELEMENTS_FUSED
