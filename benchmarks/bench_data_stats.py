"""Validate tunecost's sequence-length statistics on the real LLM-Adapters / GSM8K files.

Prints, for every file under DATA_DIR (the argument, else $TUNECOST_DATA_DIR, else ./data):
query count, min / median / p90 / p99 / max tokens with the offline Mixtral tokenizer and the ``none`` template
(BOS + tokens of prompt + ground-truth response, no EOS) and the paper's LLaMA-Factory ``mistral`` template, and
checks the published statistics: GSM8K test 1319 queries with a median within 2 % of 162 tokens, and the
commonsense test sets' medians within 40..110 (the paper's CS median is 79, Fig. 2).

    .venv/bin/python benchmarks/bench_data_stats.py [DATA_DIR]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tunecost.workload.datasets import load_dataset
from tunecost.workload.lengths import length_distribution
from tunecost.workload.templates import template_by_name
from tunecost.workload.tokenizers import tokenizer_by_name

COMMONSENSE_TESTS = ("boolq", "piqa", "social_i_qa", "ARC-Challenge", "ARC-Easy", "openbookqa", "winogrande")


def default_data_dir() -> Path:
    env = os.environ.get("TUNECOST_DATA_DIR")
    if env:
        return Path(env.split(os.pathsep)[0])
    return Path("data")


def main(argv: list[str]) -> int:
    data_dir = Path(argv[1]) if len(argv) > 1 else default_data_dir()
    files = sorted(data_dir.glob("llm-adapters/*.json")) + sorted(data_dir.glob("gsm8k/*.jsonl"))
    if not files:
        print(f"no data files under {data_dir}")
        return 1
    tok = tokenizer_by_name("mistral")
    none, mistral = template_by_name("none"), template_by_name("mistral")
    print(f"tokenizer: {tok.name}")
    print(
        f"{'file':34s} {'format':12s} {'queries':>7s} {'min':>5s} {'median':>7s} {'p90':>6s} {'p99':>6s} "
        f"{'max':>5s} {'median(mistral tmpl)':>21s} {'s':>5s}"
    )
    medians: dict[str, tuple[int, float]] = {}
    for path in files:
        start = time.perf_counter()
        ds = load_dataset(str(path))
        d = length_distribution(ds, tok, none)
        m = length_distribution(ds, tok, mistral)
        medians[path.name] = (d.num_queries, d.median_tokens)
        print(
            f"{path.name:34s} {ds.format:12s} {d.num_queries:7d} {d.min_tokens:5d} {d.median_tokens:7.1f} "
            f"{d.percentile(90):6.1f} {d.percentile(99):6.1f} {d.max_tokens:5d} {m.median_tokens:21.1f} "
            f"{time.perf_counter() - start:5.2f}"
        )

    failures = []
    count, median = medians.get("gsm8k_test.json", (0, float("nan")))
    ok = count == 1319 and abs(median - 162) <= 0.02 * 162
    print(f"\nGSM8K test: {count} queries, median {median} tokens (target 1319, 162 +/- 2 %): {'OK' if ok else 'FAIL'}")
    if not ok:
        failures.append("gsm8k")
    for name in COMMONSENSE_TESTS:
        key = f"{name}_test.json"
        if key not in medians:
            continue
        _, median = medians[key]
        ok = 40 <= median <= 110
        print(f"{key:26s} median {median:6.1f} (target 40..110): {'OK' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
