"""One training step of one rank under FSDP2 (PyTorch's real `fully_shard`), recorded with the step simulator's
tracker: the per-rank peak split into sharded parameters, unsharded parameters, all-gather and reduce-scatter
buffers, gradients, optimizer states, activations and temporaries, plus every collective the step issued.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.sharded_step`.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from tunecost.distributed.recorder import Collective, ShardedStepRecorder
from tunecost.errors import TunecostError
from tunecost.models.anatomy import decoder_layers
from tunecost.simulate.prepare import autocast_dtype, build_prepared
from tunecost.simulate.step import make_batch, run_step
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import check_fsdp2_method

FSDP_STRATEGIES = {"fsdp2": True, "fsdp2-shard-grad-op": False}  # strategy -> reshard_after_forward
RANK_CATEGORIES = (
    "sharded_params",
    "buffers",
    "optimizer_states",
    "inputs",
    "unsharded_params",
    "all_gather_buffers",
    "reduce_scatter_buffers",
    "gradients",
    "activations",
    "temporaries",
)


@dataclass(frozen=True, kw_only=True)
class RankStep:
    """One rank's recorded step. Bytes as the recorder counts them (rounded to `granule_bytes`)."""

    strategy: str
    world_size: int
    rank: int
    peak_bytes: int
    peak_phase: str
    breakdown_bytes: dict[str, int]  # RANK_CATEGORIES -> bytes alive at the peak
    static_bytes: dict[str, int]  # bytes alive before the step: sharded_params, buffers, optimizer_states, inputs
    collectives: tuple[Collective, ...]

    def collective_totals(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(op, phase) -> (number of calls, bytes)."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for c in self.collectives:
            n, b = out.get((c.op, c.phase), (0, 0))
            out[(c.op, c.phase)] = (n + 1, b + c.nbytes)
        return out


def check_fsdp_supported(job: FineTuneJob, strategy: str) -> None:
    if strategy not in FSDP_STRATEGIES:
        raise TunecostError(f"unknown FSDP strategy {strategy!r}; supported: {', '.join(FSDP_STRATEGIES)}")
    check_fsdp2_method(job.method)


def shard_model(model: nn.Module, mesh, *, reshard_after_forward: bool, param_dtype: torch.dtype | None = None) -> None:
    """`fully_shard` each decoder layer, then the root (torchtitan's layout); `param_dtype`: the dtype the
    gathered parameters compute in (MixedPrecisionPolicy; None: their own)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)


def prepare_fsdp_rank(job: FineTuneJob, strategy: str, *, real: bool, seed: int = 0):
    """Build `job`'s model at full depth and shard it over the default process group (which must exist)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    check_fsdp_supported(job, strategy)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    reshard, dtype = FSDP_STRATEGIES[strategy], autocast_dtype(job)  # fp32 parameters: gathered in the compute dtype
    prepared = build_prepared(
        job,
        num_units=None,
        real=real,
        seed=seed,
        wrap=lambda model: shard_model(model, mesh, reshard_after_forward=reshard, param_dtype=dtype),
    )
    prepared.autocast = None  # FSDP's mixed precision casts the gathered layers; no autocast
    return prepared


def _static_category(category: str) -> str:
    return "sharded_params" if category in ("trainable_params", "frozen_weights") else category


def record_rank_step(
    prepared, batch: dict, *, strategy: str, granule_bytes: int = 1, desugar_dtensor: bool = False
) -> RankStep:
    """Run one warm-up step (FSDP2's lazy init, lazily created buffers), then record the next one.
    `desugar_dtensor`: record ops on DTensors as the local ops they run (`ShardedStepRecorder`)."""
    import torch.distributed as dist

    world_size, rank = dist.get_world_size(), dist.get_rank()
    warm_up = ShardedStepRecorder(world_size=world_size, plan=prepared.plan, module_info=prepared.module_info)
    run_step(prepared, batch, warm_up)  # a recorder also runs ops the fake kernels lack (fp32 grouped_mm)
    warm_up.finish()
    del warm_up
    rec = ShardedStepRecorder(
        world_size=world_size,
        plan=prepared.plan,
        module_info=prepared.module_info,
        round_bytes=granule_bytes,
        desugar_dtensor=desugar_dtensor,
    )
    static: dict[str, int] = {}
    for tensor, category, group in prepared.static:
        rec.register_static(_local(tensor), _static_category(category), group)
    for tensor in batch.values():
        rec.register_static(tensor, "inputs", "other")
    for r in rec.records:
        static[r.static_category or "?"] = static.get(r.static_category or "?", 0) + r.nbytes
    rec.install_hooks(prepared.model, prepared.trainable)
    orig_set_phase = rec.set_phase

    def set_phase(phase: str) -> None:
        if phase == "optimizer":  # the reduce-scattered gradients are complete now
            rec.tag_gradients(prepared.trainable)
        orig_set_phase(phase)

    rec.set_phase = set_phase  # type: ignore[method-assign]
    try:
        run_step(prepared, batch, rec)
    finally:
        rec.finish()
    peak, phase, breakdown = _peak(rec)
    return RankStep(
        strategy=strategy,
        world_size=world_size,
        rank=rank,
        peak_bytes=peak,
        peak_phase=phase,
        breakdown_bytes=breakdown,
        static_bytes=static,
        collectives=tuple(rec.collectives),
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def _peak(rec: ShardedStepRecorder) -> tuple[int, str, dict[str, int]]:
    """Highest live total over the step, the phase it falls in, and the categories alive then."""
    records = rec.records
    num_ops = rec.t_end or 0
    big = np.iinfo(np.int64).max
    t_alloc = np.array([r.t_alloc for r in records], dtype=np.int64)
    t_free = np.array([big if r.t_free is None else r.t_free for r in records], dtype=np.int64)
    nbytes = np.array([r.nbytes for r in records], dtype=np.int64)
    alloc_at = np.bincount(t_alloc, weights=nbytes, minlength=num_ops + 2)
    freed = t_free < big
    free_at = np.bincount(t_free[freed], weights=nbytes[freed], minlength=num_ops + 2)
    live = np.cumsum(alloc_at)[: num_ops + 1] - np.concatenate(([0.0], np.cumsum(free_at)[:num_ops]))
    k = int(np.argmax(live))
    t_fwd_end = rec.t_forward_end if rec.t_forward_end is not None else num_ops
    breakdown: dict[str, int] = {}
    for i, r in enumerate(records):
        if t_alloc[i] <= k <= t_free[i]:
            cat = _category(rec, r, int(t_free[i]), t_fwd_end)
            breakdown[cat] = breakdown.get(cat, 0) + r.nbytes
    phase = "forward" if k <= t_fwd_end else "backward/optimizer"
    return int(live[k]), phase, breakdown


def _category(rec: ShardedStepRecorder, r, t_free: int, t_fwd_end: int) -> str:
    if r.static_category is not None:
        return r.static_category
    tag = rec.tags.get(id(r))
    if tag is not None:
        return tag
    if r.t_grad is not None:
        return "gradients"
    if r.phase == "forward":
        return "activations" if t_free > t_fwd_end else "temporaries"
    if r.phase == "recompute":
        return "activations"
    return "temporaries"


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """A fake process group of `world_size` ranks seen from `rank` (no communication; collectives return at
    once), as the default group for the duration of the block."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise TunecostError("a process group is already initialized in this process; cannot simulate ranks here")
    hook = sys.excepthook  # init_process_group chains a "[rank0]: " prefix onto it, and destroy does not undo it
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def simulate_fsdp_rank(
    job: FineTuneJob, *, world_size: int, strategy: str = "fsdp2", rank: int = 0, granule_bytes: int = 512
) -> RankStep:
    """Simulate one rank of `job` on `world_size` GPUs under FSDP2, on fake tensors in a fake process group."""
    if world_size < 1:
        raise TunecostError(f"number of GPUs must be at least 1, got {world_size}")
    check_fsdp_supported(job, strategy)
    with fake_process_group(world_size, rank):
        prepared = prepare_fsdp_rank(job, strategy, real=False)
        vocab = int(prepared.model.config.vocab_size)
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, prepared.fake_mode)
        return record_rank_step(prepared, batch, strategy=strategy, granule_bytes=granule_bytes)
