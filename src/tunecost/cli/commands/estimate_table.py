"""`tunecost estimate`'s table: the answer line, the cheapest rows per GPU, the notes."""

from __future__ import annotations

from tunecost.cli.common import console, dim, format_hours, print_table


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


SHOWN_ROWS = 12


def _no_answer(rows: list) -> str:
    """Why no row is the answer: fits without a price, none fits even batch 1 with the safety margin, or the batch
    asked is over the most that fits with it (a smaller one does)."""
    several = "on several: --gpus auto (or --gpus N)"
    if any(r.fits for r in rows):
        return "no GPU that fits this job has a price in the catalog"
    most = max(rows, key=lambda r: (r.max_batch_size, r.fit == "borderline"))
    if most.max_batch_size:
        return (
            f"batch {most.batch_size} fits no GPU with the safety margin ({most.gpu} holds at most "
            f"{most.max_batch_size}: --batch-size {most.max_batch_size}); {several}"
        )
    if most.fit == "borderline":
        return (
            f"no single GPU fits this job with the safety margin ({most.gpu} at batch {most.batch_size} fits only "
            f"inside it, an out-of-memory risk); {several}"
        )
    return f"no single GPU fits this job; {several}"


def print_cost_rows(rows: list, *, job, verbose: bool = False, dataset_named: bool = True) -> None:
    """The answer line (the cheapest row that fits), the best rows (all with --verbose), then the notes. The title
    names the data the user named, or the default whose lengths the throughput takes; none where --seq-len fixes
    every query's length and no data was named."""
    from tunecost.catalog.prices import price_label
    from tunecost.estimate.estimators import lengths_note

    first = rows[0]
    fitting = [r for r in rows if r.fits and r.usd is not None]
    if fitting:
        best = fitting[0]
        console.print(
            f"answer: {best.gpu} ({best.provider}), batch {best.batch_size}: {format_hours(best.hours)} h, "
            f"[bold]${best.usd:.2f}[/bold]"
            + (f", start-up {best.startup_s / 60:.1f} min once" if best.startup_s else "")
        )
    else:
        console.print(f"answer: {_no_answer(rows)}")
    shown = rows if verbose else _best_rows(rows)
    print_table(
        f"{first.model}{_data_label(first.dataset, job, dataset_named)}: {first.num_queries} queries x "
        f"{first.epochs:g} epochs "
        + (f"({job.grad_accum} micro-batches per optimizer step) " if job.grad_accum > 1 else "")
        + f"(estimator: {first.estimator})",
        ["gpu", "provider", "$/h", "batch", "fits", "queries/s", "hours", "cost $"],
        [
            [
                r.gpu,
                price_label_of(r, price_label),
                _fmt(r.usd_per_hour, ".2f"),
                r.batch_size if r.fit != "no" else f"{r.batch_size} (max {r.max_batch_size})",
                r.fit + ("*" if r.extrapolation else ""),
                _fmt(r.queries_per_s, ".3g")
                + (
                    f" [{r.queries_per_s_low:.3g}-{r.queries_per_s_high:.3g}]"
                    if r.queries_per_s_low is not None
                    else ""
                ),
                format_hours(r.hours),
                _fmt(r.usd, ".2f"),
            ]
            for r in shown
        ],
    )
    if len(shown) < len(rows):
        console.print(f"{len(rows) - len(shown)} more rows (other providers, GPUs that do not fit): --verbose")
    dates = dict.fromkeys(f"{r.provider} {r.price_date}" for r in shown if r.provider and not r.owned)
    console.print("queries/s: steady state [95 % interval]; prices of " + ", ".join(dates))
    if any(r.extrapolation for r in shown):
        console.print("* predicted outside the calibrated range (GPU, model or batch): see the notes")
    startups = sorted({round(r.startup_s / 60, 1) for r in shown if r.startup_s})  # each row's own
    if startups:
        span = f"{startups[0]:.1f}" + (f"-{startups[-1]:.1f}" if len(startups) > 1 else "")
        console.print(f"start-up: {span} min, counted once in the hours (--run-queries 1000: the paper's runs)")
    console.print(dim(lengths_note(job)))
    notes = _notes(rows)
    if verbose:
        for note in notes:
            console.print(dim(f"note: {note}"))
    elif notes:
        console.print(f"[dim]{len(notes)} notes: --verbose[/dim]")


def _data_label(dataset: str | None, job, named: bool) -> str:
    if named:
        return f" on {dataset}"
    return "" if job.seq_len or job.lengths else f" on {dataset} (the default data)"


def price_label_of(row, label) -> str:
    if row.provider is None:
        return "-"
    if row.owned:
        return "owned" if not row.usd_per_hour else f"owned (${row.usd_per_hour:g}/h)"
    return row.provider


def _best_rows(rows: list) -> list:
    """The cheapest provider per GPU that fits, cheapest first, up to SHOWN_ROWS."""
    seen: set[str] = set()
    out = []
    for r in rows:
        if r.gpu in seen or r.fit == "no":
            continue
        seen.add(r.gpu)
        out.append(r)
    return out[:SHOWN_ROWS] or rows[:SHOWN_ROWS]


def _split_notes(text: str) -> list[str]:
    """A row's notes, joined by "; ", apart again (a "; " inside a note's parentheses stays in it)."""
    notes, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith("; ", i):
            notes.append(text[start:i])
            start = i + 2
    return [*notes, text[start:]] if text else []


def _notes(rows: list) -> list[str]:
    """Every distinct note once, each prefixed by the GPUs it is about when it is not about all of them."""
    by_note: dict[str, list[str]] = {}
    for r in rows:
        for note in _split_notes(r.notes):
            gpus = by_note.setdefault(note, [])
            if r.gpu not in gpus:
                gpus.append(r.gpu)
    every = len({r.gpu for r in rows})
    return [note if len(g) == every else f"{', '.join(g)}: {note}" for note, g in by_note.items()]
