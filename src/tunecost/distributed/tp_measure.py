"""Measure the tensor-parallel step on real ranks: `tp` CPU processes (started by `distributed.launch`) on a gloo
group, each running `sharded_step.record_rank_step` on its real shard of a tiny model, as `measure` does for FSDP2.
Each rank also reports its loss and the loss of the same model unsharded (the same seed's weights): TP changes
where the arithmetic runs, not its result.

Sources and derivations: docs/multi-gpu.md, section "Tensor parallelism: one rank on a fake process group vs gloo".
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.distributed.launch import launch_local_ranks
from tunecost.distributed.measure import _init_serial_gloo, _leave_together, _release_collective
from tunecost.distributed.sharded_step import RankStep, record_rank_step
from tunecost.distributed.tensor_parallel import check_tp_supported, loss_context, prepare_tp_rank, tp_strategy
from tunecost.models.catalog import resolve_model
from tunecost.simulate.prepare import build_prepared
from tunecost.simulate.step import forward_loss, make_batch
from tunecost.workload.job import FineTuneJob


@dataclass(frozen=True, kw_only=True)
class MeasuredTpRank:
    """One real rank's recorded step, its loss on the batch, and the unsharded model's loss on it."""

    step: RankStep
    loss: float
    unsharded_loss: float


def _loss(prepared, batch: dict) -> float:
    import torch

    with torch.no_grad():
        loss = forward_loss(prepared, batch)
    full_tensor = getattr(loss, "full_tensor", None)  # a DTensor under loss parallelism
    return float(full_tensor() if full_tensor is not None else loss)


def _nonzero_lora_b(model) -> None:
    """LoRA's B factors start at zero, which would hide the LoRA update from the loss check: set every one to the
    same values in the unsharded and the TP model (a ramp, no random numbers)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.copy_(torch.linspace(-0.5, 0.5, p.numel(), dtype=p.dtype).view_as(p))


def _released_collectives():
    """A dispatch mode (below the recorder) that, after each `wait_tensor` of a functional collective, waits for
    gloo's worker thread to release the collective's buffers (`measure._release_collective`): without it, gloo
    frees them a scheduling-dependent number of ops later (docs/multi-gpu.md, FSDP2 section)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    wait_tensor = torch.ops._c10d_functional.wait_tensor.default

    class Released(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is wait_tensor:
                _release_collective(None)
            return out

    return Released()


def _tp_worker(job: FineTuneJob, sequence_parallel: bool, loss_parallel: bool) -> MeasuredTpRank:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _init_serial_gloo()
    try:
        vocab = resolve_model(job.model).vocab_size
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, None, seed=0)  # one batch per TP group
        unsharded = build_prepared(job, num_units=None, real=True, seed=0, wrap=_nonzero_lora_b)
        unsharded_loss = _loss(unsharded, batch)
        del unsharded
        prepared = prepare_tp_rank(
            job,
            sequence_parallel=sequence_parallel,
            real=True,
            seed=0,
            loss_parallel=loss_parallel,
            before_tp=_nonzero_lora_b,
        )
        strategy = tp_strategy(dist.get_world_size(), sequence_parallel, loss_parallel)
        with loss_context(loss_parallel), _released_collectives():
            loss = _loss(prepared, batch)
            step = record_rank_step(prepared, batch, strategy=strategy, granule_bytes=1, desugar_dtensor=True)
        del prepared
        _leave_together(dist)
        return MeasuredTpRank(step=step, loss=loss, unsharded_loss=unsharded_loss)
    finally:
        dist.destroy_process_group()


def measure_tp_ranks(
    job: FineTuneJob, *, tp: int = 2, sequence_parallel: bool = False, loss_parallel: bool = True
) -> list[MeasuredTpRank]:
    """Run one recorded tensor-parallel step of `job` on `tp` real gloo ranks; their measurements by rank."""
    check_tp_supported(job, tp, sequence_parallel=sequence_parallel)
    return launch_local_ranks(_tp_worker, (job, sequence_parallel, loss_parallel), nproc=tp)
