"""`tunecost eval`: accuracy of a model (optionally with a PEFT adapter) on a dataset."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import typer

from tunecost.cli.common import cli_errors, err_console, print_json, print_table, progress_bar


def _progress_bar():
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )  # stderr: stdout carries only the results


@cli_errors
def eval_command(
    model: str = typer.Option(..., "--model", help="tiny-mixtral (random init), a local folder or a hub id."),
    dataset: str = typer.Option(..., "--dataset", help="A file, a known name or synthetic-arith-test."),
    adapter: str | None = typer.Option(None, "--adapter", help="A PEFT adapter folder to apply."),
    limit: int | None = typer.Option(None, "--limit", help="Evaluate the first N examples."),
    template: str | None = typer.Option(
        None, "--template", help="none | mistral | alpaca | chat (default: the checkpoint's, else mistral)"
    ),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Override the model's tokenizer."),
    batch_size: int = typer.Option(16, "--batch-size", help="Generation batch size."),
    max_new_tokens: int | None = typer.Option(
        None, "--max-new-tokens", help="Generation limit (default 256 for math, 32 for options)."
    ),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="Skip malformed dataset rows."),
    allow_download: bool = typer.Option(False, "--allow-download", help="Allow hub downloads."),
    predictions: bool = typer.Option(False, "--predictions", help="Include every prediction in --json output."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON only."),
) -> None:
    """Accuracy of MODEL on DATASET (GSM8K-style final number, commonsense options, HellaSwag log-likelihood)."""
    from transformers.utils import logging as hf_logging

    from tunecost.evaluate.harness import evaluate_model, load_eval_model, saved_template
    from tunecost.workload.datasets import load_dataset
    from tunecost.workload.templates import template_by_name

    hf_logging.disable_progress_bar()  # keep stdout/stderr to our own bar and output
    ds = load_dataset(dataset, skip_bad_rows=skip_bad_rows, allow_download=allow_download)
    tmpl = template_by_name(template or saved_template(model) or "mistral")
    net, tok = load_eval_model(model, adapter=adapter, tokenizer=tokenizer, allow_download=allow_download)
    with nullcontext() if as_json else _progress_bar() as bar:
        on_progress = None
        if bar is not None:
            task = bar.add_task(f"eval {ds.name}", total=None)

            def on_progress(done: int, total: int, label: str) -> None:
                bar.update(task, completed=done, total=total)

        result = evaluate_model(
            net,
            tok,
            ds,
            template=tmpl,
            model_name=model,
            limit=limit,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            on_progress=on_progress,
        )
    if as_json:
        payload = dataclasses.asdict(result)
        if not predictions:
            payload.pop("predictions")
        payload["adapter"] = adapter
        print_json(payload)
        return
    print_table(
        f"{model} on {result.dataset}",
        ["scorer", "examples", "correct", "accuracy", "seconds"],
        [[result.scorer, result.num_eval, result.num_correct, f"{result.accuracy:.1%}", f"{result.seconds:.1f}"]],
        caption=f"tokenizer: {result.tokenizer}; template: {result.template}"
        + (f"; adapter: {adapter}" if adapter else ""),
    )


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
