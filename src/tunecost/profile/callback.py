"""`TunecostCallback`: the profiler's stage / layer timings and expert loads from a user's own Trainer or TRL run.

Sources and derivations: docs/profiling.md, section `tunecost.profile.callback`.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tunecost.io import append_jsonl, atomic_write_json
from tunecost.profile.expert_load import ExpertLoad, ExpertLoadCounter
from tunecost.profile.inputs import Batch
from tunecost.profile.layers import LayerTimer, LayerTimes
from tunecost.profile.loop import forward_only
from tunecost.profile.memory import PeakMemoryMeter
from tunecost.profile.timers import StepTimes, make_clock, median_step_index
from tunecost.results.meta import run_metadata
from tunecost.results.records import record
from tunecost.results.schema import point_id, record_path


def _method_of(model: Any) -> str:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if names and all("lora_" in n for n in names):
        quantized = any(
            "4bit" in type(m).__name__.lower() or "Params4bit" in type(getattr(m, "weight", None)).__name__
            for m in model.modules()
        )
        return "qlora" if quantized else "lora"
    return "full"


class TunecostCallback(TrainerCallback):
    """Record tunecost measurements from a `transformers.Trainer` (or TRL trainer) run into `out_dir`.

    warmup_steps: steps not timed at the start. record_steps: how many steps after that are timed (hooks are off
    afterwards, so a long run pays nothing more). workload: overrides of the workload keys (model, method, dataset,
    seq_len, ...), which are otherwise read from the model and the training arguments.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        warmup_steps: int = 1,
        record_steps: int = 10,
        expert_load: bool = True,
        workload: dict[str, Any] | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.warmup_steps = warmup_steps
        self.record_steps = record_steps
        self.expert_load = expert_load
        self.workload_overrides = dict(workload or {})
        self._model: Any = None
        self._timer: LayerTimer | None = None
        self._clock: Any = None
        self._counter: ExpertLoadCounter | None = None
        self._captured: list[tuple[Any, Any]] = []
        self._capture_handle: Any = None
        self._steps: list[StepTimes] = []
        self._layers: list[LayerTimes] = []
        self._marks: dict[str, int] = {}
        self._recording = False
        self._before: ExpertLoad | None = None
        self._meter: PeakMemoryMeter | None = None
        self._keys: dict[str, Any] = {}
        self._queries_per_step = 1

    # -- lifecycle ------------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            return
        self._model = model
        device = str(args.device)
        self._clock = make_clock(device)
        config = getattr(model, "config", None)
        self._keys = {
            "model": getattr(config, "_name_or_path", "") or type(model).__name__,
            "method": _method_of(model),
            "experts_impl": getattr(model, "_tunecost_experts", {}).get("impl", "stock"),
            "experts_per_token": getattr(config, "num_experts_per_tok", None),
            "batch_size": args.per_device_train_batch_size,
            "seq_len": None,
            "dataset": None,
            "device": "cuda" if device.startswith("cuda") else "cpu",
            **self.workload_overrides,
        }
        self._queries_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            self.out_dir / "meta.json",
            run_metadata(
                device=device,
                workloads=[self._keys],
                extra={"source": "TunecostCallback", "gradient_accumulation_steps": args.gradient_accumulation_steps},
            ),
        )
        if self.expert_load:
            try:
                self._counter = ExpertLoadCounter(model, experts_per_token=self._keys["experts_per_token"]).attach()
            except Exception:
                self._counter = None
            if self._counter is not None:
                self._capture_handle = model.register_forward_pre_hook(self._capture, with_kwargs=True)
        self._meter = PeakMemoryMeter(device)
        self._meter.start()

    def _capture(self, module: Any, args: Any, kwargs: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            mask = kwargs.get("attention_mask")
            self._captured.append((ids.detach().cpu(), None if mask is None else mask.detach().cpu()))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        self._recording = self.warmup_steps <= step < self.warmup_steps + self.record_steps
        if self._recording and self._model is not None:
            self._clock.reset()
            self._timer = LayerTimer(self._model, self._clock).attach()
            self._marks = {"step_begin": self._clock.mark()}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._recording and self._timer is not None:
            self._marks["pre_optimizer"] = self._timer.mark_backward_end()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._recording and self._timer is not None:
            self._marks["optimizer"] = self._clock.mark()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 1 and self._counter is not None and self._before is None:
            self._before = self._counter.counts()  # the first step saw the original weights
            self._counter.counting = False
            if self._capture_handle is not None:
                self._capture_handle.remove()
                self._capture_handle = None
        if not (self._recording and self._timer is not None):
            return
        end = self._clock.mark()
        times = self._clock.resolve()
        timer = self._timer
        calls, loss_marks = timer.model_calls, timer.backward_starts
        layers = timer.collect(times)
        timer.detach()
        self._timer = None
        self._clock.reset()
        step = _stage_times(times, self._marks, calls, loss_marks, end)
        if step is None:
            return
        self._steps.append(step)
        self._layers.append(layers)
        append_jsonl(
            record_path(self.out_dir, "trainer_step"),
            record(
                "trainer_step",
                **self._keys,
                point_id=self._point_id,
                step=state.global_step,
                **{
                    f"{stage}_seconds": step.stage_seconds(stage)
                    for stage in ("forward", "backward", "optimizer", "step")
                },
            ),
        )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._model is None:
            return
        if self._timer is not None:
            self._timer.detach()
        peak = self._meter.stop() if self._meter is not None else None
        after = self._after_load()
        if self._counter is not None:
            self._counter.detach()
        base = {**self._keys, "point_id": self._point_id}
        if self._steps:
            mid = median_step_index(self._steps)
            chosen = self._steps[mid]
            for stage in ("forward", "backward", "optimizer", "step"):
                per_step = [s.stage_seconds(stage) for s in self._steps]
                append_jsonl(
                    record_path(self.out_dir, "stages"),
                    record(
                        "stages",
                        **base,
                        stage=stage,
                        seconds=chosen.stage_seconds(stage),
                        median_seconds=statistics.median(per_step),
                        per_step_seconds=per_step,
                        steps=len(self._steps),
                        timer=type(self._clock).__name__,
                        source="TunecostCallback",
                    ),
                )
            pass_total = {
                "forward": chosen.forward_seconds,
                "backward": chosen.backward_seconds,
                "recompute": chosen.backward_seconds,
            }
            for row in self._layers[mid].rows():
                append_jsonl(
                    record_path(self.out_dir, "layers"),
                    record("layers", **{**base, **row, "step_pass_seconds": pass_total[row["pass"]]}),
                )
            seconds = sum(s.step_seconds for s in self._steps)
            queries = self._queries_per_step * len(self._steps)
            append_jsonl(
                record_path(self.out_dir, "throughput"),
                record(
                    "throughput",
                    **base,
                    queries_per_s=queries / seconds,
                    num_queries=queries,
                    seconds=seconds,
                    steps=len(self._steps),
                ),
            )
        for phase, load in (("before", self._before), ("after", after)):
            for row in load.rows() if load is not None else []:
                append_jsonl(
                    record_path(self.out_dir, "expert_load"),
                    record("expert_load", **{**base, "phase": phase, **row}),
                )
        if peak is not None and peak.peak_bytes is not None:
            append_jsonl(
                record_path(self.out_dir, "memory"),
                record("memory", **{**base, "peak_bytes": peak.peak_bytes, "source": peak.source, **peak.detail}),
            )
        append_jsonl(
            record_path(self.out_dir, "point"),
            record("point", **base, status="done", global_step=state.global_step),
        )

    # -- helpers --------------------------------------------------------------------------------------------
    @property
    def _point_id(self) -> str:
        return point_id({**self._keys, "source": "trainer"})

    def _after_load(self) -> ExpertLoad | None:
        if self._counter is None or not self._captured:
            return None
        import torch

        device = next(self._model.parameters()).device
        self._counter.reset()
        self._counter.counting = True
        for ids, mask in self._captured:
            mask = torch.ones_like(ids) if mask is None else mask
            self._counter.set_token_mask(mask)
            forward_only(self._model, Batch(ids.to(device), mask.to(device), ids.to(device)))
        self._counter.set_token_mask(None)
        return self._counter.counts()


def _stage_times(
    times: list[float], marks: dict[str, int], calls: list[tuple[int, int]], loss_marks: list[int], end: int
) -> StepTimes | None:
    if "pre_optimizer" not in marks or "optimizer" not in marks or not calls:
        return None
    forward = sum(times[e] - times[s] for s, e in calls if e >= 0)
    backward = 0.0
    starts = [s for s, _ in calls]
    for b in loss_marks:
        following = [s for s in starts if s > b] + [marks["pre_optimizer"]]
        backward += times[min(following)] - times[b]
    return StepTimes(
        forward_seconds=forward,
        backward_seconds=backward,
        optimizer_seconds=times[marks["optimizer"]] - times[marks["pre_optimizer"]],
        step_seconds=times[end] - times[marks["step_begin"]],
    )
