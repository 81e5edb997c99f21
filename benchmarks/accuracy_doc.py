"""Write docs/accuracy.md from `tunecost validate` on a measurement corpus (default: the shipped one), beside
accelerate's estimate-memory, the bytes-per-parameter rule and DeepSpeed's model-states estimators computed on the
same rows; `--readme` rewrites the accuracy table between README.md's accuracy markers from the same figures.

    PYTHONPATH=src python benchmarks/accuracy_doc.py [--corpus FILE ...] [--out docs/accuracy.md] [--force] [--readme]

Simulations are cached (tunecost's simulate cache), so a second run takes seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# the shipped model catalog only (a model outside it is not fetched from the Hub): the same page with or without network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from tunecost.catalog.held_out_errors import THROUGHPUT_QUANTITIES as THROUGHPUT
from tunecost.io import atomic_write_text
from tunecost.units import BYTES_PER_GIB
from tunecost.validate import read_corpus, summarize, validate_rows
from tunecost.validate.baselines import accelerate_estimate_bytes, deepspeed_estimate_bytes, rule_estimate_bytes
from tunecost.validate.mapping import PEAK_MEMORY_QUANTITIES as PEAK
from tunecost.validate.mapping import Skip, map_row
from tunecost.validate.stacks import STACKS
from tunecost.validate.summary import memory_totals, throughput_totals
from tunecost.validate.throughput import AT_BOUND_REASON

BASELINES = ("accelerate", "rule", "DeepSpeed")


def baseline_bytes(name: str, mapped) -> float:
    """Per-GPU bytes of a baseline for a mapped row (accelerate and the rule divided over the row's GPUs;
    DeepSpeed's estimators take the GPU count themselves)."""
    job = mapped.job
    if name == "DeepSpeed":
        return deepspeed_estimate_bytes(job.model, mapped.num_gpus)
    fn = accelerate_estimate_bytes if name == "accelerate" else rule_estimate_bytes
    return fn(job.model, job.method) / mapped.num_gpus


ESTIMATORS = ("tunecost", *BASELINES)


@dataclass(frozen=True)
class Comparison:
    """tunecost and the baselines on the same modelled rows."""

    peak: dict[str, tuple[int, dict[str, float | None]]]  # quantity (and "all peak") -> rows, median abs % error
    oom_rows: int
    oom_right: Counter[str]
    ran_rows: int  # peak-memory rows that ran on a catalog GPU
    false_oom: dict[str, int]

    @property
    def verdict_rows(self) -> int:
        return self.ran_rows + self.oom_rows

    @property
    def verdict_right(self) -> dict[str, int]:
        return {n: self.ran_rows - self.false_oom[n] + self.oom_right[n] for n in ESTIMATORS}


def _compare(results, by_id) -> Comparison:
    ok = [r for r in results if r.status == "ok"]
    mapped_of = {r.id: map_row(by_id[r.id]) for r in ok if r.quantity in (*PEAK, "oom")}
    peak: dict[str, tuple[int, dict[str, float | None]]] = {}
    for quantity in (*PEAK, "all peak"):
        sel = [r for r in ok if (r.quantity == quantity or (quantity == "all peak" and r.quantity in PEAK))]
        if not sel:
            continue
        errs: dict[str, list[float]] = {name: [] for name in ESTIMATORS}
        for r in sel:
            mapped = mapped_of[r.id]
            measured = r.measured or 0.0
            for name in BASELINES:
                est = baseline_bytes(name, mapped) / BYTES_PER_GIB
                errs[name].append(abs(est - measured) / measured * 100)
            errs["tunecost"].append(abs(r.error or 0.0))
        peak[quantity] = (len(sel), {n: _median(errs[n]) for n in ESTIMATORS})
    oom = [r for r in ok if r.quantity == "oom"]
    oom_right: Counter[str] = Counter()
    for r in oom:
        mapped = mapped_of[r.id]
        gpu = mapped.gpu_memory_bytes or 0
        oom_right["tunecost"] += r.error == 0
        for name in BASELINES:
            oom_right[name] += (baseline_bytes(name, mapped) > gpu) == (r.measured == 1.0)
    ran = [(r, mapped_of[r.id]) for r in ok if r.quantity in PEAK and mapped_of[r.id].gpu_memory_bytes]
    false_oom = {n: sum(baseline_bytes(n, m) > m.gpu_memory_bytes for _r, m in ran) for n in BASELINES}
    false_oom["tunecost"] = sum(r.fits is False for r, _m in ran)
    return Comparison(peak, len(oom), oom_right, len(ran), false_oom)


def _f(v, fmt="{:.1f}"):
    return "" if v is None else fmt.format(v)


def _pct(part, whole) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"


def _median(xs):
    return statistics.median(xs) if xs else None


def _multi_gpu_lines(results, by_id) -> list[str]:
    """Rows on several GPUs (one rank each, `distributed.rank_memory`): their own error, per quantity."""
    multi = [r for r in results if r.status == "ok" and map_row(by_id[r.id]).num_gpus > 1]
    if not multi:
        return []
    parts = []
    for quantity in PEAK:
        ape = [abs(r.error) for r in multi if r.quantity == quantity and r.error is not None]
        if ape:
            parts.append(f"{quantity} {len(ape)} rows, median absolute error {_f(_median(ape))} %")
    oom = [r for r in multi if r.quantity == "oom"]
    if oom:
        parts.append(f"out-of-memory {sum(1 for r in oom if r.error == 0)} of {len(oom)} right")
    thr = [r for r in multi if r.quantity in THROUGHPUT and r.error is not None]
    if thr:
        mape, signed = statistics.fmean(abs(r.error) for r in thr), _median([r.error for r in thr])
        parts.append(
            f"throughput {len(thr)} rows, mean absolute error {_f(mape)} % (median signed {_f(signed, '{:+.1f}')} %; "
            "per-rank compute from the single-GPU calibration, exposed communication from `distributed.timing`)"
        )
    return [
        "Rows on several GPUs (FSDP full shard under accelerate: each predicted as one rank of fsdp1, derived from "
        "the single-GPU simulated step, `src/tunecost/distributed/rank_memory.py`, its reserve from the caching "
        "allocator replayed per CUDA stream over the rank's allocations, `rank_reserve.py`): " + "; ".join(parts) + ".",
        "",
    ]


def _throughput_stack_lines(results) -> list[str]:
    """Throughput per stack: rows predicted, their mean absolute % error, and the groups whose calibration row no
    GEMM efficiency reproduces (predicted at the end of its range)."""
    thr = [r for r in results if r.quantity in THROUGHPUT]
    lines = ["| stack | rows | calibration rows | predicted | mean absolute % error |", "|---|---|---|---|---|"]
    for stack in sorted({r.stack for r in thr if r.stack}):
        of = [r for r in thr if r.stack == stack]
        ape = [abs(r.error) for r in of if r.status == "ok" and r.error is not None]
        cal = sum(1 for r in of if r.status == "ok" and r.error is None)
        mape = _f(statistics.fmean(ape)) + " %" if ape else "-"
        lines.append(f"| {stack} | {len(of)} | {cal} | {len(ape)} | {mape} |")
    at_bound = Counter(
        r.reason.split("; ")[0] for r in thr if r.status == "ok" and r.reason.startswith(AT_BOUND_REASON)
    )
    return [*lines, "", *(f"- {n} rows: {reason}." for reason, n in sorted(at_bound.items())), ""]


@dataclass(frozen=True)
class Validated:
    """`tunecost validate` on a corpus: its rows by id and the results."""

    by_id: dict
    results: list


def validated(corpus_paths: list[Path] | None) -> Validated:
    rows = read_corpus(corpus_paths)
    return Validated({r.id: r for r in rows}, validate_rows(rows))


README_START = "<!-- accuracy:start (benchmarks/accuracy_doc.py --readme) -->"
README_END = "<!-- accuracy:end -->"


def readme_table(v: Validated) -> str:
    """The README's one accuracy table: tunecost beside the baselines on the shipped corpus."""
    results, by_id = v.results, v.by_id
    totals, thr, cmp = memory_totals(results), throughput_totals(results), _compare(results, by_id)
    blank = " |" * len(BASELINES)
    header = {"accelerate": "accelerate estimate-memory", "rule": "16/2/0.5 bytes per parameter"}
    header["DeepSpeed"] = "DeepSpeed ZeRO estimator"
    lines = [
        "| median absolute % error, unless a count | rows | tunecost | "
        + " | ".join(header[n] for n in BASELINES)
        + " |",
        "|---|---|---|" + "---|" * len(BASELINES),
        f"| memory rows modelled (count) | {totals['memory_rows']} | {totals['memory_rows_modelled']} |{blank}",
    ]
    names = {"all peak": "peak memory", "peak_allocated_gib": "peak allocated (torch)"}
    names |= {"peak_reserved_gib": "peak reserved (torch)", "nvidia_smi_gib": "peak nvidia-smi"}
    for quantity in ("all peak", *PEAK):
        if quantity in cmp.peak:
            n, medians = cmp.peak[quantity]
            lines.append(f"| {names[quantity]} | {n} | " + " | ".join(_f(medians[m]) for m in ESTIMATORS) + " |")
    if cmp.oom_rows and cmp.ran_rows:
        right = cmp.verdict_right
        lines.append(
            f"| fits / out-of-memory verdict right (count) | {cmp.verdict_rows} | "
            + " | ".join(str(right[n]) for n in ESTIMATORS)
            + " |"
        )
    lines.append(f"| throughput (mean absolute % error) | {thr['predicted_rows']} | {_f(thr['mape'])} |{blank}")
    multi = [r for r in results if r.status == "ok" and map_row(by_id[r.id]).num_gpus > 1]
    multi_thr = [abs(r.error) for r in multi if r.quantity in THROUGHPUT and r.error is not None]
    if multi_thr:
        lines.append(
            f"| throughput on 2 and 4 GPUs (mean absolute % error) | {len(multi_thr)} | "
            f"{_f(statistics.fmean(multi_thr))} |{blank}"
        )
    return "\n".join(lines) + "\n"


def readme_block(v: Validated) -> str:
    return f"{README_START}\n{readme_table(v)}{README_END}"


def replace_readme_block(text: str, block: str) -> str:
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"no {README_START} ... {README_END} block")
    return text[:start] + block + text[end + len(README_END) :]


def render(v: Validated) -> str:
    results, by_id = v.results, v.by_id
    totals = memory_totals(results)
    thr = throughput_totals(results)
    lines = [
        "# How accurate is tunecost? Peak memory and throughput against published measurements",
        "",
        "Generated by `PYTHONPATH=src python benchmarks/accuracy_doc.py` from `tunecost validate` on the shipped "
        "corpus (`src/tunecost/catalog/data/validation/`, its README gives the sources). Every number below is "
        "recomputed by that command; rows tunecost cannot model are listed with the reason.",
        "",
        "## Headline",
        "",
    ]
    n_mem, n_modelled = int(totals["memory_rows"] or 0), int(totals["memory_rows_modelled"] or 0)
    share = n_modelled / n_mem * 100 if n_mem else 0.0
    lines += [
        "| figure | tunecost | target |",
        "|---|---|---|",
        f"| memory rows modelled | {totals['memory_rows_modelled']} of {totals['memory_rows']} ({share:.0f} %) "
        "| >= 80 % |",
        f"| peak memory median absolute % error ({totals['peak_rows_modelled']} rows) | "
        f"{_f(totals['peak_median_abs_pct_error'])} % | <= 10 % |",
        f"| fits/out-of-memory verdict right, rows that state one | {totals['verdict_right']} of "
        f"{totals['verdict_rows']} ({_pct(totals['verdict_right'], totals['verdict_rows'])}) | >= 90 % |",
        f"| of which: fits, on peak-memory rows that ran | {totals['fits_right']} of {totals['ran_rows_modelled']} | |",
        f"| of which: out of memory, on oom rows | {totals['oom_right']} of {totals['oom_rows_modelled']} "
        f"({_pct(totals['oom_right'], totals['oom_rows_modelled'])}) | |",
        f"| throughput mean absolute % error ({thr['predicted_rows']} rows predicted, {thr['calibration_rows']} "
        f"calibration rows, of {thr['throughput_rows']}) | {_f(thr['mape'])} % (median "
        f"{_f(thr['median_abs_pct_error'])} %) | 20 % MAPE |",
        "",
        "Throughput: the throughput model's step time (`estimate/throughput/`, docs/throughput-model.md) per "
        "row: analytic counts per op class of one micro-batch (matmuls, causal FlashAttention-2, LoRA adapters, "
        "4-bit de-quantization, element-wise work, the loss, kernel launches), repeated over the row's gradient "
        "accumulation plus one optimizer step; a roofline per class on what the GPU achieves "
        "(`catalog/data/gpu_achieved.csv`), with the launch time per kernel and the host time per step. Launches "
        "add to the GPU time where the host waits for the GPU in every layer (an eager routed-expert MoE loop), "
        "and hide under it, as a smooth maximum, where it waits only between micro-steps (a dense model under a "
        "trainer; docs/throughput-model.md, 'Synchronisation and overlap'). The host "
        "terms, the memory efficiency and the GEMM half-rows are the centres of the model's priors "
        "(`estimate/throughput/priors.py`), the same for every stack, not fitted to these rows; one parameter, the "
        "GEMM efficiency, is solved per (stack, GPU) from one calibration row: the group's row with the most FLOPs "
        "per optimizer step in the counts (the work the efficiency scales; a rule on the counts, never on a "
        "measurement), first in file order on a tie (`src/tunecost/validate/throughput.py`). A plugin named "
        "in a row's stack (fms-acceleration's accelerated-peft-bnb) is a stack of its own. Calibration rows are "
        "listed with reason 'calibration row' and left out of the error. A compiled row counts each layer's "
        "element-wise chains fused (Inductor) and a torchtune row with activation offload its host copies beside "
        "the compute (docs/throughput-model.md). Rows whose settings the counts do not represent (offload without "
        "checkpointing or on several GPUs, a full fine-tune under a stack whose optimizer step is not torch "
        "AdamW's) are skipped with the reason, as is every row of a group whose calibration row no GEMM "
        "efficiency reproduces. A row on "
        "several GPUs is its own single-GPU step plus the communication its compute does not hide "
        "(`distributed.timing`: FSDP's collectives over the GPU's node link, nccl-tests' bus bandwidths, prefetch "
        "overlap), its optimizer step over the rank's shard of the states (1/N under FSDP and ZeRO), with its "
        "stack's single-GPU efficiency; it calibrates only a group without a single-GPU row, on its fewest GPUs.",
        "",
    ]
    lines += _throughput_stack_lines(results)
    lines += _multi_gpu_lines(results, by_id)
    signed = [r.error for r in results if r.status == "ok" and r.quantity in PEAK and r.error is not None]
    below = sum(1 for e in signed if e < 0)
    lines += [
        f"tunecost predicts below the measurement on {below} of {len(signed)} peak rows (median signed error "
        f"{_f(_median(signed), '{:+.1f}')} %): what the named stacks list as not modelled (fp32 casts, larger "
        "CUDA contexts of older stacks, allocator fragmentation) adds memory; none of it is fitted to these rows.",
        "",
        "## Beside what users estimate with today (same rows)",
        "",
        "accelerate: `accelerate estimate-memory`'s figures computed with its own functions on the meta-device "
        "model (full fine-tune: its 'Training using Adam' column; LoRA/QLoRA: its bf16/int4 load size, as it has "
        "no adapter estimate). Rule: 16 bytes per parameter for a full fine-tune, the weights alone for LoRA "
        "(2 B/param) and QLoRA (0.5 B/param). On a row of N GPUs under FSDP both are divided by N (every state "
        "sharded). DeepSpeed: its model-states estimators (`estimate_zero2_model_states_mem_needs` for a row on "
        "one GPU, `estimate_zero3_model_states_mem_needs` on N GPUs for a row under FSDP full shard; "
        "`src/tunecost/distributed/deepspeed_estimator.py`), which count every parameter as trainable. Error is "
        "(estimate - measured) / measured; oom: the estimate exceeds the GPU's memory.",
        "",
        "| quantity | rows | tunecost median abs % | accelerate median abs % | rule median abs % | "
        "DeepSpeed median abs % |",
        "|---|---|---|---|---|---|",
    ]
    cmp = _compare(results, by_id)
    for quantity, (n, medians) in cmp.peak.items():
        lines.append(f"| {quantity} | {n} | " + " | ".join(_f(medians[m]) for m in ESTIMATORS) + " |")
    if cmp.oom_rows:
        lines.append(
            f"| oom (right) | {cmp.oom_rows} | " + " | ".join(str(cmp.oom_right[n]) for n in ESTIMATORS) + " |"
        )
    if cmp.oom_rows and cmp.ran_rows:
        lines.append(
            f"| fits/oom verdict (right) | {cmp.verdict_rows} | "
            + " | ".join(str(cmp.verdict_right[n]) for n in ESTIMATORS)
            + " |"
        )
        lines += [
            "",
            f"Every one of the {cmp.oom_rows} rows that state out of memory ran out of it, so an estimate above the "
            "GPU's memory everywhere gets them all right; on the "
            f"{cmp.ran_rows} peak-memory rows that ran (on a GPU in the catalog), the estimate exceeds the GPU's "
            "memory "
            + ", ".join(f"{cmp.false_oom[n]} times for {n}" for n in ESTIMATORS)
            + " (a false out-of-memory).",
        ]
    lines += [
        "",
        "## Per quantity and stack",
        "",
        "| quantity | stack | rows | modelled | median abs % error | within 10 % | oom right |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summarize(results):
        lines.append(
            f"| {s.quantity} | {s.stack} | {s.rows} | {s.modelled} | {_f(s.median_abs_pct_error)} | "
            f"{_f(s.within_10pct, '{}')} | {_f(s.right, '{}')} |"
        )
    lines += ["", "## Named stacks", ""]
    for st in STACKS.values():
        sim = st.simulator_stack or "not simulated"
        lines.append(
            f"- **{st.name}** (simulator stack: {sim}). Kept for backward: {st.kept_for_backward}. "
            f"Loss: {st.loss}. Adapters: {st.adapters}. Allocator: {st.allocator}."
        )
        for item in st.not_modelled:
            lines.append(f"  - not modelled: {item}")
    lines += ["", "## Rows skipped, by reason", "", "| rows | reason |", "|---|---|"]
    for reason, n in Counter(r.reason for r in results if r.status == "skipped").most_common():
        lines.append(f"| {n} | {reason} |")
    lines += [
        "",
        "## Every modelled row",
        "",
        "| id | model | method | batch x seq | quantity | measured | predicted | unit | error | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in results if r.status == "ok"):
        c = by_id[r.id]
        lines.append(
            f"| {r.id} | {c.get('model')} | {c.get('method')} | {c.get('batch_size_per_gpu')} x {c.get('seq_len')} "
            f"| {r.quantity} | {r.measured:g} | {r.predicted:g} | {r.unit} | {_f(r.error, '{:+.1f}')} | {r.reason} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, nargs="*", default=None)
    parser.add_argument("--out", type=Path, default=None, help="default docs/accuracy.md, unless --readme")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument(
        "--readme",
        type=Path,
        nargs="?",
        const=Path("README.md"),
        default=None,
        help="rewrite the accuracy block of this README (default README.md) instead of --out",
    )
    args = parser.parse_args(argv)
    out = args.out or (None if args.readme else Path("docs/accuracy.md"))
    if out is not None and out.exists() and not args.force:
        print(f"error: {out} exists; pass --force to replace it", file=sys.stderr)
        return 2
    if args.readme is not None:
        replace_readme_block(args.readme.read_text(), "")  # the markers are there before anything runs
    try:
        v = validated(args.corpus or None)
    except Skip as exc:  # pragma: no cover - rows are mapped before
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.readme is not None:
        atomic_write_text(args.readme, replace_readme_block(args.readme.read_text(), readme_block(v)))
        print(f"wrote the accuracy block of {args.readme}")
    if out is not None:
        atomic_write_text(out, render(v))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
