"""Measure the token-length statistics that src/tunecost/catalog/data/datasets.csv records for the datasets with a
local copy (LLM-Adapters files and GSM8K), with the real Mixtral tokenizer and the paper's prompt template.

Each query is counted as the paper's trainer sees it: LLaMA-Factory's ``mistral`` template (BOS + ``[INST] {prompt}
[/INST]`` + response + EOS, the two slots tokenized separately; tunecost.workload.templates), the offline Mixtral
(mistral-v1 SentencePiece) tokenizer, the prompt built as tunecost.workload.datasets builds it (LLM-Adapters:
instruction + "\\n" + input; GSM8K: question, response: the full worked answer). Prints a table: queries, median,
p95, max and mean tokens per catalog row, then the CSV cells, and with --check exits 1 when the catalog differs.

    .venv/bin/python benchmarks/dataset_lengths.py [DATA_DIR] [--check]   # DATA_DIR default: /work/shared/data

The library never reads DATA_DIR; the numbers reach it only through the catalog file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tunecost.catalog.datasets import dataset_catalog
from tunecost.workload.datasets import load_dataset
from tunecost.workload.lengths import LengthDistribution, length_distribution
from tunecost.workload.templates import template_by_name
from tunecost.workload.tokenizers import tokenizer_by_name

DEFAULT_DATA_DIR = Path("/work/shared/data")
TOKENIZER = "mistral"  # tunecost's offline Mixtral tokenizer (mistral-v1)
TEMPLATE = "mistral"  # LLaMA-Factory's template as the paper used it
P95 = 95.0

# catalog row -> file under DATA_DIR (only the rows whose data is present here)
LOCAL_FILES: dict[str, str] = {
    "gsm8k": "llm-adapters/gsm8k_test.json",
    "gsm8k-train": "gsm8k/train.jsonl",
    "math_data": "llm-adapters/math_data.json",
}


@dataclass(frozen=True, kw_only=True)
class Measured:
    name: str
    path: Path
    dist: LengthDistribution

    @property
    def cells(self) -> dict[str, str]:
        """The catalog cells this measurement fills (integers where the statistic is one)."""
        return {
            "median_tokens": f"{self.dist.median_tokens:g}",
            "p95_tokens": f"{self.dist.percentile(P95):g}",
            "max_tokens": str(self.dist.max_tokens),
            "mean_tokens": f"{self.dist.mean_tokens:.1f}",
        }


def measure(data_dir: Path) -> list[Measured]:
    tokenizer = tokenizer_by_name(TOKENIZER)
    template = template_by_name(TEMPLATE)
    out = []
    for name, rel in LOCAL_FILES.items():
        path = data_dir / rel
        if not path.is_file():
            print(f"{name}: {path} not found, skipped")
            continue
        dist = length_distribution(load_dataset(str(path)), tokenizer, template)
        out.append(Measured(name=name, path=path, dist=dist))
    return out


def check_catalog(measured: list[Measured]) -> list[str]:
    """Differences between the measurements and the catalog rows (queries and the length cells)."""
    catalog = dataset_catalog()
    problems = []
    for m in measured:
        facts = catalog.get(m.name)
        if facts is None:
            problems.append(f"{m.name}: not in the catalog")
            continue
        if facts.num_queries != m.dist.num_queries:
            problems.append(f"{m.name}: catalog {facts.num_queries} queries, file {m.dist.num_queries}")
        recorded = {
            "median_tokens": facts.median_tokens,
            "p95_tokens": facts.p95_tokens,
            "max_tokens": facts.max_tokens,
            "mean_tokens": facts.mean_tokens,
        }
        for column, cell in m.cells.items():
            value = recorded[column]
            if value is None or abs(value - float(cell)) > 1e-6:
                problems.append(f"{m.name}: {column} catalog {value}, measured {cell}")
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", nargs="?", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the catalog's cells differ")
    args = parser.parse_args(argv)
    data_dir = args.data_dir or Path(os.environ.get("TUNECOST_DATA_DIR", str(DEFAULT_DATA_DIR)).split(os.pathsep)[0])
    start = time.perf_counter()
    measured = measure(data_dir)
    if not measured:
        print(f"no catalog dataset found under {data_dir}")
        return 1
    print(f"tokenizer {TOKENIZER} (Mixtral, mistral-v1), template {TEMPLATE} (BOS + [INST] p [/INST] + r + EOS)")
    print(f"{'dataset':<13} {'file':<32} {'queries':>7} {'median':>7} {'p95':>7} {'max':>6} {'mean':>7}")
    for m in measured:
        c = m.cells
        rel = m.path.relative_to(data_dir)
        print(
            f"{m.name:<13} {rel!s:<32} {m.dist.num_queries:>7} {c['median_tokens']:>7} "
            f"{c['p95_tokens']:>7} {c['max_tokens']:>6} {c['mean_tokens']:>7}"
        )
    print("\ncatalog cells (median_tokens,p95_tokens,max_tokens,mean_tokens):")
    for m in measured:
        print(f"{m.name}: " + ",".join(m.cells.values()))
    print(f"\n({time.perf_counter() - start:.1f} s)")
    if args.check:
        problems = check_catalog(measured)
        for p in problems:
            print("MISMATCH", p)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
