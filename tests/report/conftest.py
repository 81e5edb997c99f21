"""Fixture run directories for the report tests, written by the tests themselves (docs/dev/records.md).

`write_run(run_dir, ...)` writes realistic records of every kind the report reads: profiler-style rows
(throughput, stages, layers, kernels, expert_load), trainability, lengths, max_batch, gpu counters, and the
demo's real fit/estimate stages (`tunecost.demo._stage_fit` / `_stage_estimate`), plus `meta.json`.
The numbers are synthetic but shaped like real runs (seeded, so every run of the tests sees the same values).
`html_tables(page)` parses the report's tables per section (stdlib only: no lxml/bs4 in the venv).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tunecost.io import atomic_write_json
from tunecost.results.records import record
from tunecost.results.schema import point_id

PROFILE_KINDS = ("throughput", "stages", "layers", "kernels", "expert_load")
ALL_KINDS = (
    *PROFILE_KINDS,
    *("trainability", "lengths", "max_batch", "counters", "fit", "estimate", "validation", "multi_gpu", "ranks"),
    "plan",
)
TINY = {"model": "tiny-mixtral", "method": "lora", "seq_len": 128, "dataset": "commonsense_15k", "device": "cpu"}
GPU_DEVICE = "NVIDIA H100 80GB HBM3"
# The profiler's two architectures (the demo profiles both); blackmamba's mixer is "mamba" instead of "attention".
PROFILE_MODELS = ("tiny-mixtral", "tiny-blackmamba")


def _row(kind: str, workload: dict[str, Any], **values: Any) -> dict[str, Any]:
    return record(kind, **workload, point_id=point_id(workload), **values)


def _tiny(k: int, batch_size: int, model: str = "tiny-mixtral") -> dict[str, Any]:
    return {**TINY, "model": model, "experts_per_token": k, "batch_size": batch_size}


def _throughput(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    for model, speed in zip(PROFILE_MODELS, (1.0, 2.2)):
        for k in (2, 8):
            for b in (1, 2, 4, 8):
                qps = speed * (1.4 if k == 2 else 1.0) * (2.0 + 3.0 * math.log(b)) * rng.uniform(0.95, 1.05)
                n = 8 * b
                yield _row(
                    "throughput",
                    _tiny(k, b, model),
                    queries_per_s=qps,
                    tokens_per_s=qps * TINY["seq_len"],
                    num_queries=n,
                    seconds=n / qps,
                    steps=8,
                )


def _stages(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    # Three repeats per point (a resumed sweep), so the report's median over rows differs from their mean.
    for model, scale in zip(PROFILE_MODELS, (1.0, 0.5)):
        for k in (2, 8):
            for b in (2, 4):
                for repeat in range(3):
                    fwd = scale * 0.012 * b * (1.0 if k == 2 else 2.6) * rng.uniform(0.8, 1.3)
                    parts = {
                        "forward": fwd,
                        "backward": 2.1 * fwd * rng.uniform(0.9, 1.1),
                        "optimizer": 0.004 * rng.uniform(0.9, 1.1),
                    }
                    parts["step"] = sum(parts.values())
                    for stage, seconds in parts.items():
                        yield _row("stages", _tiny(k, b, model), stage=stage, seconds=seconds, steps=5, repeat=repeat)


def _layers(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    for model in PROFILE_MODELS:
        mixer = "attention" if model == "tiny-mixtral" else "mamba"
        scale = {"norm": 2e-5, mixer: 4e-4, "moe_router": 6e-5, "moe_experts": 2.2e-3}
        for k in (2, 8):
            w = _tiny(k, 4, model)
            for step in range(3):
                for pass_, factor in (("forward", 1.0), ("backward", 2.0), ("recompute", 1.0)):
                    for layer in range(4):
                        for comp, s in scale.items():
                            s = s * factor * (1.0 if k == 2 or comp != "moe_experts" else 3.5)
                            yield _row(
                                "layers",
                                w,
                                **{"pass": pass_},
                                layer_index=layer,
                                component=comp,
                                seconds=s * rng.uniform(0.8, 1.2),
                                step=step,
                            )
                    if pass_ != "recompute":
                        for comp, s in (("embedding", 3e-5), ("lm_head_loss", 9e-4)):
                            yield _row(
                                "layers",
                                w,
                                **{"pass": pass_},
                                layer_index=None,
                                component=comp,
                                seconds=s * factor * rng.uniform(0.8, 1.2),
                                step=step,
                            )


def _kernels(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    classes = {
        "matmul_w1_gate": 0.30,
        "matmul_w3_up": 0.30,
        "matmul_w2_down": 0.28,
        "lora": 0.10,
        "softmax": 0.02,
        "topk": 0.02,
        "router": 0.03,
        "elementwise": 0.08,
        "other": 0.01,
    }
    for model in PROFILE_MODELS:
        for k in (2, 8):
            for cls, s in classes.items():
                yield _row(
                    "kernels",
                    _tiny(k, 4, model),
                    kernel_class=cls,
                    seconds=s * (1 if k == 2 else 3) * rng.uniform(0.9, 1.1),
                    count=int(rng.integers(40, 400)),
                    source="torch.profiler",
                )


def _expert_load(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    num_tokens, k, experts = 4 * 128, 2, 8
    skewed = np.array([0.26, 0.18, 0.14, 0.12, 0.10, 0.09, 0.06, 0.05])
    for model in PROFILE_MODELS:
        for phase, p in (("before", np.full(experts, 1 / experts)), ("after", skewed)):
            for layer in range(4):
                tokens = rng.multinomial(num_tokens * k, rng.permutation(p))
                for e, t in enumerate(tokens):
                    yield _row(
                        "expert_load", _tiny(k, 4, model), phase=phase, layer_index=layer, expert=e, tokens=int(t)
                    )


def _trainability(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    for routing, k, top in (("dense", 8, 0.84), ("sparse", 2, 0.79)):
        for epoch in range(1, 6):
            acc = round(top * (1 - math.exp(-0.9 * epoch)) + rng.uniform(-0.02, 0.02), 3)
            yield _row(
                "trainability",
                {**TINY, "experts_per_token": k, "batch_size": 8},
                routing=routing,
                epoch=epoch,
                accuracy=acc,
                train_loss=2.5 * math.exp(-0.5 * epoch),
                num_eval=200,
            )


def _lengths(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    for dataset, median in (("commonsense_15k", 79.0), ("math_14k", 148.0)):
        for length in np.rint(rng.lognormal(math.log(median), 0.35, size=300)).astype(int):
            yield record(
                "lengths",
                **{
                    "dataset": dataset,
                    "tokenizer": "mistral-7b-v0.1 (sentencepiece)",
                    "template": "alpaca",
                    "length": int(length),
                },
            )


def _max_batch(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    gpus = {"L4-24GB": 24, "A100-40GB": 40, "A40-48GB": 48, "H100-80GB-SXM": 80, "H200-141GB": 141}
    for k in (2, 8):
        for source, estimator, slack in (("eq1", "paper", 1.0), ("simulated", "simulate", 0.9)):
            for gpu, mem in gpus.items():
                per_query_gb = 2.9 if k == 2 else 3.4
                mbs = max(0, int(slack * (mem - 23.35) / per_query_gb))
                yield record(
                    "max_batch",
                    **{
                        "model": "mixtral-8x7b",
                        "method": "qlora",
                        "experts_per_token": k,
                        "seq_len": 512,
                        "dataset": "math_14k",
                        "device": "none",
                        "gpu": gpu,
                        "gpu_memory_gb": mem,
                        "memory_bytes": int(mem * 1e9),
                        "max_batch_size": mbs,
                        "source": source,
                        "estimator": estimator,
                    },
                )


def _counters(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    base = {"matmul_w1_gate": (55, 40), "matmul_w2_down": (50, 45), "dequantize": (20, 70), "softmax": (8, 30)}
    for b in (1, 4, 16):
        for cls, (sm, dram) in base.items():
            for launch in range(6):
                w = {**TINY, "device": GPU_DEVICE, "experts_per_token": 2, "batch_size": b}
                yield _row(
                    "counters",
                    w,
                    kernel_name=f"{cls}_kernel",
                    kernel_class=cls,
                    nvtx_ranges=["moe"],
                    duration_s=float(rng.uniform(2e-5, 9e-5) * b**0.5),
                    sm_pct=float(min(99, sm * (1 + 0.25 * math.log2(b)) * rng.uniform(0.9, 1.1))),
                    dram_pct=float(min(99, dram * rng.uniform(0.9, 1.1))),
                    mem_pct=None,
                    launch_id=launch,
                    source="ncu",
                )


def _validation(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    """`tunecost validate` rows: peak memory of two stacks, a throughput row, an oom row, skipped rows."""

    def row(i: int, quantity: str, measured: float | None, predicted: float | None, unit: str, **rest: Any):
        error = None if predicted is None or measured is None else 100.0 * (predicted - measured) / measured
        base = {"id": f"src-{i:02d}", "quantity": quantity, "measured": measured, "predicted": predicted}
        return record("validation", **base, unit=unit, error=error, **rest)

    for i in range(12):
        measured = float(rng.uniform(8.0, 70.0))
        stack = ("hf-trainer", "torchtune")[i % 2]
        yield row(
            i,
            "peak_allocated_gib",
            measured,
            measured * rng.uniform(0.85, 1.15),
            "GiB",
            status="ok",
            reason="",
            stack=stack,
            fits=i != 3,  # tunecost's verdict on the setting of a run that fit: wrong once
        )
    yield row(12, "tokens_per_s_per_gpu", 2100.0, 1890.0, "tokens/s", status="ok", reason="", stack="hf-trainer")
    yield {**row(13, "oom", 1.0, 1.0, "bool", status="ok", reason="", stack="hf-trainer"), "error": 0.0}
    yield row(14, "nvidia_smi_gib", 30.0, None, "GiB", status="skipped", reason="multi-GPU row", stack="")


def _multi_gpu(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    """Setups of one job: DDP holds the whole model per rank (never fits), FSDP2 shards it (fits from 2 GPUs)."""
    for strategy in ("ddp", "fsdp2"):
        for n in (1, 2, 4, 8):
            need = 100e9 if strategy == "ddp" else 100e9 / n + 5e9
            fits = need <= 85.9e9
            yield record(
                "multi_gpu",
                **{
                    "model": "mixtral-8x7b",
                    "method": "lora",
                    "batch_size": 1,
                    "seq_len": 512,
                    "gpu": "H100-80GB-SXM",
                    "strategy": strategy,
                    "num_gpus": n,
                    "gpus_per_node": 8,
                    "fits": fits,
                    "need_bytes": need,
                    "gpu_memory_bytes": 85.9e9,
                    "step_seconds": 1.0 + float(rng.uniform(0, 0.1)) if fits else None,
                    "exposed_comm_share": 0.01 if fits else None,
                    "usd": 90.0 + n if fits else None,
                },
            )


def _ranks(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    for rank in (0, 1):
        step = 2.0 + float(rng.uniform(0, 0.2))
        yield record(
            "rank",
            **{
                "point_id": "tiny-mixtral-lora-kmodel-fsdp2-n2-bs2-seq64",
                "rank": rank,
                "world_size": 2,
                "strategy": "fsdp2",
                "device": "cpu",
                "median_step_seconds": step,
                "comm_seconds": 0.2,
                "peak_allocated_bytes": None,
                "peak_rss_bytes": 1.0e9,
                "collectives": {"all_gather": {"count": 10, "bytes": 2**20}},
                "slowest": rank == 1,
            },
        )


def _plan(rng: np.random.Generator) -> Iterable[dict[str, Any]]:
    """`tunecost plan --out` rows: LoRA and QLoRA on two GPUs at 1, 2 and 4 GPUs (more GPUs: faster and dearer),
    a deadline that rules out the slowest, one setup that does not fit (no time); the front and the answer."""
    rows: list[dict[str, Any]] = []
    for method, gpu, base_h, base_usd in (
        ("lora", "H100-80GB-SXM", 2.0, 6.0),
        ("lora", "RTX4090-24GB", 6.0, 4.0),
        ("qlora", "RTX4090-24GB", 9.0, 5.0),
    ):
        for n in (1, 2, 4):
            hours = base_h / n**0.9 * float(rng.uniform(0.97, 1.03))
            usd = base_usd * n**0.1 * float(rng.uniform(0.97, 1.03))
            why_not = "past deadline: x h > 8 h" if hours > 8 else ""
            rows.append({"method": method, "gpu": gpu, "num_gpus": n, "hours": hours, "usd": usd, "why_not": why_not})
    miss = "does not fit: micro-batch 1 needs 90 GB per rank of 80 GB"
    rows.append({"method": "qlora", "gpu": "H100-80GB-SXM", "num_gpus": 1, "hours": None, "usd": None, "why_not": miss})
    front: list[dict[str, Any]] = []
    for r in sorted((r for r in rows if r["hours"] is not None and not r["why_not"]), key=lambda r: r["usd"]):
        if not front or r["hours"] < front[-1]["hours"]:
            front.append(r)
    for r in rows:
        ends = {
            f"{k}_{e}": None if r[k] is None else r[k] * f
            for k in ("hours", "usd")
            for e, f in (("low", 0.8), ("high", 1.25))
        }
        yield record(
            "plan_option",
            **{
                "model": "qwen2.5-0.5b",
                "goal": "cheapest within the deadline",
                **r,
                **ends,
                "strategy": "single" if r["num_gpus"] == 1 else "ddp",
                "offload": "none",
                "owned": False,
                "micro_batch": 8,
                "accumulation": 1,
                "fits": r["hours"] is not None,
                "provider": "cudo",
                "on_front": any(r is f for f in front),
                "recommended": r is front[0],
            },
        )


_WRITERS: dict[str, Callable[[np.random.Generator], Iterable[dict[str, Any]]]] = {
    "throughput": _throughput,
    "stages": _stages,
    "layers": _layers,
    "kernels": _kernels,
    "expert_load": _expert_load,
    "trainability": _trainability,
    "lengths": _lengths,
    "max_batch": _max_batch,
    "counters": _counters,
    "validation": _validation,
    "multi_gpu": _multi_gpu,
    "ranks": _ranks,
    "plan": _plan,
}

META = {
    "schema_version": 1,
    "tool": "tunecost",
    "tool_version": "0.1.0",
    "git_revision": "0123456789abcdef",
    "created": "2026-01-02T03:04:05+00:00",
    "device": {"kind": "cpu", "name": "Test CPU", "torch": "2.13.0", "cuda": None, "num_threads": 2},
    "versions": {"torch": "2.13.0", "transformers": "5.23.0", "peft": "0.21.2", "bitsandbytes": "0.50.2"},
    "command": "tunecost demo --out runs/test",
    "workloads": [],
}


def write_run(
    run_dir: Path,
    *,
    kinds: Iterable[str] = ALL_KINDS,
    drop_columns: dict[str, tuple[str, ...]] | None = None,
    schema_version: dict[str, int] | None = None,
    seed: int = 0,
) -> Path:
    """Write `kinds` records into `run_dir`; `drop_columns[kind]` removes keys from every row of that kind;
    `schema_version[kind]` rewrites that kind's rows in an older format version."""
    from tunecost.demo import _stage_estimate, _stage_fit

    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "meta.json", META)
    rng = np.random.default_rng(seed)
    kinds = tuple(kinds)
    if "fit" in kinds:
        _stage_fit(run_dir, None)
    if "estimate" in kinds:
        # Only the paper's estimator: "simulate"/"calibrated" run the step simulator (minutes on 2 cores); the
        # report only needs estimate rows in the demo's format, which every estimator shares.
        import tunecost.estimate.estimators as estimators

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(estimators, "estimator_names", lambda: {"paper": "the paper's eq. (1) and (2)"})
            _stage_estimate(run_dir, None)
    for kind in kinds:
        if kind in _WRITERS:
            # append_jsonl's line format, without its fsync per row (thousands of rows per run dir)
            lines = [json.dumps(row, default=str) + "\n" for row in _WRITERS[kind](rng)]
            with open(run_dir / f"{kind}.jsonl", "a", encoding="utf-8") as fh:
                fh.writelines(lines)
    for kind, cols in (drop_columns or {}).items():
        _rewrite(run_dir / f"{kind}.jsonl", lambda r, cols=cols: {k: v for k, v in r.items() if k not in cols})
    for kind, version in (schema_version or {}).items():
        _rewrite(run_dir / f"{kind}.jsonl", lambda r, v=version: {**r, "schema_version": v})
    return run_dir


def _rewrite(path: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    path.write_text("".join(json.dumps(change(r)) + "\n" for r in rows), encoding="utf-8")


def read_rows(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    path = run_dir / f"{kind}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class _Tables(HTMLParser):
    """Collect each `<table>` as (header, rows) under the `id` of the `<h2>` before it."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[tuple[list[str], list[list[str]]]]] = {}
        self.section = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._header: list[str] = []
        self._rows: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self.section = dict(attrs).get("id") or ""
        elif tag == "table":
            self._header, self._rows = [], []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if not self._header:
                self._header = self._row
            else:
                self._rows.append(self._row)
            self._row = None
        elif tag == "table":
            self.tables.setdefault(self.section, []).append((self._header, self._rows))


def html_tables(page: str) -> dict[str, list[dict[str, str]]]:
    """The first table of each shown section, as a list of {column: cell text} rows."""
    parser = _Tables()
    parser.feed(page)
    return {key: [dict(zip(header, row)) for row in rows] for key, [(header, rows), *_] in parser.tables.items()}


@pytest.fixture(scope="session")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with every kind of record (shared by the read-only tests; do not modify it)."""
    return write_run(tmp_path_factory.mktemp("full") / "run")


@pytest.fixture(scope="session")
def full_report(full_run: Path):
    """The report of `full_run`, built once (matplotlib rendering of 11 sections takes a few seconds)."""
    from tunecost.report.html import build_report

    return build_report(full_run)


@pytest.fixture(scope="session")
def full_page(full_report) -> str:
    return full_report.html_path.read_text(encoding="utf-8")


@pytest.fixture
def make_run() -> Callable[..., Path]:
    """`write_run` for tests (conftest helpers are not importable under --import-mode=importlib)."""
    return write_run


@pytest.fixture(scope="session")
def tables() -> Callable[[str], dict[str, list[dict[str, str]]]]:
    return html_tables


@pytest.fixture(scope="session")
def rows() -> Callable[[Path, str], list[dict[str, Any]]]:
    return read_rows
