"""`tunecost gpus`, `tunecost models`, `tunecost prices`: the catalogs."""

from __future__ import annotations

from typing import Any

import typer

from tunecost.cli.common import cli_errors, print_json, print_table
from tunecost.cli.options import Gpu, JsonOut, PricesFile, Provider


@cli_errors
def gpus(json_out: JsonOut = False) -> None:
    """The GPU catalog: memory, bandwidth, peak throughput, with sources."""
    from tunecost.catalog.gpus import gpu_catalog

    rows = list(gpu_catalog().values())
    if json_out:
        print_json(
            [
                {
                    **g.__dict__,
                    "memory_bytes": g.memory_bytes,
                    "usable_memory_bytes": g.usable_memory_bytes,
                    "supports_bf16": g.supports_bf16,
                    "supports_fp8": g.supports_fp8,
                }
                for g in rows
            ]
        )
        return
    print_table(
        "GPUs (datasheet, dense)",
        [
            "name",
            "vendor",
            "aliases",
            "memory GiB",
            "CUDA GiB",
            "bandwidth TB/s",
            "BF16 TFLOP/s",
            "FP8 TFLOP/s",
            "FP32 TFLOP/s",
        ],
        [
            [
                g.name,
                g.vendor,
                ", ".join(g.aliases),
                f"{g.memory_gib:g}",
                "-" if g.cuda_memory_gib is None else f"{g.cuda_memory_gib:.2f}",
                f"{g.mem_bandwidth_bytes_per_s / 1e12:.3g}",
                f"{g.bf16_tensor_flops_per_s / 1e12:g}" + ("" if g.supports_bf16 else " (FP16: no bf16)"),
                "-" if g.fp8_tensor_flops_per_s is None else f"{g.fp8_tensor_flops_per_s / 1e12:g}",
                f"{g.fp32_flops_per_s / 1e12:g}",
            ]
            for g in rows
        ],
        caption=(
            "CUDA GiB: the total CUDA reports (below the datasheet by the driver's reserve, and ECC's 1/16 on GDDR6 "
            "cards with ECC on), what fits are decided against; '-': not stored, the datasheet figure is used. "
            "FP8 '-': no FP8 tensor cores (--fp8 refuses the card). "
            "Sources per figure: tunecost gpus --json"
        ),
    )


@cli_errors
def models(json_out: JsonOut = False) -> None:
    """The model catalog, with parameter counts computed from each config (total and active per token)."""
    from tunecost.models.catalog import model_catalog
    from tunecost.models.params import count_parameters

    out: list[dict[str, Any]] = []
    for spec in model_catalog().values():
        counts = count_parameters(spec)
        out.append(
            {
                "name": spec.name,
                "family": spec.family,
                "hub_id": spec.hub_id,
                "layers": spec.num_layers,
                "hidden_size": spec.hidden_size,
                "vocab_size": spec.vocab_size,
                "num_experts": spec.num_experts,
                "experts_per_token": spec.default_experts_per_token,
                "total_params": counts.total,
                "active_params": counts.active,
                "published_total_params": spec.published_total_params,
                "source": spec.source,
                "as_of": spec.as_of,
            }
        )
    if json_out:
        print_json(out)
        return
    print_table(
        "Models (parameter counts computed from the config)",
        ["name", "family", "layers", "hidden", "experts", "top-k", "total (B)", "active (B)", "hub id"],
        [
            [
                m["name"],
                m["family"],
                m["layers"],
                m["hidden_size"],
                m["num_experts"],
                m["experts_per_token"],
                f"{m['total_params'] / 1e9:.2f}",
                f"{m['active_params'] / 1e9:.2f}",
                m["hub_id"] or "-",
            ]
            for m in out
        ],
    )


@cli_errors
def prices(
    gpu: Gpu = None,
    provider: Provider = None,
    prices_file: PricesFile = None,
    json_out: JsonOut = False,
) -> None:
    """The price catalog: $ per GPU-hour per provider, with the date and source of each price."""
    from tunecost.catalog.gpus import resolve_gpu_name
    from tunecost.catalog.prices import price_catalog, price_label, prices_for

    rows = price_catalog(prices_file)
    if gpu or provider:
        names = [resolve_gpu_name(gpu).gpu.name] if gpu else sorted({p.gpu for p in rows})
        rows = [p for name in names for p in prices_for(name, rows, provider, whole_nodes=True)]
    rows = sorted(rows, key=lambda p: (p.gpu, p.usd_per_gpu_hour))
    if json_out:
        print_json(rows)
        return
    print_table(
        "GPU prices ($ per GPU-hour, on demand)",
        ["gpu", "provider", "$/h", "rented as", "date", "source"],
        [
            [p.gpu, price_label(p), f"{p.usd_per_gpu_hour:.2f}", _unit_text(p.gpus_per_unit), p.date, p.source_url]
            for p in rows
        ],
    )


def _unit_text(gpus_per_unit: int) -> str:
    return "1 GPU" if gpus_per_unit == 1 else f"{gpus_per_unit}-GPU node"


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus)
    app.command("models")(models)
    app.command("prices")(prices)
