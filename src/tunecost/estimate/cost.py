"""Cost tables: for a model and a list of GPUs, the batch size, throughput, hours and dollars per provider."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tunecost.catalog.datasets import dataset_catalog, get_dataset_facts
from tunecost.catalog.gpus import Resolved, fp8_gpu_names, resolve_gpu_name
from tunecost.catalog.prices import Price, price_catalog, prices_for
from tunecost.errors import TunecostError
from tunecost.estimate.estimators import (
    DEFAULT_THROUGHPUT_DATASET,
    EstimatePoint,
    EstimateRequest,
    EstimatorOptions,
    get_estimator,
)
from tunecost.estimate.paper import training_hours, usd_for_hours
from tunecost.estimate.throughput.lora_counts import check_counted_modules
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import (
    DEFAULT_STACK,
    FineTuneJob,
    LoraConfig,
    check_lora_targets,
    default_gradient_checkpointing,
    default_lora_targets,
    quant_defaults,
)


@dataclass(frozen=True, kw_only=True)
class CostRow:
    model: str
    dataset: str | None  # the data whose throughput is priced (None: every query at the job's seq_len)
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
    fit: str = "yes"  # "yes", "borderline" (only inside the safety margin) or "no"
    borderline_batch_size: int = 0  # largest batch within the card without the margin
    startup_s: float = 0.0  # the run's one-off start-up, included in `hours`
    owned: bool = False  # the price row is owned hardware ($0, or its electricity)
    fits: bool = True  # fit == "yes"


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


def check_queries_or_dataset(num_queries: int | None, dataset: str | None) -> None:
    """A cost needs the number of queries, given or from a known dataset."""
    if num_queries is None and dataset is None:
        raise TunecostError("give --queries N or --dataset D (known: " + ", ".join(dataset_catalog()) + ")")


def estimate_job(
    model: str,
    *,
    method: str = "qlora",
    experts_per_token: int | None = None,
    dataset: str | None = None,
    seq_len: int | None = None,
    lora_targets: tuple[str, ...] | None = None,
    stack: str | None = None,
    lengths: tuple[int, ...] | None = None,
    gradient_checkpointing: bool | None = None,
    selective_recompute: bool = False,
    recompute_layers: int | None = None,
    lora_rank: int = 16,
    lora_alpha: float = 32.0,
    lora_dropout: float = 0.0,
    dtype: str | None = None,
    attention: str = "flash",
    packing: str = "none",
    torch_compile: bool = False,
    liger_kernel: bool = False,
    optimizer: str = "adamw",
    quant_type: str | None = None,
    double_quant: bool = True,
    fp8: str = "none",
    fp8_params: bool = False,
    fp32_params: bool = False,
    modules_to_save: tuple[str, ...] = (),
) -> FineTuneJob:
    """The job `tunecost estimate` costs, with the paper's setups as defaults: gradient checkpointing for (Q)LoRA
    and not for a full fine-tune (BlackMamba's), LoRA on the model's MoE layers or, for a dense model, on its
    attention and MLP projections (`default_lora_targets`), and the throughput of the dataset's length distribution
    (cut at `seq_len`; no dataset: Table IV's, or with a `seq_len` every query that long), on `stack` (None:
    tunecost's own). The model is resolved and named as the catalog names it."""
    spec = resolve_model(model)
    if seq_len is not None:
        spec.check_seq_len(seq_len)
    check_counted_modules(modules_to_save)
    targets = lora_targets or default_lora_targets(is_moe=spec.is_moe)
    if method != "full":
        check_lora_targets(targets, model=spec.name, is_moe=spec.is_moe)
    quant_kind, group_size = quant_defaults(model, quant_type, None)
    gptq = method == "qlora" and quant_kind == "gptq"
    return FineTuneJob(
        model=spec.name,
        method=method,  # type: ignore[arg-type]
        lora=LoraConfig(rank=lora_rank, alpha=lora_alpha, targets=targets, dropout=lora_dropout),
        compute_dtype=dtype or ("fp16" if gptq else "bf16"),
        quant_type=quant_kind,
        double_quant=double_quant,
        gptq_group_size=group_size,
        attention=attention,
        packing=packing,
        torch_compile=torch_compile,
        liger_kernel=liger_kernel,
        optimizer=optimizer,
        experts_per_token=experts_per_token,
        gradient_checkpointing=default_gradient_checkpointing(method, selective_recompute)
        if gradient_checkpointing is None
        else gradient_checkpointing,
        selective_recompute=selective_recompute,
        recompute_layers=recompute_layers,
        modules_to_save=modules_to_save,
        seq_len=seq_len,
        lengths=lengths,
        dataset=dataset_name(dataset, lengths) if dataset or seq_len is None else None,
        stack=stack or DEFAULT_STACK,
        fp8=fp8,
        fp8_params=fp8_params,
        fp32_params=fp32_params,
    )


def dataset_name(dataset: str | None, lengths: tuple[int, ...] | None) -> str:
    """The job's dataset as recorded: a data file as given (its lengths measured), a catalog name as the catalog
    spells it, else Table IV's."""
    if not dataset:
        return DEFAULT_THROUGHPUT_DATASET
    return dataset if lengths else get_dataset_facts(dataset).name


def estimate_costs(
    job: FineTuneJob,
    gpus: Sequence[str],
    *,
    epochs: float,
    num_queries: int | None = None,
    options: EstimatorOptions | None = None,
    batch_sizes: Mapping[str, int] | None = None,
    provider: str | None = None,
    prices_file: Path | None = None,
) -> list[CostRow]:
    """One row per (GPU, provider price) for `job` (one GPU each), sorted by cost (rows without a price or
    throughput last). `num_queries`: the queries of one epoch (default: the size of the job's dataset).
    `batch_sizes` fixes the batch per GPU (keys: GPU names as in `gpus`, or "*" for every GPU); a batch larger than
    fits is priced and marked (`CostRow.fits`)."""
    if not gpus:
        raise TunecostError("give at least one GPU (--gpu A40,H100,...)")
    if epochs <= 0:
        raise TunecostError(f"epochs must be > 0, got {epochs}")
    if job.parallel.num_gpus != 1:
        raise TunecostError(f"the cost table models one GPU per job today, not {job.parallel.num_gpus}")
    options = options or EstimatorOptions()
    if num_queries is None:
        check_queries_or_dataset(num_queries, job.dataset)
        assert job.dataset is not None
        facts = get_dataset_facts(job.dataset)
        num_queries, job = facts.num_queries, job.with_(dataset=facts.name)
    if num_queries <= 0:
        raise TunecostError(f"number of queries must be > 0, got {num_queries}")
    func = get_estimator(options.name)
    fixed = _batch_sizes_by_gpu(gpus, batch_sizes or {})
    resolved: dict[
        str, Resolved
    ] = {}  # catalog name -> as named; a GPU named twice (or by two aliases): one set of rows
    for name in gpus:
        named = resolve_gpu_name(name)
        resolved.setdefault(named.gpu.name, named)
    fp8_gpu_names(job.fp8, list(resolved))  # a GPU without FP8 tensor cores: one error before any estimate
    catalog = price_catalog(prices_file)
    prices = {name: prices_for(name, catalog, provider) for name in resolved}  # before any (slow) estimate
    rows: list[CostRow] = []
    for name, named in resolved.items():
        batch = fixed.get(name)
        req = EstimateRequest(
            job=job if batch is None else job.with_(batch_size=batch),
            gpu=named.gpu,
            options=options,
            fixed_batch=batch is not None,
        )
        point = func(req)
        notes = list(point.notes)
        if named.via_alias:
            notes.insert(0, f"{named.via_alias!r} resolved to {name}")
        if not prices[name]:
            notes.append(f"no price for {name}" + (f" from {provider}" if provider else "") + " in the catalog")
        choices: list[Price | None] = [*prices[name]] if prices[name] else [None]
        for price in choices:
            rows.append(_cost_row(req, point, price, num_queries=num_queries, epochs=epochs, notes=notes))
    return sorted(rows, key=_sort_key)


def _cost_row(
    req: EstimateRequest,
    point: EstimatePoint,
    price: Price | None,
    *,
    num_queries: int,
    epochs: float,
    notes: list[str],
) -> CostRow:
    hours = usd = None
    qps = point.queries_per_s
    if qps is not None and qps > 0:
        hours = training_hours(num_queries=num_queries, epochs=epochs, queries_per_s=qps) + point.startup_s / 3600
        if price is not None:
            usd = usd_for_hours(
                hours=hours, usd_per_gpu_hour=price.usd_per_gpu_hour, num_gpus=req.job.parallel.num_gpus
            )
    interval = point.queries_per_s_interval
    return CostRow(
        model=req.spec.name,
        dataset=point.eq2_dataset or req.lengths_dataset,
        gpu=req.gpu.name,
        provider=price.provider if price else None,
        price_date=price.date if price else None,
        price_source=price.source_url if price else None,
        usd_per_hour=price.usd_per_gpu_hour if price else None,
        max_batch_size=point.max_batch_size,
        batch_size=point.batch_size,
        queries_per_s=qps,
        queries_per_s_low=interval[0] if interval else None,
        queries_per_s_high=interval[1] if interval else None,
        num_queries=num_queries,
        epochs=epochs,
        hours=hours,
        usd=usd,
        estimator=req.options.name,
        notes="; ".join(notes),
        extrapolation=point.extrapolation,
        fit=point.fit,
        fits=point.fit == "yes",
        borderline_batch_size=point.borderline_batch_size or point.max_batch_size,
        startup_s=point.startup_s,
        owned=price.owned if price else False,
    )
