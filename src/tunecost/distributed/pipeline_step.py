"""One pipeline rank's training step under torch.distributed.pipelining (its `PipelineStage`s + a schedule:
1F1B, GPipe, interleaved 1F1B), split by hand as torchtitan's `pipeline_module_split` does, recorded with the
sharded step's recorder plus its point-to-point transfers: on fake tensors in a fake process group (simulation)
or on real gloo ranks (measurement, tiny models only).

Sources and derivations: docs/multi-gpu.md, section "Pipeline parallelism".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tunecost.distributed.pipeline import check_schedule, rank_stage_ids, stage_layer_ids
from tunecost.distributed.recorder import ShardedStepRecorder
from tunecost.distributed.sharded_step import fake_process_group
from tunecost.errors import TunecostError
from tunecost.models.anatomy import decoder_layers
from tunecost.simulate.prepare import build_prepared
from tunecost.simulate.step import make_batch
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import PIPELINE_SCHEDULES

P2P_OPS = {"send": "send", "recv_": "recv", "recv_any_source_": "recv"}  # c10d dispatcher op -> kind


@dataclass(frozen=True, kw_only=True)
class P2P:
    """One point-to-point transfer the stage issued: a send or a recv of `nbytes` with rank `peer`."""

    kind: str  # send | recv
    nbytes: int
    peer: int


@dataclass(frozen=True, kw_only=True)
class StageStep:
    """One pipeline stage's recorded step (bytes as the recorder counts them)."""

    schedule: str
    num_stages: int  # pipeline ranks (pp)
    stage: int  # this rank; it runs stages `rank_stage_ids(stage, num_stages, virtual_stages)`
    virtual_stages: int
    micro_batches: int
    peak_bytes: int
    breakdown_bytes: dict[str, int]  # category -> bytes alive at the peak
    static_bytes: dict[str, int]  # before the step: params, optimizer states, p2p_buffers, inputs
    p2p: tuple[P2P, ...]

    def p2p_totals(self) -> dict[str, tuple[int, int]]:
        """send | recv -> (number of transfers, bytes)."""
        out: dict[str, tuple[int, int]] = {}
        for p in self.p2p:
            n, b = out.get(p.kind, (0, 0))
            out[p.kind] = (n + 1, b + p.nbytes)
        return out


class CausalLMStage(nn.Module):
    """One stage of a transformers causal LM split by hand: token ids (first stage) or hidden states in, hidden
    states or logits (last stage) out. It holds only its own parts (the schedule scales their gradients)."""

    def __init__(self, *, embed: Any, layers: list[Any], rotary: Any, norm: Any, head: Any) -> None:
        super().__init__()
        self.embed, self.layers, self.rotary, self.norm, self.head = embed, nn.ModuleList(layers), rotary, norm, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x) if self.embed is not None else x
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        position_embeddings = self.rotary(hidden, position_ids=position_ids)
        for layer in self.layers:
            hidden = layer(
                hidden, attention_mask=None, position_embeddings=position_embeddings, position_ids=position_ids
            )
        if self.head is None:
            return hidden
        return self.head(self.norm(hidden))


def split_stages(
    model: Any, *, stages: list[int], num_stages: int, weights: tuple[int, int] = (1, 1)
) -> list[CausalLMStage]:
    """Keep only the parts of `stages` (of `num_stages`) in a transformers causal LM, in place, as torchtitan's
    `pipeline_module_split` does: the embedding on the first stage, the final norm and LM head on the last, the
    decoder layers dealt with those counted as `weights` layers; the stages' modules, in the order of `stages`."""
    base = model.base_model
    layers = decoder_layers(model)
    last = num_stages - 1
    parts = [
        CausalLMStage(
            embed=base.embed_tokens if s == 0 else None,
            layers=[layers[i] for i in stage_layer_ids(len(layers), num_stages, s, weights)],
            rotary=base.rotary_emb,
            norm=base.norm if s == last else None,
            head=model.lm_head if s == last else None,
        )
        for s in stages
    ]
    base.layers = nn.ModuleList(layer for part in parts for layer in part.layers)
    if 0 not in stages:
        base.embed_tokens = None
    if last not in stages:
        base.norm = None
        model.lm_head = None
    return parts


def _schedule_class(schedule: str):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    classes = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe, "interleaved-1f1b": ScheduleInterleaved1F1B}
    if schedule not in classes:
        raise TunecostError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(PIPELINE_SCHEDULES)}")
    return classes[schedule]


def build_stages(
    job: FineTuneJob, *, schedule: str, pp: int, micro_batches: int, real: bool, virtual_stages: int = 1, seed: int = 0
):
    """(prepared model of this rank's stages, schedule, the rank's `PipelineStage`s) over the default process
    group of `pp` ranks; rank r runs stages `rank_stage_ids(r, pp, virtual_stages)` of pp x virtual_stages."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    check_schedule(schedule, pp, micro_batches, virtual_stages)
    if job.batch_size % micro_batches:
        raise TunecostError(f"batch size {job.batch_size} does not split into {micro_batches} micro-batches")
    num_stages, own = pp * virtual_stages, rank_stage_ids(dist.get_rank(), pp, virtual_stages)
    held: list = []

    def wrap(model: Any) -> None:
        held.append((model.loss_function, int(model.config.vocab_size)))
        weights = job.parallel.stage_weights(len(decoder_layers(model)))
        held.append(split_stages(model, stages=own, num_stages=num_stages, weights=weights))

    prepared = build_prepared(job, num_units=None, real=real, seed=seed, wrap=wrap)
    (loss_function, vocab), parts = held
    micro = job.batch_size // micro_batches
    seq, hidden = job.worst_case_seq_len, prepared.spec.hidden_size
    dtype = next(p.dtype for p in prepared.model.parameters() if p.is_floating_point())
    with torch.device("meta"):
        hidden_meta = torch.empty(micro, seq, hidden, dtype=dtype, requires_grad=True)  # gradients flow back
        first_in = torch.empty(micro, seq, dtype=torch.long)
        last_out = torch.empty(micro, seq, vocab, dtype=dtype, requires_grad=True)
    pipe_stages = [
        PipelineStage(
            part,
            s,
            num_stages,
            torch.device("cpu"),
            input_args=first_in if s == 0 else hidden_meta,
            output_args=last_out if s == num_stages - 1 else hidden_meta,
        )
        for s, part in zip(own, parts, strict=True)
    ]

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return loss_function(logits=logits, labels=labels, vocab_size=vocab)

    cls = _schedule_class(schedule)
    sched = (
        cls(pipe_stages, micro_batches, loss_fn=loss_fn)
        if virtual_stages > 1 or schedule == "interleaved-1f1b"
        else cls(pipe_stages[0], micro_batches, loss_fn=loss_fn)
    )
    return prepared, sched, pipe_stages


class PipelineStepRecorder(ShardedStepRecorder):
    """The sharded step's recorder, also recording point-to-point sends and recvs (c10d `send` / `recv_`) and
    the op index at which each forward chunk (one micro-batch's forward) ends."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.p2p: list[P2P] = []
        self.forward_ends: list[int] = []

    def watch_stage(self, pipe_stage) -> None:
        """Set the phase around each micro-batch's forward and backward of `pipe_stage` (wrappers on the instance,
        removed by `unwatch_stage`)."""

        def wrapped(method, phase: str):
            def run(*args, **kwargs):
                self.set_phase(phase)
                try:
                    return method(*args, **kwargs)
                finally:
                    if phase == "forward":
                        self.forward_ends.append(self.t)

            return run

        pipe_stage.forward_one_chunk = wrapped(pipe_stage.forward_one_chunk, "forward")
        pipe_stage.backward_one_chunk = wrapped(pipe_stage.backward_one_chunk, "backward")

    @staticmethod
    def unwatch_stage(pipe_stage) -> None:
        for name in ("forward_one_chunk", "backward_one_chunk"):
            pipe_stage.__dict__.pop(name, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.partition("::")[2] if func._schema.name.startswith("c10d::") else ""
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if name in P2P_OPS and self.phase != "setup":
            tensors = [t for t in args[0] if isinstance(t, torch.Tensor)]
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            self.p2p.append(P2P(kind=P2P_OPS[name], nbytes=nbytes, peer=int(args[2])))
        return out


def p2p_buffers(pipe_stages) -> list[torch.Tensor]:
    """The receive buffers the stages allocated once for every micro-batch (activations in, gradients back)."""
    infos = [g for st in pipe_stages for g in (*st.args_recv_info.values(), *st.grad_recv_info.values())]
    return [i.buffer for group in infos for i in group if getattr(i, "buffer", None) is not None]


def run_schedule_step(prepared, schedule, pipe_stages, batch: dict, recorder=None) -> None:
    """One training step of this rank's stages: the schedule's forwards and backwards over the micro-batches,
    keeping only the losses (torchtitan's train step: no logits merged), then the optimizer step and zero_grad."""
    import contextlib
    import gc

    fake_ctx = prepared.fake_mode if prepared.fake_mode is not None else contextlib.nullcontext()
    rec_ctx = recorder if recorder is not None else contextlib.nullcontext()
    args = (batch["input_ids"],) if any(st.is_first for st in pipe_stages) else ()
    target = {"target": batch["labels"], "losses": []} if any(st.is_last for st in pipe_stages) else {}
    gc.disable()
    try:
        with fake_ctx, rec_ctx:
            if recorder is not None:
                recorder.set_phase("forward")
            schedule.step(*args, return_outputs=False, **target)
        with rec_ctx:
            if recorder is not None:
                recorder.set_phase("optimizer")
            prepared.optimizer.step()
            prepared.optimizer.zero_grad(set_to_none=True)
    finally:
        gc.enable()


def record_stage_step(prepared, schedule, pipe_stages, batch: dict, *, schedule_name: str, granule_bytes: int = 1):
    """Run one warm-up step (the stages' buffers, the optimizer), then record the next one: a StageStep."""
    import torch.distributed as dist

    run_schedule_step(prepared, schedule, pipe_stages, batch)
    rec = PipelineStepRecorder(
        world_size=dist.get_world_size(),
        plan=prepared.plan,
        module_info=prepared.module_info,
        round_bytes=granule_bytes,
    )
    for tensor, category, group in prepared.static:
        rec.register_static(tensor, "params" if category.endswith(("params", "weights")) else category, group)
    for tensor in p2p_buffers(pipe_stages):
        rec.register_static(tensor, "p2p_buffers", "other")
    for tensor in batch.values():
        rec.register_static(tensor, "inputs", "other")
    static: dict[str, int] = {}
    for r in rec.records:
        static[r.static_category or "?"] = static.get(r.static_category or "?", 0) + r.nbytes
    rec.install_hooks(prepared.model, prepared.trainable)
    for st in pipe_stages:
        rec.watch_stage(st)
    try:
        run_schedule_step(prepared, schedule, pipe_stages, batch, rec)
    finally:
        rec.finish()
        for st in pipe_stages:
            rec.unwatch_stage(st)
    peak, breakdown = stage_peak(rec)
    return StageStep(
        schedule=schedule_name,
        num_stages=dist.get_world_size(),
        stage=dist.get_rank(),
        virtual_stages=len(pipe_stages),
        micro_batches=schedule._n_microbatches,
        peak_bytes=peak,
        breakdown_bytes=breakdown,
        static_bytes=static,
        p2p=tuple(rec.p2p),
    )


def stage_peak(rec: PipelineStepRecorder) -> tuple[int, dict[str, int]]:
    """Highest live total over the step and the categories alive then: static ones as registered, gradients,
    activations (allocated in a micro-batch's forward and alive past its end) and temporaries (the rest)."""
    import bisect

    import numpy as np

    num_ops = rec.t_end or 0
    big = num_ops + 1
    t_alloc = np.array([r.t_alloc for r in rec.records], dtype=np.int64)
    t_free = np.array([big if r.t_free is None else r.t_free for r in rec.records], dtype=np.int64)
    nbytes = np.array([r.nbytes for r in rec.records], dtype=np.int64)
    allocated = np.cumsum(np.bincount(t_alloc, weights=nbytes, minlength=big + 1))[:big]
    freed = np.cumsum(np.bincount(t_free, weights=nbytes, minlength=big + 1))[:big]
    live = allocated - np.concatenate(([0.0], freed[:-1]))  # as `sharded_step`: op t's frees after its outputs
    k = int(np.argmax(live))
    breakdown: dict[str, int] = {}
    for r, a, f in zip(rec.records, t_alloc, t_free, strict=True):
        if not a <= k <= f:
            continue
        if r.static_category is not None:
            cat = r.static_category
        elif r.t_grad is not None or rec.tags.get(id(r)) == "gradients":
            cat = "gradients"
        elif r.phase == "forward":
            i = bisect.bisect_left(rec.forward_ends, int(a))
            end = rec.forward_ends[i] if i < len(rec.forward_ends) else num_ops
            cat = "activations" if f > end else "temporaries"
        else:
            cat = "temporaries"
        breakdown[cat] = breakdown.get(cat, 0) + r.nbytes
    return int(live[k]), breakdown


def _vote_locally(pipe_stage) -> None:
    """A fake process group delivers no data, so the stages' warm-up vote on static metadata (a send/recv chain)
    cannot run; every stage here is built with complete static metadata (`build_stages`), so each casts the same
    vote: replace the vote on this instance by its outcome."""
    from torch.distributed.pipelining._utils import InferenceMode

    def outcome(has_backward: bool = True, received_acc=None, received_result=None) -> torch.Tensor:
        if InferenceMode.needs_dynamic(pipe_stage._user_meta, True):
            raise TunecostError("pipeline simulation needs every stage's static input and output metadata")
        return torch.tensor([1], dtype=torch.int32)  # under fake tensors: a constant `.item()` can read

    pipe_stage._warmup_forward_vote = outcome
    pipe_stage._warmup_backward_result = lambda received_result=None: outcome(received_result=received_result)


def simulate_stage(
    job: FineTuneJob,
    *,
    num_stages: int,
    stage: int,
    schedule: str = "1f1b",
    micro_batches: int | None = None,
    virtual_stages: int = 1,
    granule_bytes: int = 512,
) -> StageStep:
    """Simulate pipeline rank `stage` of `num_stages` (pp) running `job`: fake tensors, a fake process group of
    `num_stages` ranks seen from rank `stage`, torch's own `PipelineStage`s and schedule."""
    m = micro_batches or num_stages
    with fake_process_group(num_stages, stage):
        prepared, sched, stages = build_stages(
            job, schedule=schedule, pp=num_stages, micro_batches=m, real=False, virtual_stages=virtual_stages
        )
        for st in stages:
            _vote_locally(st)
        vocab = int(prepared.model.config.vocab_size)
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, prepared.fake_mode)
        return record_stage_step(prepared, sched, stages, batch, schedule_name=schedule, granule_bytes=granule_bytes)


def _stage_worker(job: FineTuneJob, schedule: str, num_stages: int, micro_batches: int, virtual_stages: int):
    import torch.distributed as dist

    from tunecost.distributed.measure import _init_serial_gloo, _leave_together

    torch.set_num_threads(1)
    _init_serial_gloo()
    try:
        prepared, sched, stages = build_stages(
            job, schedule=schedule, pp=num_stages, micro_batches=micro_batches, real=True, virtual_stages=virtual_stages
        )
        vocab = int(prepared.model.config.vocab_size)
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, None, seed=0)
        step = record_stage_step(prepared, sched, stages, batch, schedule_name=schedule, granule_bytes=1)
        del prepared, sched, stages
        _leave_together(dist)
        return step
    finally:
        dist.destroy_process_group()


def measure_stages(
    job: FineTuneJob,
    *,
    num_stages: int = 2,
    schedule: str = "1f1b",
    micro_batches: int | None = None,
    virtual_stages: int = 1,
) -> list[StageStep]:
    """Run one recorded pipeline step on `num_stages` real gloo ranks; their StageSteps by rank."""
    from tunecost.distributed.launch import launch_local_ranks

    m = micro_batches or num_stages
    check_schedule(schedule, num_stages, m, virtual_stages)
    return launch_local_ranks(_stage_worker, (job, schedule, num_stages, m, virtual_stages), nproc=num_stages)
