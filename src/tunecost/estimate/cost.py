"""Cost tables: for a model and a list of GPUs, the batch size, throughput, hours and dollars per provider."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tunecost.catalog.datasets import dataset_catalog, get_dataset_facts
from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.catalog.models import resolve_model
from tunecost.catalog.prices import Price, price_catalog, prices_for
from tunecost.errors import TunecostError
from tunecost.estimate.estimators import EstimateRequest, get_estimator
from tunecost.estimate.paper import cost_usd, training_seconds

DEFAULT_THROUGHPUT_DATASET = "math_14k"  # Table IV's workload


@dataclass(frozen=True, kw_only=True)
class CostRow:
    model: str
    dataset: str
    gpu: str
    provider: str | None
    price_date: str | None
    price_source: str | None
    usd_per_hour: float | None
    max_batch_size: int
    batch_size: int
    queries_per_s: float | None
    queries_per_s_low: float | None
    queries_per_s_high: float | None
    num_queries: int
    epochs: float
    hours: float | None
    usd: float | None
    estimator: str
    notes: str
    extrapolation: bool = False  # the throughput was predicted outside the calibrated range (see notes)


@dataclass(frozen=True, kw_only=True)
class CostEstimate:
    """What `tunecost cost` prints: one fine-tune's hours and dollars from a throughput and a price."""

    num_queries: float
    epochs: float
    queries_per_s: float
    usd_per_hour: float
    hours: float
    usd: float
    provider: str | None = None
    price_date: str | None = None
    gpu: str | None = None


def simple_cost(
    *,
    num_queries: float,
    epochs: float,
    queries_per_s: float,
    usd_per_hour: float,
    provider: str | None = None,
    price_date: str | None = None,
    gpu: str | None = None,
) -> CostEstimate:
    hours = training_seconds(num_queries=num_queries, epochs=epochs, queries_per_s=queries_per_s) / 3600.0
    usd = cost_usd(num_queries=num_queries, epochs=epochs, queries_per_s=queries_per_s, usd_per_gpu_hour=usd_per_hour)
    return CostEstimate(
        num_queries=num_queries,
        epochs=epochs,
        queries_per_s=queries_per_s,
        usd_per_hour=usd_per_hour,
        hours=hours,
        usd=usd,
        provider=provider,
        price_date=price_date,
        gpu=gpu,
    )


def _sort_key(row: CostRow) -> tuple[int, float, str]:
    return (row.usd is None, row.usd if row.usd is not None else 0.0, row.gpu)


def _batch_sizes_by_gpu(gpus: Sequence[str], batch_sizes: Mapping[str, int]) -> dict[str, int]:
    """Fixed batch per catalog GPU name; "*" applies to every GPU. A key that names no GPU of `gpus` is an error."""
    names = {resolve_gpu_name(g).gpu.name for g in gpus}
    out = dict.fromkeys(names, batch_sizes["*"]) if "*" in batch_sizes else {}
    for key, batch in batch_sizes.items():
        if batch < 1:
            raise TunecostError(f"batch size must be >= 1, got {batch} for {key}")
        if key == "*":
            continue
        name = resolve_gpu_name(key).gpu.name
        if name not in names:
            raise TunecostError(f"--batch-size names {key}, which is not among the GPUs ({', '.join(gpus)})")
        out[name] = batch
    return out


def estimate_costs(
    *,
    model: str,
    gpus: Sequence[str],
    epochs: float,
    num_queries: int | None = None,
    dataset: str | None = None,
    method: str = "qlora",
    experts_per_token: int | None = None,
    estimator: str = "paper",
    provider: str | None = None,
    prices_file: Path | None = None,
    seq_len: int | None = None,
    calibrate: Path | None = None,
    coefficient_set: str = "artifact",
    batch_sizes: Mapping[str, int] | None = None,
    run_queries: int | None = None,
) -> list[CostRow]:
    """One row per (GPU, provider price), sorted by cost (rows without a price or throughput last).
    `batch_sizes` fixes the batch per GPU (keys: GPU names as in `gpus`, or "*" for every GPU). `run_queries`:
    price the throughput of runs of that many queries, start-up included, as the paper measured it (calibrated
    estimator only); default: steady state."""
    if not gpus:
        raise TunecostError("give at least one GPU (--gpu A40,H100,...)")
    if epochs <= 0:
        raise TunecostError(f"epochs must be > 0, got {epochs}")
    spec = resolve_model(model)
    dataset_name = dataset or DEFAULT_THROUGHPUT_DATASET
    if num_queries is None:
        if dataset is None:
            raise TunecostError("give --queries N or --dataset D (known: " + ", ".join(dataset_catalog()) + ")")
        num_queries = get_dataset_facts(dataset).num_queries
        dataset_name = get_dataset_facts(dataset).name
    if num_queries <= 0:
        raise TunecostError(f"number of queries must be > 0, got {num_queries}")
    k = spec.default_experts_per_token if experts_per_token is None else experts_per_token
    func = get_estimator(estimator)
    prices = price_catalog(prices_file)
    rows: list[CostRow] = []
    done: set[str] = set()
    fixed = _batch_sizes_by_gpu(gpus, batch_sizes or {})
    for gpu_name in gpus:
        resolved = resolve_gpu_name(gpu_name)
        gpu = resolved.gpu
        if gpu.name in done:  # named twice (or by two aliases): one set of rows
            continue
        done.add(gpu.name)
        req = EstimateRequest(
            spec=spec,
            gpu=gpu,
            method=method,
            experts_per_token=k,
            dataset=dataset_name,
            seq_len=seq_len,
            calibrate=calibrate,
            coefficient_set=coefficient_set,
            batch_size=fixed.get(gpu.name),
            run_queries=run_queries,
        )
        point = func(req)
        notes = list(point.notes)
        if resolved.via_alias:
            notes.insert(0, f"{resolved.via_alias!r} resolved to {gpu.name}")
        gpu_prices = prices_for(gpu.name, prices, provider)
        if not gpu_prices:
            notes.append(f"no price for {gpu.name}" + (f" from {provider}" if provider else "") + " in the catalog")
        interval = point.queries_per_s_interval
        choices: list[Price | None] = [*gpu_prices] if gpu_prices else [None]
        for price in choices:
            hours = usd = None
            if point.queries_per_s is not None and point.queries_per_s > 0:
                hours = (
                    training_seconds(num_queries=num_queries, epochs=epochs, queries_per_s=point.queries_per_s) / 3600.0
                )
                if price is not None:
                    usd = cost_usd(
                        num_queries=num_queries,
                        epochs=epochs,
                        queries_per_s=point.queries_per_s,
                        usd_per_gpu_hour=price.usd_per_gpu_hour,
                    )
            rows.append(
                CostRow(
                    model=spec.name,
                    dataset=dataset_name,
                    gpu=gpu.name,
                    provider=price.provider if price else None,
                    price_date=price.date if price else None,
                    price_source=price.source_url if price else None,
                    usd_per_hour=price.usd_per_gpu_hour if price else None,
                    max_batch_size=point.max_batch_size,
                    batch_size=point.batch_size,
                    queries_per_s=point.queries_per_s,
                    queries_per_s_low=interval[0] if interval else None,
                    queries_per_s_high=interval[1] if interval else None,
                    num_queries=num_queries,
                    epochs=epochs,
                    hours=hours,
                    usd=usd,
                    estimator=estimator,
                    notes="; ".join(notes),
                    extrapolation=point.extrapolation,
                )
            )
    return sorted(rows, key=_sort_key)
