"""`tunecost fit`, `tunecost cost`, `tunecost estimate`: the paper's cost model (§V) and its successors."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.commands import estimate_multigpu as multi
from tunecost.cli.common import (
    checked_host_cpu,
    cli_errors,
    console,
    format_hours,
    print_json,
    print_table,
    split_list,
    stack_behaviour,
)
from tunecost.cli.jobconfig import ConfigFiles, required
from tunecost.cli.options import (
    DEFAULT_LORA_ALPHA,
    DEFAULT_LORA_RANK,
    DEFAULT_STACK_NAME,
    Attention,
    ChunkedLoss,
    DoubleQuant,
    Dtype,
    ExpertsPerToken,
    GradientCheckpointing,
    HostCpuOpt,
    JobModel,
    JsonOut,
    LoraAlpha,
    LoraRank,
    LoraTargets,
    MethodName,
    OffloadActivations,
    Optimizer,
    OptimizerInBackward,
    PricesFile,
    Provider,
    QuantType,
    Reentrant,
    RunQueries,
    SeqLen,
    Stack,
    opt,
)
from tunecost.errors import TunecostError, unknown_name_error
from tunecost.estimate import DEFAULT_ESTIMATOR
from tunecost.limits import (
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_QUERIES,
    MAX_QUERIES_PER_S,
    MAX_SEQ_LEN,
    MAX_USD_PER_HOUR,
    MIN_QUERIES_PER_S,
    check_count,
    check_finite_at_most,
)
from tunecost.results.records import save_estimate_records, save_fit_records
from tunecost.workload.job import parse_lora_targets

CALIBRATE_HELP = (
    "Throughput measurements CSV or folder of CSVs to fit eq. (2) (paper) or calibrate (calibrated) on; repeat for "
    "several."
)
BATCH_SIZE_HELP = (
    "Fix the batch instead of the maximum: one value for every GPU (17), one per --gpu in order (4,17,17), or GPU=B "
    "pairs (A40=4,H100=17). A batch larger than fits is marked in the table."
)
RecordsOut = Annotated[Path | None, opt("--out", "Run directory to add the records to (for `tunecost report`).")]
ReplaceRecords = Annotated[bool, opt("--force", "With --out: replace records of the same kind already there.")]


@cli_errors
def fit(
    measurements: Annotated[
        Path, typer.Argument(help="CSV: model,dataset,gpu,experts_per_token,[sparsity],batch_size,queries_per_s")
    ],
    form: Annotated[str, opt("--form", "Eq. (2) form: artifact (a + b*log(B)/(s*c3)) or printed.")] = "artifact",
    out: RecordsOut = None,
    force: ReplaceRecords = False,
    json_out: JsonOut = False,
) -> None:
    """Fit eq. (2) per (model, dataset, GPU) group with scipy; report coefficients, RMSE, MAPE, points."""
    from tunecost.estimate.fit import fit_all
    from tunecost.estimate.measurements import load_measurements

    points = load_measurements(measurements)
    fits = fit_all(points, form)  # type: ignore[arg-type]
    if out is not None:
        save_fit_records(out, points, fits, source=str(measurements), command=sys.argv, force=force)
    if json_out:
        print_json(
            [
                {
                    "model": f.model,
                    "dataset": f.dataset,
                    "gpu": f.gpu,
                    "form": f.form,
                    "coefficients": f.coefficients,
                    "rmse": f.rmse,
                    "mape": f.mape,
                    "num_points": f.num_points,
                    "batch_size_range": f.batch_size_range,
                    "note": f.note,
                }
                for f in fits
            ]
        )
        return
    print_table(
        f"Eq. (2) fits ({form} form)",
        ["model", "dataset", "gpu", "coefficients", "RMSE qps", "MAPE", "points"],
        [
            [
                f.model,
                f.dataset,
                f.gpu,
                ", ".join(f"{k}={v:.4g}" for k, v in f.coefficients.items()),
                f"{f.rmse:.3f}",
                f"{100 * f.mape:.1f} %",
                f.num_points,
            ]
            for f in fits
        ],
        caption="; ".join(sorted({f"{f.model}: {f.note}" for f in fits})),
    )


@cli_errors
def cost(
    queries: Annotated[float, opt("--queries", "Queries in the dataset.")],
    epochs: Annotated[float, opt("--epochs", "Epochs.")],
    throughput: Annotated[float | None, opt("--throughput", "Queries per second.")] = None,
    usd_per_hour: Annotated[float | None, opt("--usd-per-hour", "Price in $ per GPU-hour.")] = None,
    gpu: Annotated[str | None, opt("--gpu", "Take the price from the catalog for this GPU.")] = None,
    provider: Provider = None,
    prices_file: PricesFile = None,
    json_out: JsonOut = False,
) -> None:
    """Hours and dollars of a fine-tune: queries x epochs / throughput / 3600 x $/h (Table IV)."""
    from tunecost.catalog.prices import cheapest_price, price_catalog
    from tunecost.estimate.paper import CostEstimate

    if throughput is None:
        raise TunecostError("give --throughput QPS (queries per second); `tunecost estimate` predicts it")
    check_finite_at_most("--queries", queries, MAX_QUERIES)
    check_finite_at_most("--epochs", epochs, MAX_EPOCHS)
    check_finite_at_most("--throughput", throughput, MAX_QUERIES_PER_S)
    check_finite_at_most("--usd-per-hour", usd_per_hour, MAX_USD_PER_HOUR)
    if 0 < throughput < MIN_QUERIES_PER_S:
        raise TunecostError(f"--throughput must be at least {MIN_QUERIES_PER_S:g} queries/s, got {throughput!r}")
    catalog = price_catalog(prices_file)  # a --prices file is read (and checked) even beside --usd-per-hour
    if provider is not None and provider.lower() not in {p.provider.lower() for p in catalog}:
        raise unknown_name_error("provider", provider, {p.provider for p in catalog})
    price_provider = price_date = gpu_name = None
    if gpu is not None and usd_per_hour is not None:  # an unknown --gpu is an error even when it sets no price
        from tunecost.catalog.gpus import resolve_gpu_name

        gpu_name = resolve_gpu_name(gpu).gpu.name
    if usd_per_hour is None:
        if gpu is None:
            raise TunecostError(
                "give --usd-per-hour P, or --gpu G [--provider NAME] to take the price from the catalog"
            )
        price = cheapest_price(gpu, provider=provider, prices_file=prices_file)
        usd_per_hour, price_provider, price_date, gpu_name = (
            price.usd_per_gpu_hour,
            price.provider,
            price.date,
            price.gpu,
        )
    result = CostEstimate(
        num_queries=queries,
        epochs=epochs,
        queries_per_s=throughput,
        usd_per_hour=usd_per_hour,
        provider=price_provider,
        price_date=price_date,
        gpu=gpu_name,
    )
    if not (math.isfinite(result.hours) and math.isfinite(result.usd)):
        raise TunecostError("the cost overflows: check --queries, --epochs, --throughput and the price")
    if json_out:
        print_json(result)
        return
    where = f" ({result.gpu}, {result.provider}, price of {result.price_date})" if result.provider else ""
    console.print(
        f"{queries:g} queries x {epochs:g} epochs at {throughput:g} queries/s = {result.hours:.2f} h; "
        f"at ${usd_per_hour:g}/h{where}: [bold]${result.usd:.2f}[/bold]"
    )


@cli_errors
def estimate(
    gpu: Annotated[str, opt("--gpu", "Comma-separated GPUs, e.g. A40,A100-80GB,H100 (or 'all').")],
    model: JobModel = None,
    epochs: Annotated[float | None, opt("--epochs", "Epochs (or from --config).")] = None,
    queries: Annotated[int | None, opt("--queries", "Queries (default: the dataset's size).")] = None,
    dataset: Annotated[str | None, opt("--dataset", "Dataset (sets queries and the throughput's lengths).")] = None,
    method: MethodName = "qlora",
    experts_per_token: ExpertsPerToken = None,
    lora_targets: LoraTargets = None,
    gradient_checkpointing: GradientCheckpointing = None,
    lora_rank: LoraRank = DEFAULT_LORA_RANK,
    lora_alpha: LoraAlpha = DEFAULT_LORA_ALPHA,
    attention: Attention = "flash",
    optimizer: Optimizer = "adamw",
    dtype: Dtype = None,
    quant_type: QuantType = None,
    double_quant: DoubleQuant = True,
    estimator: Annotated[str, opt("--estimator", "calibrated (answers for every GPU) | simulate | paper")] = (
        DEFAULT_ESTIMATOR
    ),
    provider: Provider = None,
    prices_file: PricesFile = None,
    seq_len: SeqLen = None,
    calibrate: Annotated[list[Path] | None, opt("--calibrate", CALIBRATE_HELP)] = None,
    batch_size: Annotated[str | None, opt("--batch-size", BATCH_SIZE_HELP)] = None,
    run_queries: RunQueries = None,
    steady_state: Annotated[
        bool, opt("--steady-state", "Steady-state throughput with no start-up (default: one run, start-up once).")
    ] = False,
    host_cpu: HostCpuOpt = None,
    stack: Stack = DEFAULT_STACK_NAME,
    chunked_loss: ChunkedLoss = False,
    offload_activations: OffloadActivations = False,
    optimizer_in_backward: OptimizerInBackward = False,
    reentrant: Reentrant = None,
    num_gpus: multi.NumGpus = None,
    gpus_per_node: multi.GpusPerNode = None,
    strategy: multi.Strategy = None,
    max_gpus: multi.MaxGpus = None,
    interconnect: multi.Interconnect = None,
    expert_parallel: multi.ExpertParallel = None,
    offload: multi.Offload = None,
    out: RecordsOut = None,
    force: ReplaceRecords = False,
    verbose: Annotated[bool, opt("--verbose", "Every row and every note.")] = False,
    config: ConfigFiles = None,
    json_out: JsonOut = False,
) -> None:
    """Cost of fine-tuning MODEL on each GPU and provider, the answer first; says which estimator answered.
    With --gpus (or --strategy): memory per rank, communication and cost on several GPUs."""
    from tunecost.catalog.gpus import gpu_catalog
    from tunecost.estimate.cost import check_queries_or_dataset, estimate_costs, estimate_job
    from tunecost.estimate.estimators import EstimatorOptions
    from tunecost.models.catalog import resolve_model
    from tunecost.workload.job_data import job_data

    model, epochs = required("model", model), required("epochs", epochs)
    gpus = list(gpu_catalog()) if gpu.strip().lower() == "all" else split_list(gpu, what="GPU")
    check_finite_at_most("--epochs", epochs, MAX_EPOCHS)
    if queries is not None and queries <= 0:
        raise TunecostError(f"--queries must be > 0, got {queries}")
    check_count("--queries", queries, MAX_QUERIES)
    check_count("--seq-len", seq_len, MAX_SEQ_LEN)
    check_queries_or_dataset(queries, dataset)
    if run_queries is not None and (run_queries < 1 or estimator != "calibrated"):
        raise TunecostError("--run-queries must be >= 1 and needs --estimator calibrated")
    if steady_state and (run_queries is not None or estimator == "paper"):
        raise TunecostError("--steady-state: give it or --run-queries, not both; it needs the cross-GPU model")
    data = job_data(dataset, model=model) if dataset else None
    job = estimate_job(
        model,
        method=method,
        experts_per_token=experts_per_token,
        dataset=data.name if data else None,
        seq_len=seq_len,
        lora_targets=parse_lora_targets(lora_targets) if lora_targets is not None else None,
        stack=stack,
        lengths=data.lengths if data else None,
        gradient_checkpointing=gradient_checkpointing,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        dtype=dtype,
        attention=attention,
        optimizer=optimizer,
        quant_type=quant_type,
        double_quant=double_quant,
    )
    if queries is None and data is not None:
        queries = data.num_queries
    behaviour = stack_behaviour(
        stack,
        chunked_loss=chunked_loss,
        offload_activations=offload_activations,
        optimizer_in_backward=optimizer_in_backward,
        reentrant=reentrant,
    )
    if any(
        v is not None for v in (num_gpus, gpus_per_node, strategy, max_gpus, interconnect, expert_parallel, offload)
    ):
        if estimator != DEFAULT_ESTIMATOR or calibrate or run_queries is not None or host_cpu is not None:
            raise TunecostError(
                "--gpus/--strategy estimate with the step simulator and the cross-GPU throughput model; "
                "--estimator, --calibrate, --run-queries and --host-cpu apply to one GPU only"
            )
        multi.run_multi_gpu(
            job,
            gpus=gpus,
            num_gpus=num_gpus or "auto",
            gpus_per_node=gpus_per_node,
            strategy=strategy,
            max_gpus=max_gpus,
            interconnect=interconnect,
            expert_degree=expert_parallel,
            offload=offload,
            provider=provider,
            prices_file=prices_file,
            batch_size=batch_size,
            num_queries=queries or job_data(job.dataset or "", model=model).num_queries,
            epochs=epochs,
            json_out=json_out,
            out=out,
            force=force,
            verbose=verbose,
            steady_state=steady_state,
            behaviour=behaviour,
        )
        return
    if host_cpu is not None and estimator == "paper":
        raise TunecostError("--host-cpu needs --estimator calibrated or simulate (eq. (2) has no host in it)")
    options = EstimatorOptions(
        name=estimator,
        calibrate=tuple(calibrate or ()),
        run_queries=run_queries,
        steady_state=steady_state,
        stack=stack,
        host_cpu=checked_host_cpu(host_cpu),
        behaviour=behaviour,
    )
    batch_sizes = parse_batch_sizes(batch_size, gpus) if batch_size else None
    rows = estimate_costs(
        job,
        gpus,
        epochs=epochs,
        num_queries=queries,
        options=options,
        batch_sizes=batch_sizes,
        provider=provider,
        prices_file=prices_file,
    )
    if out is not None:
        k = resolve_model(job.model).default_experts_per_token if experts_per_token is None else experts_per_token
        save_estimate_records(out, rows, method=method, experts_per_token=k, command=sys.argv, force=force)
    if json_out:
        print_json(rows)
        return
    print_cost_rows(rows, job=job, verbose=verbose)


def parse_batch_sizes(text: str, gpus: list[str]) -> dict[str, int]:
    """--batch-size: "17" (every GPU), "4,17,17" (aligned with --gpu), or "A40=4,H100=17"."""
    parts = [p.strip() for p in text.split(",") if p.strip()]

    def number(value: str) -> int:
        try:
            count = int(value)
        except ValueError:
            raise TunecostError(f"--batch-size: {value!r} is not a whole number") from None
        return check_count("--batch-size", count, MAX_BATCH_SIZE) or count

    if all("=" in p for p in parts):
        return {k.strip(): number(v) for k, v in (p.split("=", 1) for p in parts)}
    if any("=" in p for p in parts):
        raise TunecostError("--batch-size: give all values as GPU=B, or none")
    if len(parts) == 1:
        return {"*": number(parts[0])}
    if len(parts) != len(gpus):
        raise TunecostError(f"--batch-size has {len(parts)} values for {len(gpus)} GPUs; give one, or one per GPU")
    return {g: number(p) for g, p in zip(gpus, parts, strict=True)}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


SHOWN_ROWS = 12


def print_cost_rows(rows: list, *, job, verbose: bool = False) -> None:
    """The answer line (the cheapest row that fits), the best rows (all with --verbose), then the notes."""
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
        console.print("answer: no GPU fits this job with a price in the catalog")
    shown = rows if verbose else _best_rows(rows)
    print_table(
        f"{first.model} on {first.dataset}: {first.num_queries} queries x {first.epochs:g} epochs "
        f"(estimator: {first.estimator})",
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
    startup = max((r.startup_s for r in rows), default=0.0)
    if startup:
        console.print(
            f"start-up: {startup / 60:.1f} min, counted once in the hours (--run-queries 1000: the paper's runs)"
        )
    console.print(f"[dim]{lengths_note(job)}[/dim]")
    notes = _notes(rows)
    if verbose:
        for note in notes:
            console.print(f"[dim]note: {note}[/dim]")
    elif notes:
        console.print(f"[dim]{len(notes)} notes: --verbose[/dim]")


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


def _notes(rows: list) -> list[str]:
    """Every distinct note once, each prefixed by the GPUs it is about when it is not about all of them."""
    by_note: dict[str, list[str]] = {}
    for r in rows:
        for note in r.notes.split("; ") if r.notes else ():
            gpus = by_note.setdefault(note, [])
            if r.gpu not in gpus:
                gpus.append(r.gpu)
    every = len({r.gpu for r in rows})
    return [note if len(g) == every else f"{', '.join(g)}: {note}" for note, g in by_note.items()]


def register(app: typer.Typer) -> None:
    app.command("fit")(fit)
    app.command("cost")(cost)
    app.command("estimate")(estimate)
