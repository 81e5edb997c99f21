"""One rank's needs for a job, computed once per search: the memory per layout and micro-batch (kept on disk)
and the single-GPU throughput each rank computes at."""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

from tunecost.catalog.gpus import GPU
from tunecost.distributed import model_parallel
from tunecost.distributed.rank_memory import (
    RankMemory,
    SingleGpuStep,
    partly_recomputed_rank,
    rank_memory,
    single_gpu_step,
)
from tunecost.distributed.single_step import LAYOUT_VERSION
from tunecost.errors import TunecostError
from tunecost.estimate.estimators import EstimateRequest, EstimatorOptions, sizing_seq_len
from tunecost.estimate.simulated import Throughput, throughput_at
from tunecost.io import atomic_write_json
from tunecost.limits import MAX_BATCH_SIZE
from tunecost.models.catalog import resolve_model
from tunecost.simulate.batch import search_with_margin
from tunecost.simulate.behaviour import runs_fused_adamw
from tunecost.simulate.overhead import DEFAULT_OVERHEAD
from tunecost.workload.job import FSDP_FP32_STRATEGIES, FineTuneJob
from tunecost.workload.parallel import ParallelPlan

# of the rank memories kept on disk (`RankNeeds`; their key holds the step's LAYOUT_VERSION): bump when rank_memory
# changes
RANK_MEMORY_VERSION = "7"


@lru_cache(maxsize=4096)
def _plan_key(plan: ParallelPlan) -> str:
    """A plan's key among the rank memories kept on disk."""
    return json.dumps(dataclasses.asdict(plan), sort_keys=True)


def single_gpu_throughput(
    job: FineTuneJob,
    gpu: GPU,
    steady_state: bool = False,
    framework: str | None = None,
    host_cpu: str | None = None,
) -> tuple[Throughput, str]:
    """A rank's compute: the single-GPU steady-state queries/s of the job's micro-batch, as `estimate` predicts it
    (eq. (2) where it was fitted for this model and GPU, else the cross-GPU throughput model), with the run's
    one start-up. `framework`: the one whose config describes the job (`EstimatorOptions.framework`); `host_cpu`:
    the host that runs the GPU (else its default)."""
    options = EstimatorOptions(steady_state=steady_state, framework=framework, host_cpu=host_cpu)
    tp = throughput_at(EstimateRequest(job=job, gpu=gpu, options=options), job.batch_size)
    return tp, f"{gpu.name}: per-rank compute: " + "; ".join(tp.notes)


class RankNeeds:
    """One rank's memory per (layout, micro-batch), each simulated step and rank replay computed once: the
    same for every GPU (a GPU only changes the budget). The rank memories are kept on disk beside the step they
    come from (`flush`), so a search that was run before replays nothing."""

    def __init__(
        self, job: FineTuneJob, behaviour=None, framework: str | None = None, host_cpu: str | None = None
    ) -> None:
        # memory and the traced steps at the longest batch's padded length; the compute over the job's own lengths,
        # as `estimate` prices one GPU
        self.job, self.priced = job.with_(seq_len=sizing_seq_len(job)), job
        self.behaviour, self.framework, self.host_cpu = behaviour, framework, host_cpu
        self.fused_adamw = runs_fused_adamw(job.stack, behaviour)
        self._steps: dict[int, SingleGpuStep] = {}
        self._rank_steps: dict[tuple[int, bool, str, int, int], SingleGpuStep] = {}  # (tp, sp, tp_impl, cp, batch)
        self._memory: dict[tuple[ParallelPlan, int], RankMemory] = {}
        self._compute: RankNeeds | None = None  # the job in its compute dtype: FSDP's over fp32 parameters
        self._disk: dict[int, dict[str, dict]] = {}  # batch -> plan key -> RankMemory fields
        self._dirty: set[int] = set()
        # (GPU, steady) -> (batch, a pipeline's micro-batches or None) -> the throughput and its note
        self.throughputs: dict[tuple[str, bool], dict[tuple[int, int | None], tuple[Throughput, str]]] = {}
        # some layers recomputed: the rank's memory between every layer recomputed and none (`partly_recomputed_rank`)
        self._every = self._none = None
        if job.recompute_layers is not None:
            every = job.with_(recompute_layers=None)
            self._every = RankNeeds(every, behaviour, framework, host_cpu)
            self._none = RankNeeds(every.with_(gradient_checkpointing=False), behaviour, framework, host_cpu)

    def job_at(self, batch: int) -> FineTuneJob:
        return self.job.with_(batch_size=batch)

    def throughput(
        self, batch: int, gpu: GPU, steady_state: bool, grad_accum: int | None = None
    ) -> tuple[Throughput, str]:
        """`single_gpu_throughput` of the job at micro-batch `batch`, run by the job's framework; `grad_accum`: the
        micro-batches per optimizer step in place of the job's (a pipeline's)."""
        job = self.priced.with_(batch_size=batch, grad_accum=grad_accum or self.priced.grad_accum)
        tp, note = single_gpu_throughput(job, gpu, steady_state, self.framework, self.host_cpu)
        if self.behaviour is not None and self.behaviour.activation_offload:
            note += "; activation offload: its host copies beside each rank's compute are not in the step time"
        return tp, note

    def step(self, batch: int) -> SingleGpuStep:
        if self._every is not None:  # the traced step's communication: every layer's (recompute counted)
            return self._every.step(batch)
        if batch not in self._steps:
            self._steps[batch] = single_gpu_step(self.job_at(batch), behaviour=self.behaviour)
        return self._steps[batch]

    def rank_step(self, plan: ParallelPlan, batch: int) -> SingleGpuStep:
        """The whole-model step of one TP/CP rank of `plan` (the single-GPU step without them); under FSDP over fp32
        parameters, the step in the compute dtype its gathered layers run in (no autocast)."""
        if self.job.fp32_params and plan.strategy in FSDP_FP32_STRATEGIES:
            if self._compute is None:
                self._compute = RankNeeds(self.job.with_(fp32_params=False), self.behaviour)
            return self._compute.step(batch)
        if plan.tp == 1 and plan.cp == 1:
            return self.step(batch)
        key = (plan.tp, plan.sequence_parallel, plan.tp_impl, plan.cp, batch)
        if key not in self._rank_steps:
            self._rank_steps[key] = model_parallel.rank_step(self.job_at(batch), plan, behaviour=self.behaviour)
        return self._rank_steps[key]

    def memory(self, plan: ParallelPlan, batch: int) -> RankMemory:
        if self._every is not None and self._none is not None:
            layers, num_layers = self.job.recompute_layers, resolve_model(self.job.model).num_layers
            share = self.job.recomputed_share(num_layers)
            on = self._every.memory(plan, batch)
            if share == 1.0:
                return on
            note = f"{layers} of {num_layers} layers recomputed: memory between every layer recomputed and none"
            return partly_recomputed_rank(self._none.memory(plan, batch), on, share, note)
        if (plan, batch) not in self._memory:
            saved, key = self._saved(batch), _plan_key(plan)
            if key in saved:
                memory = RankMemory(**{**saved[key], "assumptions": tuple(saved[key]["assumptions"])})
            else:
                job, step = self.job_at(batch), self.rank_step(plan, batch)
                memory = (
                    rank_memory(step, job, plan)
                    if plan.degree == 1
                    else model_parallel.model_parallel_rank_memory(step, job, plan)
                )
                saved[key] = dataclasses.asdict(memory)
                self._dirty.add(batch)
            self._memory[(plan, batch)] = memory
        return self._memory[(plan, batch)]

    def _path(self, batch: int) -> Path:
        from tunecost.simulate import cache

        job = self.job_at(batch)
        key = cache.job_key(job, None, DEFAULT_OVERHEAD, 512, self.behaviour)
        return cache.cache_dir() / f"rankmem-{RANK_MEMORY_VERSION}-{LAYOUT_VERSION}-{key}.json"

    def _saved(self, batch: int) -> dict[str, dict]:
        if batch not in self._disk:
            try:
                self._disk[batch] = json.loads(self._path(batch).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._disk[batch] = {}
        return self._disk[batch]

    def flush(self) -> None:
        """Write the rank memories computed since the last flush (a cache that cannot be written is no error)."""
        for variant in (self._every, self._none):
            if variant is not None:
                variant.flush()
        for batch in sorted(self._dirty):
            try:
                self._path(batch).parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(self._path(batch), self._disk[batch])
            except (OSError, TunecostError):
                pass
        self._dirty.clear()

    def largest_micro_batch(
        self, plan: ParallelPlan, gpu: GPU, margin_fraction: float, most: int = MAX_BATCH_SIZE
    ) -> tuple[int, int]:
        """(largest micro-batch up to `most` that fits `gpu` with the margin, largest within it without): the search
        `memory` and `estimate` run on one GPU."""
        return search_with_margin(
            lambda b: self.memory(plan, b).nvidia_smi_bytes, gpu.usable_memory_bytes, margin_fraction, max_batch=most
        )
