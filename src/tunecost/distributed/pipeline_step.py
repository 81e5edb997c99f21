"""One pipeline stage's training step under torch.distributed.pipelining (`PipelineStage` + a schedule), split
by hand as torchtitan's `pipeline_module_split` does, recorded with the sharded step's recorder: on fake tensors
in a fake process group (simulation) or on real gloo ranks (measurement, tiny models only).

Sources and derivations: docs/multi-gpu.md, section "Pipeline parallelism".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tunecost.distributed.pipeline import stage_layer_ids
from tunecost.distributed.recorder import ShardedStepRecorder
from tunecost.distributed.sharded_step import _peak, fake_process_group
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
    num_stages: int
    stage: int
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


def split_stage(model: Any, *, stage: int, num_stages: int) -> None:
    """Keep only `stage`'s part of a transformers causal LM, in place (torchtitan's `pipeline_module_split`): the
    embedding on the first stage, the final norm and LM head on the last, its decoder layers in between."""
    base = model.base_model
    layers = decoder_layers(model)
    keep = stage_layer_ids(len(layers), num_stages, stage)
    base.layers = nn.ModuleList(layers[i] for i in keep)
    if stage > 0:
        base.embed_tokens = None
    if stage < num_stages - 1:
        base.norm = None
        model.lm_head = None


class CausalLMStage(nn.Module):
    """The forward of one stage of a split transformers causal LM: token ids (first stage) or hidden states in,
    hidden states or logits (last stage) out."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = self.model.base_model
        hidden = base.embed_tokens(x) if base.embed_tokens is not None else x
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        position_embeddings = base.rotary_emb(hidden, position_ids=position_ids)
        for layer in base.layers:
            hidden = layer(
                hidden, attention_mask=None, position_embeddings=position_embeddings, position_ids=position_ids
            )
        if self.model.lm_head is None:
            return hidden
        return self.model.lm_head(base.norm(hidden))


def _schedule_class(schedule: str):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    classes = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
    if schedule not in classes:
        raise TunecostError(
            f"pipeline schedule {schedule!r} is not traced per stage; traced: {', '.join(classes)} "
            f"(all known: {', '.join(PIPELINE_SCHEDULES)})"
        )
    return classes[schedule]


def build_stage(job: FineTuneJob, *, schedule: str, num_stages: int, micro_batches: int, real: bool, seed: int = 0):
    """(prepared model of this rank's stage, schedule) over the default process group, whose rank is the stage."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    if job.batch_size % micro_batches:
        raise TunecostError(f"batch size {job.batch_size} does not split into {micro_batches} micro-batches")
    stage = dist.get_rank()
    loss_holder: list = []

    def wrap(model: Any) -> None:
        loss_holder.append((model.loss_function, int(model.config.vocab_size)))
        split_stage(model, stage=stage, num_stages=num_stages)

    prepared = build_prepared(job, num_units=None, real=real, seed=seed, wrap=wrap)
    loss_function, vocab = loss_holder[0]
    micro = job.batch_size // micro_batches
    seq, hidden = job.worst_case_seq_len, prepared.spec.hidden_size
    dtype = next(p.dtype for p in prepared.model.parameters() if p.is_floating_point())
    with torch.device("meta"):
        hidden_meta = torch.empty(micro, seq, hidden, dtype=dtype, requires_grad=True)  # gradients flow back
        first_in = torch.empty(micro, seq, dtype=torch.long)
        last_out = torch.empty(micro, seq, vocab, dtype=dtype, requires_grad=True)
    stage_module = CausalLMStage(prepared.model)
    pipe_stage = PipelineStage(
        stage_module,
        stage,
        num_stages,
        torch.device("cpu"),
        input_args=first_in if stage == 0 else hidden_meta,
        output_args=last_out if stage == num_stages - 1 else hidden_meta,
    )

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return loss_function(logits=logits, labels=labels, vocab_size=vocab)

    return prepared, _schedule_class(schedule)(pipe_stage, micro_batches, loss_fn=loss_fn)


class PipelineStepRecorder(ShardedStepRecorder):
    """The sharded step's recorder, also recording point-to-point sends and recvs (c10d `send` / `recv_`)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.p2p: list[P2P] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.partition("::")[2] if func._schema.name.startswith("c10d::") else ""
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if name in P2P_OPS and self.phase != "setup":
            tensors = [t for t in args[0] if isinstance(t, torch.Tensor)]
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            self.p2p.append(P2P(kind=P2P_OPS[name], nbytes=nbytes, peer=int(args[2])))
        return out


def p2p_buffers(pipe_stage) -> list[torch.Tensor]:
    """The receive buffers the stage allocated once for every micro-batch (activations in, gradients back)."""
    infos = list(pipe_stage.args_recv_info.values()) + list(pipe_stage.grad_recv_info.values())
    return [i.buffer for group in infos for i in group if getattr(i, "buffer", None) is not None]


def run_schedule_step(prepared, schedule, batch: dict, recorder=None) -> None:
    """One training step of this rank's stage: the schedule's forwards and backwards over the micro-batches, then
    the optimizer step and zero_grad."""
    import contextlib
    import gc

    stage = schedule._stage
    fake_ctx = prepared.fake_mode if prepared.fake_mode is not None else contextlib.nullcontext()
    rec_ctx = recorder if recorder is not None else contextlib.nullcontext()
    gc.disable()
    try:
        with fake_ctx, rec_ctx:
            if recorder is not None:
                recorder.set_phase("forward")
            if stage.is_first:
                schedule.step(batch["input_ids"], return_outputs=False)
            elif stage.is_last:  # only the losses are kept (torchtitan's train step): no logits merged
                schedule.step(target=batch["labels"], losses=[], return_outputs=False)
            else:
                schedule.step(return_outputs=False)
        with rec_ctx:
            if recorder is not None:
                recorder.set_phase("optimizer")
            prepared.optimizer.step()
            prepared.optimizer.zero_grad(set_to_none=True)
    finally:
        gc.enable()


def record_stage_step(prepared, schedule, batch: dict, *, schedule_name: str, granule_bytes: int = 1) -> StageStep:
    """Run one warm-up step (the stage's buffers, the optimizer), then record the next one."""
    run_schedule_step(prepared, schedule, batch)
    stage = schedule._stage
    rec = PipelineStepRecorder(
        world_size=stage.num_stages, plan=prepared.plan, module_info=prepared.module_info, round_bytes=granule_bytes
    )
    for tensor, category, group in prepared.static:
        rec.register_static(tensor, "params" if category.endswith(("params", "weights")) else category, group)
    for tensor in p2p_buffers(stage):
        rec.register_static(tensor, "p2p_buffers", "other")
    for tensor in batch.values():
        rec.register_static(tensor, "inputs", "other")
    static: dict[str, int] = {}
    for r in rec.records:
        static[r.static_category or "?"] = static.get(r.static_category or "?", 0) + r.nbytes
    rec.install_hooks(prepared.model, prepared.trainable)
    try:
        run_schedule_step(prepared, schedule, batch, rec)
    finally:
        rec.finish()
    peak, _phase, breakdown = _peak(rec)
    return StageStep(
        schedule=schedule_name,
        num_stages=stage.num_stages,
        stage=stage.stage_index,
        micro_batches=schedule._n_microbatches,
        peak_bytes=peak,
        breakdown_bytes=breakdown,
        static_bytes=static,
        p2p=tuple(rec.p2p),
    )


def _vote_locally(pipe_stage) -> None:
    """A fake process group delivers no data, so the stages' warm-up vote on static metadata (a send/recv chain)
    cannot run; every stage here is built with complete static metadata (`build_stage`), so each casts the same
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
    granule_bytes: int = 512,
) -> StageStep:
    """Simulate `stage` of `job` split into `num_stages` stages: fake tensors, a fake process group of
    `num_stages` ranks seen from rank `stage`, torch's own `PipelineStage` and schedule."""
    m = micro_batches or num_stages
    with fake_process_group(num_stages, stage):
        prepared, sched = build_stage(job, schedule=schedule, num_stages=num_stages, micro_batches=m, real=False)
        _vote_locally(sched._stage)
        vocab = int(prepared.model.config.vocab_size)
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, prepared.fake_mode)
        return record_stage_step(prepared, sched, batch, schedule_name=schedule, granule_bytes=granule_bytes)


def _stage_worker(job: FineTuneJob, schedule: str, num_stages: int, micro_batches: int) -> StageStep:
    import torch.distributed as dist

    from tunecost.distributed.measure import _init_serial_gloo, _leave_together

    torch.set_num_threads(1)
    _init_serial_gloo()
    try:
        prepared, sched = build_stage(
            job, schedule=schedule, num_stages=num_stages, micro_batches=micro_batches, real=True
        )
        vocab = int(prepared.model.config.vocab_size)
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, None, seed=0)
        step = record_stage_step(prepared, sched, batch, schedule_name=schedule, granule_bytes=1)
        del prepared, sched
        _leave_together(dist)
        return step
    finally:
        dist.destroy_process_group()


def measure_stages(
    job: FineTuneJob, *, num_stages: int = 2, schedule: str = "1f1b", micro_batches: int | None = None
) -> list[StageStep]:
    """Run one recorded pipeline step on `num_stages` real gloo ranks (one stage each); their StageSteps."""
    from tunecost.distributed.launch import launch_local_ranks

    _schedule_class(schedule)
    return launch_local_ranks(_stage_worker, (job, schedule, num_stages, micro_batches or num_stages), nproc=num_stages)
