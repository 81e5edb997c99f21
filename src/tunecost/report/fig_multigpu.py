"""Several GPUs: the estimated cost and memory per rank against the number of GPUs (`multi_gpu.jsonl`, written
by `tunecost estimate --gpus ... --out RUN` and the demo), and what each rank measured in a multi-rank profile
(`ranks.jsonl`, written by `tunecost profile --nproc-per-node N`)."""

from __future__ import annotations

import pandas as pd

from tunecost.report.base import FigureResult, _need, _plt
from tunecost.report.run_dir import RunRecords
from tunecost.units import BYTES_PER_GIB

SETUP_COLUMNS = ("model", "method", "gpu", "strategy", "num_gpus", "fits", "need_bytes", "gpu_memory_bytes")
RANK_COLUMNS = ("point_id", "rank", "world_size", "strategy", "device", "median_step_seconds", "comm_seconds")


def fig_cost_vs_gpus(records: RunRecords) -> FigureResult | str:
    df = _need(records, "multi_gpu", SETUP_COLUMNS)
    if isinstance(df, str):
        return df
    df = df.assign(**{c: None for c in ("usd", "step_seconds", "exposed_comm_share") if c not in df.columns})
    plt = _plt()
    fig, (ax_mem, ax_cost) = plt.subplots(1, 2, figsize=(10.0, 3.8))
    strategies = sorted(set(df["strategy"]))
    gpus = sorted(set(df["gpu"]))
    for (gpu, strategy), sel in df.sort_values("num_gpus").groupby(["gpu", "strategy"], sort=True):
        style = {
            "color": f"C{strategies.index(strategy) % 10}",
            "marker": "os^vD"[gpus.index(gpu) % 5],
            "linestyle": ("-", "--", ":", "-.")[gpus.index(gpu) % 4],
            "label": f"{strategy} on {gpu}",
        }
        ax_mem.plot(sel["num_gpus"], sel["need_bytes"].astype(float) / 1e9, **style)
        fits = sel[sel["fits"].astype(bool) & sel["usd"].notna()]
        if not fits.empty:
            ax_cost.plot(fits["num_gpus"], fits["usd"].astype(float), **style)
    memories = df.groupby("gpu")["gpu_memory_bytes"].first()
    for memory in sorted(set(memories)):
        names = ", ".join(g for g, m in memories.items() if m == memory)
        ax_mem.axhline(float(memory) / 1e9, color="grey", linestyle="--", linewidth=0.8)
        ax_mem.text(1, float(memory) / 1e9, f" {names} memory", fontsize=7, va="bottom", color="grey")
    counts = sorted({int(n) for n in df["num_gpus"]})
    for ax in (ax_mem, ax_cost):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.minorticks_off()
        ax.set_xlabel("number of GPUs")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    ax_mem.set_ylabel("memory per rank (GB)")
    ax_cost.set_ylabel("cost of the fine-tune (USD)")
    ax_cost.set_title("setups that fit", fontsize=9)
    fig.tight_layout()
    table = df[[*SETUP_COLUMNS[2:5], "fits", "step_seconds", "exposed_comm_share", "usd"]].copy()
    table.insert(4, "memory/rank GB", (df["need_bytes"].astype(float) / 1e9).round(1))
    first = df.iloc[0]
    caption = (
        f"{first['model']} ({first['method']}): memory each rank needs (dashed: the GPU's memory) and the cost of the "
        "fine-tune for the setups that fit, per strategy. Estimated, not measured: per-rank memory from the "
        "simulated single-GPU step scaled per strategy, step time from the throughput model and the overlap model."
    )
    return FigureResult(fig, caption, table.sort_values(["gpu", "strategy", "num_gpus"]))


def fig_ranks(records: RunRecords) -> FigureResult | str:
    df = _need(records, "ranks", RANK_COLUMNS)
    if isinstance(df, str):
        return df
    points = list(df.groupby("point_id", sort=True))
    plt = _plt()
    fig, axes = plt.subplots(1, len(points), figsize=(4.2 * len(points), 3.4), squeeze=False)
    for ax, (point, sel) in zip(axes[0], points, strict=False):
        sel = sel.sort_values("rank")
        step = sel["median_step_seconds"].astype(float)
        comm = sel["comm_seconds"].astype(float)
        ax.bar(sel["rank"].astype(str), step - comm, color="C0", label="step without communication calls")
        ax.bar(sel["rank"].astype(str), comm, bottom=step - comm, color="C3", label="communication calls")
        ax.set_title(str(point), fontsize=8)
        ax.set_xlabel("rank")
        ax.set_ylabel("median step (s)")
        ax.set_ylim(0, float(step.max()) * 1.45)  # room for the legend above the bars
        ax.legend(fontsize=7, loc="upper center")
    fig.tight_layout()
    memory = df["peak_allocated_bytes"] if "peak_allocated_bytes" in df.columns else None
    if memory is None or memory.isna().all():
        memory = df.get("peak_rss_bytes", pd.Series([None] * len(df)))
    table = df[["point_id", "rank", "device", "median_step_seconds", "comm_seconds"]].copy()
    table["peak GiB"] = (memory.astype(float) / BYTES_PER_GIB).round(2)
    table["collectives"] = [
        ", ".join(f"{op} {c['count']}x" for op, c in sorted((v or {}).items())) for v in df.get("collectives", [])
    ]
    caption = (
        "Measured per rank (`tunecost profile --nproc-per-node`): median step, and the part spent in collective "
        "calls (NCCL kernel time on CUDA; on CPU the host time of gloo's c10d calls). Peak memory is CUDA's max "
        "allocated, or on CPU the process's peak resident set (interpreter and libraries included). The slowest "
        "rank's step is the job's step."
    )
    return FigureResult(fig, caption, table.sort_values(["point_id", "rank"]))
