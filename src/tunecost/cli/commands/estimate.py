"""`tunecost estimate`: the paper's cost model (§V) and its successors, for one job on one or several GPUs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.commands import estimate_multigpu as multi
from tunecost.cli.commands.estimate_table import print_cost_rows
from tunecost.cli.common import checked_host_cpu, cli_errors, print_json, split_list
from tunecost.cli.groups import JobOptions, MultiGpuOptions, Pricing, RecordsOutput, StackFlags, option_groups
from tunecost.cli.jobconfig import ConfigFiles, config_data_file, required, run_length
from tunecost.cli.options import (
    Epochs,
    ExpertsPerToken,
    Framework,
    HostCpuOpt,
    MaxSteps,
    MethodName,
    RunQueries,
    opt,
)
from tunecost.errors import TunecostError
from tunecost.estimate import DEFAULT_ESTIMATOR
from tunecost.limits import (
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_QUERIES,
    MAX_SEQ_LEN,
    check_count,
    check_finite_at_most,
)
from tunecost.results.records import save_estimate_records

CALIBRATE_HELP = (
    "Throughput measurements CSV or folder of CSVs to fit eq. (2) (paper) or calibrate (calibrated) on; repeat for "
    "several."
)
BATCH_SIZE_HELP = (
    "Fix the batch instead of the maximum: one value for every GPU (17), one per --gpu in order (4,17,17), or GPU=B "
    "pairs (A40=4,H100=17). A batch larger than fits is marked in the table."
)
ESTIMATOR_HELP = "calibrated (answers for every GPU) | simulate | paper"
STEADY_STATE_HELP = "Steady-state throughput with no start-up (default: one run, start-up once)."


@cli_errors
@option_groups
def estimate(
    *,
    gpu: Annotated[str, opt("--gpu", "Comma-separated GPUs, e.g. A40,A100-80GB,H100 (or 'all').")],
    job_options: JobOptions,
    epochs: Epochs = None,
    max_steps: MaxSteps = None,
    queries: Annotated[int | None, opt("--queries", "Queries (default: the dataset's size).")] = None,
    dataset: Annotated[str | None, opt("--dataset", "Dataset (sets queries and the throughput's lengths).")] = None,
    method: MethodName = "qlora",
    experts_per_token: ExpertsPerToken = None,
    estimator: Annotated[str, opt("--estimator", ESTIMATOR_HELP)] = DEFAULT_ESTIMATOR,
    pricing: Pricing,
    calibrate: Annotated[list[Path] | None, opt("--calibrate", CALIBRATE_HELP)] = None,
    batch_size: Annotated[str | None, opt("--batch-size", BATCH_SIZE_HELP)] = None,
    run_queries: RunQueries = None,
    steady_state: Annotated[bool, opt("--steady-state", STEADY_STATE_HELP)] = False,
    host_cpu: HostCpuOpt = None,
    stack_flags: StackFlags,
    multi_gpu: MultiGpuOptions,
    output: RecordsOutput,
    verbose: Annotated[bool, opt("--verbose", "Every row and every note.")] = False,
    framework: Framework = None,
    config: ConfigFiles = None,
) -> None:
    """Cost of fine-tuning MODEL on each GPU and provider, the answer first; says which estimator answered.
    With --gpus (or --strategy): memory per rank, communication and cost on several GPUs."""
    from tunecost.catalog.gpus import fp8_gpu_names
    from tunecost.estimate.cost import check_queries_or_dataset, estimate_costs
    from tunecost.estimate.throughput.packing import queries_per_row
    from tunecost.workload.job_data import job_data

    model = required("model", job_options.model)
    check_estimate_options(
        epochs, queries, job_options.seq_len, dataset, estimator, run_queries, steady_state, framework
    )
    dataset = config_data_file(dataset)
    data = job_data(dataset, model=model) if dataset else None
    dataset_queries = data.num_queries if queries is None and data is not None else queries
    job_options.check_method(method)
    job = job_options.estimate_job(model, method, data, experts_per_token, rows=max_steps is not None)
    searching = multi_gpu.given and multi_gpu.num_gpus is None
    length = run_length(epochs, max_steps, dataset_queries, searching=searching, queries_per_row=queries_per_row(job))
    queries, epochs = length.num_queries, length.epochs
    check_queries_or_dataset(queries, dataset)
    gpus = fp8_gpu_names(job.fp8, gpu_names(gpu), every=gpu.strip().lower() == "all")
    behaviour = stack_flags.behaviour(job_options.stack)
    _check_gpu_count_options(multi_gpu.given, estimator, bool(calibrate), run_queries, host_cpu)
    if multi_gpu.given:
        num_queries = queries or job_data(job.dataset or "", model=model).num_queries
        multi.run_multi_gpu(
            job,
            multi_gpu,
            gpus=gpus,
            pricing=pricing,
            batch_size=batch_size,
            num_queries=num_queries,
            epochs=epochs,
            output=output,
            verbose=verbose,
            steady_state=steady_state,
            behaviour=behaviour,
            framework=framework,
            host_cpu=host_cpu,
        )
        return
    options = estimator_options(estimator, calibrate, run_queries, steady_state, host_cpu, behaviour, framework)
    rows = estimate_costs(
        job,
        gpus,
        epochs=epochs,
        num_queries=queries,
        options=options,
        batch_sizes=parse_batch_sizes(batch_size, gpus) if batch_size else None,
        provider=pricing.provider,
        prices_file=pricing.prices_file,
    )
    show_cost_rows(rows, job, experts_per_token, output, verbose, dataset_named=dataset is not None)


def gpu_names(gpu: str) -> list[str]:
    """--gpu: a comma list of GPUs, or 'all' (the catalog)."""
    from tunecost.catalog.gpus import gpu_catalog

    return list(gpu_catalog()) if gpu.strip().lower() == "all" else split_list(gpu, what="GPU")


def check_estimate_options(
    epochs: float | None,
    queries: int | None,
    seq_len: int | None,
    dataset: str | None,
    estimator: str,
    run_queries: int | None,
    steady_state: bool,
    framework: str | None = None,
) -> None:
    """The bounds of estimate's numbers, the conflicts between its throughput options, and a known framework."""
    from tunecost.estimate.throughput.stack_priors import framework_family
    from tunecost.limits import check_count

    if framework is not None:
        framework_family(framework)

    check_finite_at_most("--epochs", epochs, MAX_EPOCHS)
    if queries is not None and queries <= 0:
        raise TunecostError(f"--queries must be > 0, got {queries}")
    check_count("--queries", queries, MAX_QUERIES)
    check_count("--seq-len", seq_len, MAX_SEQ_LEN)
    if run_queries is not None and (run_queries < 1 or estimator != "calibrated"):
        raise TunecostError("--run-queries must be >= 1 and needs --estimator calibrated")
    if steady_state and (run_queries is not None or estimator == "paper"):
        raise TunecostError("--steady-state: give it or --run-queries, not both; it needs the cross-GPU model")


def _check_gpu_count_options(
    several: bool, estimator: str, calibrate: bool, run_queries: int | None, host_cpu: str | None
) -> None:
    """The options of one GPU's estimators: not with --gpus/--strategy; --host-cpu not with eq. (2)."""
    if several and (estimator != DEFAULT_ESTIMATOR or calibrate or run_queries is not None):
        raise TunecostError(
            "--gpus/--strategy estimate with the step simulator and the cross-GPU throughput model; "
            "--estimator, --calibrate and --run-queries apply to one GPU only"
        )
    if host_cpu is not None and estimator == "paper":
        raise TunecostError("--host-cpu needs --estimator calibrated or simulate (eq. (2) has no host in it)")


def estimator_options(
    name: str,
    calibrate: list[Path] | None,
    run_queries: int | None,
    steady_state: bool,
    host_cpu: str | None,
    behaviour,
    framework: str | None = None,
):
    """The `EstimatorOptions` of estimate's options on one GPU."""
    from tunecost.estimate.estimators import EstimatorOptions

    return EstimatorOptions(
        name=name,
        calibrate=tuple(calibrate or ()),
        run_queries=run_queries,
        steady_state=steady_state,
        host_cpu=checked_host_cpu(host_cpu),
        behaviour=behaviour,
        framework=framework,
    )


def show_cost_rows(
    rows: list, job, experts_per_token: int | None, output: RecordsOutput, verbose: bool, *, dataset_named: bool
) -> None:
    """The rows of one GPU each: added to the run directory, then printed as JSON or a table."""
    from tunecost.models.catalog import resolve_model

    if output.out is not None:
        k = resolve_model(job.model).top_k(experts_per_token)
        save_estimate_records(
            output.out, rows, method=job.method, experts_per_token=k, command=sys.argv, force=output.force
        )
    if output.json_out:
        print_json(rows)
        return
    print_cost_rows(rows, job=job, verbose=verbose, dataset_named=dataset_named)


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


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)
