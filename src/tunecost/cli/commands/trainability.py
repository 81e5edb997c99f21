"""`tunecost trainability`: the paper's Fig. 3 experiment (accuracy per epoch, dense vs sparse)."""

from __future__ import annotations

from pathlib import Path

import typer

from tunecost.cli.common import cli_errors, err_console, print_json, print_table, progress_bar, split_list


@cli_errors
def trainability_command(
    out: Path = typer.Option(..., "--out", help="Run folder: rows go to OUT/trainability.jsonl (resumable)."),
    model: str = typer.Option("tiny-mixtral", "--model", help="tiny-mixtral or a local MoE model folder."),
    dataset: str = typer.Option("synthetic-arith", "--dataset", help="Training data (file or known name)."),
    eval_dataset: str | None = typer.Option(
        None, "--eval-dataset", help="Held-out data (default synthetic-arith-test)."
    ),
    epochs: int = typer.Option(10, "--epochs"),
    experts_per_token: str = typer.Option(
        "2,8",
        "--experts-per-token",
        help="Top-k values to compare, a comma list (default 2,8: sparse top-2 vs dense Mixtral).",
    ),
    batch_size: int = typer.Option(32, "--batch-size"),
    lr: float = typer.Option(3e-3, "--lr", help="Learning rate (random-init tiny model: 3e-3)."),
    template: str = typer.Option("mistral", "--template", help="none | mistral | alpaca"),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Default: mistral for tiny-mixtral, else the model's."
    ),
    num_train: int | None = typer.Option(None, "--num-train", help="Use the first N training examples."),
    num_eval: int = typer.Option(100, "--num-eval", help="Evaluate on the first N held-out examples."),
    vocab: str = typer.Option("task", "--vocab", help="tiny-mixtral: 'task' (pieces the data uses) or 'full'."),
    seed: int = typer.Option(0, "--seed"),
    save_every_epoch: bool = typer.Option(False, "--save-every-epoch", help="Keep a checkpoint of every epoch."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON only."),
) -> None:
    """Fine-tune for E epochs per routing, evaluate after each epoch, write tidy rows."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    from tunecost.errors import TunecostError
    from tunecost.limits import MAX_LEARNING_RATE, check_positive
    from tunecost.train.trainability import ROWS_FILE, TrainabilityJob, run_trainability
    from tunecost.workload.job import FineTuneJob

    hf_logging.disable_progress_bar()  # our own bar; checkpoint writes would print theirs
    _check_dataset("--dataset", dataset)
    if eval_dataset is not None:
        _check_dataset("--eval-dataset", eval_dataset)
    check_positive("--lr", lr, MAX_LEARNING_RATE)
    for option, value in (("--num-eval", num_eval), ("--num-train", num_train)):
        if value is not None and value < 1:
            raise TunecostError(f"{option} must be at least 1, got {value}")
    job = TrainabilityJob(
        job=FineTuneJob(model=model, method="full", dataset=dataset, seq_len=None, batch_size=batch_size),
        eval_dataset=eval_dataset,
        epochs=epochs,
        experts_per_token=tuple(split_list(experts_per_token, int, "experts per token")),
        lr=lr,
        template=template,
        tokenizer=tokenizer,
        num_train=num_train,
        num_eval=num_eval,
        vocab=vocab,
        seed=seed,
        save_every_epoch=save_every_epoch,
    )
    if as_json:
        rows = run_trainability(job, out)
        print_json(rows)
        return
    with progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:  # stderr: stdout carries only the results
        task = bar.add_task("training", total=None)
        rows = run_trainability(
            job,
            out,
            on_progress=lambda done, total, label: bar.update(task, completed=done, total=total, description=label),
        )
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
    from tunecost.errors import TunecostError, unknown_name_error
    from tunecost.workload.known_datasets import KNOWN_DATASETS, canonical_name

    if not spec.strip():  # Path("") is the current folder, which exists
        raise TunecostError(f"{option} is empty: give a dataset name or file")
    if Path(spec).exists() or spec.startswith("synthetic-arith") or "/" in spec or canonical_name(spec) is not None:
        return
    raise unknown_name_error(f"dataset for {option}", spec, [*KNOWN_DATASETS, "synthetic-arith"])


def register(app: typer.Typer) -> None:
    app.command("trainability")(trainability_command)
