"""`tunecost trainability`: the paper's Fig. 3 experiment (accuracy per epoch, dense vs sparse)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tunecost.cli.common import call_with_options, cli_errors, print_json, print_table, progress_callback, split_list
from tunecost.cli.options import (
    BatchSize,
    JsonOut,
    ModelName,
    Seed,
    Template,
    positive_number,
    whole_number,
)
from tunecost.limits import MAX_EPOCHS, MAX_LEARNING_RATE, MAX_QUERIES


def _examples(option: str, help: str) -> Any:
    return typer.Option(option, help=help, parser=whole_number(1, MAX_QUERIES))


@cli_errors
def trainability_command(
    out: Annotated[Path, typer.Option("--out", help="Run folder: rows go to OUT/trainability.jsonl (resumable).")],
    model: ModelName = "tiny-mixtral",
    dataset: Annotated[str, typer.Option("--dataset", help="Training data (file or known name).")] = "synthetic-arith",
    eval_dataset: Annotated[
        str | None, typer.Option("--eval-dataset", help="Held-out data (default synthetic-arith-test).")
    ] = None,
    epochs: Annotated[int, typer.Option("--epochs", parser=whole_number(1, MAX_EPOCHS))] = 10,
    experts_per_token: Annotated[
        str,
        typer.Option(
            "--experts-per-token",
            help="Top-k values to compare, a comma list (default 2,8: sparse top-2 vs dense Mixtral).",
        ),
    ] = "2,8",
    batch_size: BatchSize = 32,
    lr: Annotated[
        float,
        typer.Option(
            "--lr", help="Learning rate (random-init tiny model: 3e-3).", parser=positive_number(MAX_LEARNING_RATE)
        ),
    ] = 3e-3,
    template: Template = "mistral",
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="Default: mistral for tiny-mixtral, else the model's.")
    ] = None,
    num_train: Annotated[int | None, _examples("--num-train", "Use the first N training examples.")] = None,
    num_eval: Annotated[int, _examples("--num-eval", "Evaluate on the first N held-out examples.")] = 100,
    vocab: Annotated[
        str, typer.Option("--vocab", help="tiny-mixtral: 'task' (pieces the data uses) or 'full'.")
    ] = "task",
    seed: Seed = 0,
    save_every_epoch: Annotated[
        bool, typer.Option("--save-every-epoch", help="Keep a checkpoint of every epoch.")
    ] = False,
    as_json: JsonOut = False,
) -> None:
    """Fine-tune for E epochs per routing, evaluate after each epoch, write tidy rows."""
    options = dict(locals())
    from transformers.utils import logging as hf_logging

    from tunecost.train.trainability import ROWS_FILE, TrainabilityJob, run_trainability

    hf_logging.disable_progress_bar()  # our own bar; checkpoint writes would print theirs
    _check_dataset("--dataset", dataset)
    if eval_dataset is not None:
        _check_dataset("--eval-dataset", eval_dataset)
    ks = tuple(split_list(experts_per_token, int, "experts per token"))
    job = call_with_options(TrainabilityJob, options, experts_per_token=ks)
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
        caption=f"rows: {out / ROWS_FILE}; tokenizer: {rows[0]['tokenizer'] if rows else '-'}",
    )


def _check_dataset(option: str, spec: str) -> None:
    """A dataset option names a file, a known dataset, a synthetic task or a hub id (org/name); else an error
    naming the unknown dataset."""
    from tunecost.errors import unknown_name_error
    from tunecost.workload.known_datasets import KNOWN_DATASETS, canonical_name

    if Path(spec).exists() or spec.startswith("synthetic-arith") or "/" in spec or canonical_name(spec) is not None:
        return
    raise unknown_name_error(f"dataset for {option}", spec, [*KNOWN_DATASETS, "synthetic-arith"])


def register(app: typer.Typer) -> None:
    app.command("trainability")(trainability_command)
