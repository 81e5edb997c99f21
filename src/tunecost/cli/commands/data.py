"""`tunecost data`: dataset statistics (sequence lengths, Fig. 2) and the known dataset names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.common import cli_errors, print_json, print_table
from tunecost.cli.options import (
    AllowDownload,
    Force,
    JsonOut,
    SkipBadRows,
    Template,
    Tokenizer,
    count_option,
    opt,
)
from tunecost.io import atomic_write_text
from tunecost.limits import MAX_BATCH_SIZE, MAX_BINS
from tunecost.results.records import record

DATASET_HELP = (
    "A file (.json/.jsonl/.parquet/.csv), a known name (see `tunecost data list`), a hub id, or synthetic-arith."
)

data_app = typer.Typer(help="Datasets: sequence-length statistics and known names.", no_args_is_help=True)


def stats_rows(summary: dict, histogram: list[dict], padding: dict) -> list[dict]:
    """JSONL rows of kind "lengths" (docs/dev/records.md): one summary row and one row per histogram bin."""
    keys = {"dataset": summary["dataset"], "tokenizer": summary["tokenizer"], "template": summary["template"]}
    rest = {k: v for k, v in summary.items() if k not in keys}
    rows = [record("lengths", **{**keys, "record": "summary", **rest, **padding})]
    rows += [
        record("lengths", **keys, record="histogram", bin_lo=b["lo"], bin_hi=b["hi"], count=b["count"])
        for b in histogram
    ]
    return rows


@data_app.command("stats")
@cli_errors
def stats(
    dataset: Annotated[str, typer.Argument(help=DATASET_HELP)],
    tokenizer: Tokenizer = "mistral",
    template: Template = "none",
    batch_size: Annotated[
        int, count_option("--batch-size", "Batch size of the padding-waste figures.", MAX_BATCH_SIZE)
    ] = 8,
    bins: Annotated[int, count_option("--bins", "Histogram bins.", MAX_BINS)] = 30,
    columns: Annotated[str | None, opt("--columns", "Column mapping: prompt=COL,response=COL[,answer=COL]")] = None,
    skip_bad_rows: SkipBadRows = False,
    allow_download: AllowDownload = False,
    out: Annotated[Path | None, opt("--out", "Write JSONL rows (summary + histogram) to this file.")] = None,
    force: Force = False,
    as_json: JsonOut = False,
) -> None:
    """Token-length statistics of a dataset's queries (prompt + ground-truth response)."""
    from tunecost.outputs import check_output_path
    from tunecost.workload.datasets import load_dataset, parse_columns
    from tunecost.workload.lengths import length_distribution
    from tunecost.workload.templates import template_by_name
    from tunecost.workload.tokenizers import tokenizer_by_name

    if out is not None:
        check_output_path(out, force=force, inputs=(dataset,))
    tmpl = template_by_name(template)
    tok = tokenizer_by_name(tokenizer, allow_download=allow_download)
    ds = load_dataset(
        dataset, columns=parse_columns(columns), skip_bad_rows=skip_bad_rows, allow_download=allow_download
    )
    dist = length_distribution(ds, tok, tmpl)
    summary = dist.summary()
    padding = {
        "batch_size": batch_size,
        "padded_tokens_dataset_order": dist.padded_tokens(batch_size, "dataset"),
        "padding_waste_dataset_order": round(dist.padding_waste(batch_size, "dataset"), 4),
        "padding_waste_shuffled": round(dist.padding_waste(batch_size, "shuffled"), 4),
        "padding_waste_sorted": round(dist.padding_waste(batch_size, "sorted"), 4),
        "worst_batch_length": dist.worst_batch_length(batch_size),
    }
    histogram = [{"lo": b.lo, "hi": b.hi, "count": b.count} for b in dist.histogram(num_bins=bins)]
    report = {
        **summary,
        "source": ds.source,
        "format": ds.format,
        "skipped_rows": [i + 1 for i in ds.skipped_rows],  # counted from 1, as the errors count rows
        **padding,
        "histogram": histogram,
    }
    if out is not None:
        rows = stats_rows(summary, histogram, padding)
        atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
    if as_json:
        print_json(report)
        return
    print_table(
        f"{ds.name}: {dist.num_queries} queries ({ds.format}, {ds.source})",
        ["statistic", "tokens"],
        [
            ["min", summary["min_tokens"]],
            ["median", summary["median_tokens"]],
            ["mean", summary["mean_tokens"]],
            ["p90", summary["p90_tokens"]],
            ["p99", summary["p99_tokens"]],
            ["max", summary["max_tokens"]],
            [f"padding waste, batch {batch_size} (dataset order)", f"{padding['padding_waste_dataset_order']:.1%}"],
            [f"padding waste, batch {batch_size} (sorted)", f"{padding['padding_waste_sorted']:.1%}"],
        ],
        caption=f"tokenizer: {tok.name}; template: {tmpl.name}"
        + (f"; skipped {len(ds.skipped_rows)} malformed rows" if ds.skipped_rows else "")
        + (f"; rows written to {out}" if out else ""),
    )


@data_app.command("list")
@cli_errors
def list_known(as_json: JsonOut = False) -> None:
    """Known dataset names and where each resolves ($TUNECOST_DATA_DIR, hub cache or embedded)."""
    from tunecost.catalog.datasets import dataset_catalog
    from tunecost.workload.known_datasets import KNOWN_DATASETS, resolve_known

    rows = []
    for name, known in KNOWN_DATASETS.items():
        local = None if name.startswith("synthetic-arith") else resolve_known(name)
        where = "embedded" if name.startswith("synthetic-arith") else (str(local) if local else "")
        hub = f"{known.hub[0]} ({known.hub[2]})" if known.hub else ""
        rows.append({"name": name, "description": known.description, "local": where, "hub": hub})
    for name, facts in dataset_catalog().items():  # sizes and lengths for estimate and plan, no rows to read
        if name not in KNOWN_DATASETS:
            lengths = f"median {facts.median_tokens:g} tokens" if facts.median_tokens else "no length statistic"
            description = f"{facts.num_queries} queries, {lengths} (catalog: estimate, plan)"
            rows.append({"name": name, "description": description, "local": "", "hub": facts.hub_id})
    if as_json:
        print_json(rows)
        return
    print_table(
        "Known datasets",
        ["name", "description", "local file", "hub"],
        [[r["name"], r["description"], r["local"] or "-", r["hub"] or "-"] for r in rows],
        caption="Local files: under $TUNECOST_DATA_DIR. Catalog rows give estimate and plan a size and lengths.",
    )


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
