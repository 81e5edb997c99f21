"""`tunecost trainability`: the paper's Fig. 3 experiment (accuracy per epoch, dense vs sparse)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.common import cli_errors, print_json, print_table, progress_callback, split_list
from tunecost.cli.options import (
    BatchSize,
    JsonOut,
    ModelName,
    Seed,
    Template,
    count_option,
    opt,
    positive_number,
)
from tunecost.errors import unknown_name_error
from tunecost.limits import MAX_EPOCHS, MAX_LEARNING_RATE, MAX_QUERIES
from tunecost.results.schema import record_path
from tunecost.workload.job import FineTuneJob

TOP_K_HELP = "Top-k values to compare, a comma list (default 2,8: sparse top-2 vs dense Mixtral)."
LR_HELP = "Learning rate (random-init tiny model: 3e-3)."


@cli_errors
def trainability_command(
    out: Annotated[Path, opt("--out", "Run folder: rows go to OUT/trainability.jsonl (resumable).")],
    model: ModelName = "tiny-mixtral",
    dataset: Annotated[str, opt("--dataset", "Training data (file or known name).")] = "synthetic-arith",
    eval_dataset: Annotated[str | None, opt("--eval-dataset", "Held-out data (default synthetic-arith-test).")] = None,
    epochs: Annotated[int, count_option("--epochs", "Epochs per routing.", MAX_EPOCHS)] = 10,
    experts_per_token: Annotated[str, opt("--experts-per-token", TOP_K_HELP)] = "2,8",
    batch_size: BatchSize = 32,
    lr: Annotated[float, opt("--lr", LR_HELP, parser=positive_number(MAX_LEARNING_RATE))] = 3e-3,
    template: Template = "mistral",
    tokenizer: Annotated[str | None, opt("--tokenizer", "Default: mistral for tiny-mixtral, else the model's.")] = None,
    num_train: Annotated[int | None, count_option("--num-train", "Train on the first N examples.", MAX_QUERIES)] = None,
    num_eval: Annotated[int, count_option("--num-eval", "Evaluate the first N held-out examples.", MAX_QUERIES)] = 100,
    vocab: Annotated[str, opt("--vocab", "tiny-mixtral: 'task' (pieces the data uses) or 'full'.")] = "task",
    seed: Seed = 0,
    save_every_epoch: Annotated[bool, opt("--save-every-epoch", "Keep a checkpoint of every epoch.")] = False,
    as_json: JsonOut = False,
) -> None:
    """Fine-tune for E epochs per routing, evaluate after each epoch, write tidy rows."""
    from transformers.utils import logging as hf_logging

    from tunecost.train.trainability import TrainabilityJob, run_trainability

    hf_logging.disable_progress_bar()  # our own bar; checkpoint writes would print theirs
    _check_dataset("--dataset", dataset)
    if eval_dataset is not None:
        _check_dataset("--eval-dataset", eval_dataset)
    ks = tuple(split_list(experts_per_token, int, "experts per token"))
    job = TrainabilityJob(
        job=FineTuneJob(model=model, method="full", batch_size=batch_size, seq_len=None, dataset=dataset),
        eval_dataset=eval_dataset,
        epochs=epochs,
        experts_per_token=ks,
        lr=lr,
        template=template,
        tokenizer=tokenizer,
        seed=seed,
        num_train=num_train,
        num_eval=num_eval,
        save_every_epoch=save_every_epoch,
        vocab=vocab,
    )
    with progress_callback("training", enabled=not as_json, counted=True) as on_progress:
        rows = run_trainability(job, out, on_progress=on_progress)
    if as_json:
        print_json(rows)
        return
    print_table(
        f"Trainability: {model} on {job.dataset}, evaluated on {job.resolved_eval_dataset}",
        ["routing", "k", "epoch", "accuracy", "train loss", "train s", "eval s"],
        [
            [
                r["routing"],
                r["experts_per_token"],
                r["epoch"],
                f"{r['accuracy']:.0%}",
                "" if r["train_loss"] is None else f"{r['train_loss']:.3f}",
                f"{r['seconds']:.1f}",
                f"{r['eval_seconds']:.1f}",
            ]
            for r in rows
        ],
        caption=f"rows: {record_path(out, 'trainability')}; tokenizer: {rows[0]['tokenizer'] if rows else '-'}",
    )


def _check_dataset(option: str, spec: str) -> None:
    """A dataset option names a file, a known dataset, a synthetic task or a hub id (org/name); else an error
    naming the unknown dataset."""
    from tunecost.workload.known_datasets import KNOWN_DATASETS, canonical_name

    if Path(spec).exists() or spec.startswith("synthetic-arith") or "/" in spec or canonical_name(spec) is not None:
        return
    raise unknown_name_error(f"dataset for {option}", spec, [*KNOWN_DATASETS, "synthetic-arith"])


def register(app: typer.Typer) -> None:
    app.command("trainability")(trainability_command)
