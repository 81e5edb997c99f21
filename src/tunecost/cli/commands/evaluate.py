"""`tunecost eval`: accuracy of a model (optionally with a PEFT adapter) on a dataset."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from tunecost.cli.common import cli_errors, print_json, print_table, progress_callback
from tunecost.cli.options import AllowDownload, JsonOut, NumExamples, SkipBadRows, opt


@cli_errors
def eval_command(
    model: Annotated[str, opt("--model", "tiny-mixtral (random init), a local folder or a hub id.")],
    dataset: Annotated[str, opt("--dataset", "A file, a known name or synthetic-arith-test.")],
    adapter: Annotated[str | None, opt("--adapter", "A PEFT adapter folder to apply.")] = None,
    limit: NumExamples = None,
    template: Annotated[
        str | None, opt("--template", "none | mistral | alpaca | chat (default: the checkpoint's)")
    ] = None,
    tokenizer: Annotated[str | None, opt("--tokenizer", "Override the model's tokenizer.")] = None,
    batch_size: Annotated[int, opt("--batch-size", "Generation batch size.")] = 16,
    max_new_tokens: Annotated[int | None, opt("--max-new-tokens", "Generation limit (256 math, 32 options).")] = None,
    predictions: Annotated[bool, opt("--predictions", "Include every prediction in --json output.")] = False,
    skip_bad_rows: SkipBadRows = False,
    allow_download: AllowDownload = False,
    as_json: JsonOut = False,
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
    progress = progress_callback(f"eval {ds.name}", enabled=not as_json, counted=True, label_as_description=False)
    with progress as on_progress:
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
