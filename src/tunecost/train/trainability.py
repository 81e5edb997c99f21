"""The trainability experiment (paper §IV-A, Fig. 3): fine-tune for E epochs, evaluate after each, dense vs sparse.

Sources and derivations: docs/trainability.md, section `tunecost.train.trainability`.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.evaluate.harness import TOKENIZER_FILE, evaluate_model, load_eval_model, pretrained_spec
from tunecost.io import append_jsonl, atomic_write_bytes, atomic_write_text, read_jsonl
from tunecost.models.anatomy import num_experts as num_experts_of
from tunecost.models.anatomy import set_top_k
from tunecost.models.build import default_tokenizer
from tunecost.models.tiny import build_tiny_mixtral
from tunecost.results.records import record
from tunecost.results.schema import record_path
from tunecost.train.finetune import OptimConfig, make_batches, make_optimizer_with_schedule, train_epoch
from tunecost.train.topk import routing_name
from tunecost.workload.datasets import load_dataset
from tunecost.workload.job import FineTuneJob
from tunecost.workload.templates import encode_queries, template_by_name
from tunecost.workload.tokenizers import subset_tokenizer, tokenizer_by_name

ProgressFn = Callable[[int, int, str], None]
STATE_FILE = "resume_state.pt"

TRAINABILITY_TINY_OVERRIDES: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)


def _default_job() -> FineTuneJob:
    """The paper's setup on the embedded task: tiny Mixtral, fully fine-tuned, 32 queries per batch."""
    return FineTuneJob(model="tiny-mixtral", method="full", dataset="synthetic-arith", seq_len=None, batch_size=32)


@dataclass(frozen=True, kw_only=True)
class TrainabilityJob:
    """One trainability experiment: the job that is fine-tuned (its model, training dataset and batch size; full
    fine-tuning; its top-k is set per run) and the experiment's own options: the top-k values compared (they share
    data, seed and hyper-parameters), epochs, learning rate and the evaluation."""

    job: FineTuneJob = field(default_factory=_default_job)  # model: "tiny-mixtral", or a local folder / hub id
    eval_dataset: str | None = None  # default: synthetic-arith-test for the embedded task (required otherwise)
    epochs: int = 10
    experts_per_token: tuple[int, ...] = (2, 8)
    lr: float = 3e-3
    template: str = "mistral"
    tokenizer: str | None = None  # default: "mistral" for tiny-mixtral, else the model's own
    seed: int = 0
    num_train: int | None = None  # first N training examples (all when None)
    num_eval: int | None = 100  # first N held-out examples
    max_new_tokens: int = 32
    eval_batch_size: int = 50
    save_every_epoch: bool = False
    vocab: str = "task"  # tiny-mixtral only: "task" (pieces the data uses) or "full" (all of the tokenizer's)
    tiny_overrides: tuple[tuple[str, Any], ...] = field(
        default_factory=lambda: tuple(sorted(TRAINABILITY_TINY_OVERRIDES.items()))
    )

    def __post_init__(self) -> None:
        if self.job.method != "full" or self.job.dataset is None:
            raise TunecostError(
                f"the trainability experiment fully fine-tunes on a dataset; got method {self.job.method} "
                f"and dataset {self.job.dataset}"
            )
        if self.epochs <= 0:
            raise TunecostError(f"epochs must be positive, got {self.epochs}")
        if not self.experts_per_token or any(k <= 0 for k in self.experts_per_token):
            raise TunecostError(f"experts per token must be positive integers, got {self.experts_per_token}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise TunecostError(f"learning rate must be positive (and finite), got {self.lr}")
        if self.vocab not in ("task", "full"):
            raise TunecostError(f"vocab must be 'task' or 'full', got {self.vocab!r}")
        if self.eval_dataset is None and not self.dataset.startswith("synthetic-arith"):
            raise TunecostError(f"pass an evaluation dataset for {self.dataset!r} (eval_dataset / --eval-dataset)")

    @property
    def model(self) -> str:
        return self.job.model

    @property
    def dataset(self) -> str:
        assert self.job.dataset is not None  # checked in __post_init__
        return self.job.dataset

    @property
    def resolved_tokenizer(self) -> str:
        if self.tokenizer or self.model == "tiny-mixtral":
            return self.tokenizer or "mistral"

        return default_tokenizer(pretrained_spec(self.model, allow_download=False))

    @property
    def resolved_eval_dataset(self) -> str:
        return self.eval_dataset or "synthetic-arith-test"

    def run_key(self, k: int) -> str:
        """A stable id of everything that determines a run's rows (so a resume never mixes two setups)."""
        options = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("job", "experts_per_token", "save_every_epoch", "eval_batch_size"):
            options.pop(name)
        keys = {"model": self.model, "dataset": self.dataset, "batch_size": self.job.batch_size, "k": k}
        blob = json.dumps({**options, **keys}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _build_model(job: TrainabilityJob, k: int, vocab_size: int) -> Any:
    import torch

    if job.model == "tiny-mixtral":
        model = build_tiny_mixtral(seed=job.seed, **{**dict(job.tiny_overrides), "vocab_size": vocab_size})
    else:
        model, _ = load_eval_model(job.model)
        model = model.float() if not torch.cuda.is_available() else model
    set_top_k(model, k)
    num_experts = num_experts_of(model)
    if k == num_experts and not torch.cuda.is_available() and hasattr(model, "set_experts_implementation"):
        # Dense routing on CPU: the per-expert loop beats grouped_mm's token sort (every token hits every expert).
        model.set_experts_implementation("eager")
    return model


def _task_tokenizer(job: TrainabilityJob, base: Any, texts: list[str]) -> Any:
    if job.model != "tiny-mixtral" or job.vocab == "full":
        return base

    return subset_tokenizer(base, texts)


def _save_final(model: Any, folder: Path, job: TrainabilityJob, tokenizer: Any) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # tunecost shows its own (rich) progress; tqdm's would interleave with it
    model.save_pretrained(str(folder))
    marker: dict[str, Any] = {"tokenizer": job.resolved_tokenizer, "template": job.template}
    if hasattr(tokenizer, "base_ids"):
        marker["subset_base_ids"] = list(tokenizer.base_ids)
    atomic_write_text(folder / TOKENIZER_FILE, json.dumps(marker) + "\n")


def _save_state(path: Path, epoch: int, run_key: str, model: Any, optimizer: Any, scheduler: Any) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save(
        {
            "epoch": epoch,
            "run_key": run_key,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        },
        buffer,
    )
    atomic_write_bytes(path, buffer.getvalue())


def _load_state(path: Path) -> dict[str, Any] | None:
    import torch

    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def run_trainability(
    job: TrainabilityJob,
    out_dir: str | os.PathLike[str],
    *,
    on_progress: ProgressFn | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume) the experiment; returns all rows of this job in ``out_dir/trainability.jsonl``."""
    import torch

    out = Path(out_dir)
    rows_path = record_path(out, "trainability")
    template, train_set, eval_set, tokenizer, encoded = _task_data(job)
    batch_size = job.job.batch_size
    steps_per_epoch = (len(encoded) + batch_size - 1) // batch_size
    device = "cuda" if torch.cuda.is_available() else "cpu"
    total_steps = len(job.experts_per_token) * job.epochs * steps_per_epoch
    done_steps = 0

    for k in job.experts_per_token:
        run_key = job.run_key(k)
        finished = {int(r["epoch"]) for r in read_jsonl(rows_path) if r.get("run_key") == run_key}
        if all(e in finished for e in range(job.epochs + 1)):
            done_steps += job.epochs * steps_per_epoch
            continue
        model = _build_model(job, k, tokenizer.vocab_size).to(device)
        set_top_k(model, k)
        num_experts = num_experts_of(model)
        routing = routing_name(k, num_experts)
        run_dir = out / f"{routing}-k{k}"
        state_path = run_dir / STATE_FILE
        optimizer, scheduler = make_optimizer_with_schedule(model, OptimConfig(lr=job.lr), job.epochs * steps_per_epoch)
        last_done = max((e for e in finished if e > 0), default=0)
        resumed = _resume(state_path, run_key, last_done, model, optimizer, scheduler)
        start_epoch = resumed + 1
        done_steps += resumed * steps_per_epoch
        base = _run_keys(job, k, num_experts, device, (train_set, eval_set, tokenizer, template))

        def on_epoch(epoch: int, train_loss: float | None, train_seconds: float, _model=model, _base=base) -> None:
            _record_epoch(
                rows_path, _base, _model, tokenizer, eval_set, template, job, epoch, train_loss, train_seconds
            )

        if 0 not in finished:
            on_epoch(0, None, 0.0)  # before fine-tuning: the near-chance starting point
        for epoch in range(start_epoch, job.epochs + 1):
            # The data order depends on the seed and epoch only: dense and sparse see the same batches.
            batches = make_batches(encoded, batch_size, tokenizer.pad_id, seed=job.seed * 1000 + epoch)
            offset = done_steps

            def step_progress(
                done: int,
                total: int,
                label: str,
                offset: int = offset,
                epoch: int = epoch,
                about: str = f"{routing} k={k}",
            ) -> None:
                if on_progress is not None:
                    on_progress(offset + done, total_steps, f"{about} epoch {epoch}/{job.epochs}")

            torch.manual_seed(job.seed * 1000 + epoch)
            start = time.perf_counter()
            loss = train_epoch(model, batches, optimizer, scheduler, on_progress=step_progress)
            seconds = time.perf_counter() - start
            done_steps += len(batches)
            if job.save_every_epoch:
                _save_final(model, run_dir / f"epoch-{epoch}", job, tokenizer)
            if epoch < job.epochs:
                _save_state(state_path, epoch, run_key, model, optimizer, scheduler)
            else:
                _save_final(model, run_dir / "final", job, tokenizer)
            if epoch not in finished:
                on_epoch(epoch, loss, seconds)
        state_path.unlink(missing_ok=True)  # the run is complete: only the final model is kept

    return [r for r in read_jsonl(rows_path) if r.get("run_key") in {job.run_key(k) for k in job.experts_per_token}]


def _task_data(job: TrainabilityJob) -> tuple:
    """(template, train set, eval set, task tokenizer, encoded training queries) of the job."""

    template = template_by_name(job.template)
    train_set = load_dataset(job.dataset).head(job.num_train)
    eval_set = load_dataset(job.resolved_eval_dataset).head(job.num_eval)
    # The task vocabulary comes from the training text and the held-out *prompts* (inputs known at test time).
    texts = [template.render_prompt(e.prompt) for e in train_set.examples + eval_set.examples]
    texts += [template.render_response(e.response) for e in train_set.examples]
    tokenizer = _task_tokenizer(job, tokenizer_by_name(job.resolved_tokenizer), texts)
    encoded = encode_queries(
        template, tokenizer, [e.prompt for e in train_set.examples], [e.response for e in train_set.examples]
    )
    return template, train_set, eval_set, tokenizer, encoded


def _resume(state_path: Path, run_key: str, last_done: int, model: Any, optimizer: Any, scheduler: Any) -> int:
    """The epoch the saved state resumes after (0: from the start). A state resumes if it is of this run and no
    newer than the rows; epochs between the state and the last row are retrained (deterministic) without being
    evaluated again."""
    state = _load_state(state_path)
    if state is not None and state.get("run_key") == run_key and 0 < int(state["epoch"]) <= last_done:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        return int(state["epoch"])
    return 0


def _run_keys(job: TrainabilityJob, k: int, num_experts: int, device: str, data: tuple) -> dict[str, Any]:
    """The columns every row of one run (one top-k) shares; `data`: (train set, eval set, tokenizer, template)."""
    train_set, eval_set, tokenizer, template = data
    keys: dict[str, Any] = {
        "model": job.model,
        "method": "full",
        "experts_per_token": k,
        "num_experts": num_experts,
        "routing": routing_name(k, num_experts),
        "batch_size": job.job.batch_size,
        "seq_len": None,
        "dataset": train_set.name,
        "eval_dataset": eval_set.name,
        "device": device,
        "tokenizer": tokenizer.name,
        "template": template.name,
        "lr": job.lr,
        "seed": job.seed,
        "num_train": len(train_set),
        "run_key": job.run_key(k),
    }
    if job.model == "tiny-mixtral":
        keys["model_overrides"] = dict(job.tiny_overrides)
    return keys


def _record_epoch(
    rows_path: Path,
    base: dict[str, Any],
    model: Any,
    tokenizer: Any,
    eval_set: Any,
    template: Any,
    job: TrainabilityJob,
    epoch: int,
    train_loss: float | None,
    train_seconds: float,
) -> None:
    """Evaluate `model` on the held-out set and append the epoch's row."""
    result = evaluate_model(
        model,
        tokenizer,
        eval_set,
        template=template,
        model_name=job.model,
        max_new_tokens=job.max_new_tokens,
        batch_size=job.eval_batch_size,
    )
    append_jsonl(
        rows_path,
        record(
            "trainability",
            **base,
            point_id=f"{base['run_key']}:epoch{epoch}",
            epoch=epoch,
            accuracy=result.accuracy,
            num_correct=result.num_correct,
            num_eval=result.num_eval,
            scorer=result.scorer,
            train_loss=train_loss,
            seconds=round(train_seconds, 3),
            eval_seconds=round(result.seconds, 3),
        ),
    )
