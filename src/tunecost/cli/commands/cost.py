"""`tunecost fit` and `tunecost cost`: the paper's cost model (§V), eq. (2) refitted and Table IV's arithmetic."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.common import cli_errors, console, print_json, print_table
from tunecost.cli.options import JsonOut, PricesFile, Provider, RecordsOut, ReplaceRecords, opt


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
    from tunecost.results.records import save_fit_records

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
    from tunecost.errors import TunecostError, unknown_name_error
    from tunecost.estimate.paper import CostEstimate
    from tunecost.limits import (
        MAX_EPOCHS,
        MAX_QUERIES,
        MAX_QUERIES_PER_S,
        MAX_USD_PER_HOUR,
        MIN_QUERIES_PER_S,
        check_finite_at_most,
    )

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


def register(app: typer.Typer) -> None:
    app.command("fit")(fit)
    app.command("cost")(cost)
