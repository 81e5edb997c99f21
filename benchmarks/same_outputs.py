"""Behaviour check for refactors: the `--json` output of a fixed set of commands, saved and compared.

`python benchmarks/same_outputs.py --out DIR` runs every command below into DIR (one file each); `--compare A B`
says identical or differing per command and exits 1 on any difference. Run it from the repository root with the
code under test importable (PYTHONPATH=src); it uses a fresh cache folder per run unless `--cache DIR` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_CORPUS = ROOT / "tests" / "fixtures" / "validation" / "small.csv"
PUBLISHED_CORPUS = ROOT.parent / "shared" / "validation" / "published_measurements.csv"
PAPER_MEASUREMENTS = ROOT / "tests" / "fixtures" / "measurements" / "measured_throughput_a40.csv"
# Fields that change from run to run (wall-clock time), dropped before a file is written.
VOLATILE_KEYS = frozenset({"seconds_taken", "created_at", "started_at", "finished_at", "elapsed_s", "hostname"})
# Where the package was imported from (a checkout, a copy of one) shows in the paths of its bundled data.
PACKAGE_PATH = re.compile(r"[^\s\"']*/src/tunecost/")

MIXTRAL_QLORA = ["--model", "mixtral-8x7b", "--method", "qlora", "--epochs", "3", "--queries", "10000"]
DENSE_LORA = ["--model", "llama-3.1-8b", "--method", "lora", "--epochs", "1", "--dataset", "math_14k"]
FULL = ["--model", "blackmamba-2.8b", "--method", "full", "--epochs", "2", "--queries", "5000"]

COMMANDS: dict[str, list[str]] = {
    "estimate_dense_lora": ["estimate", *DENSE_LORA, "--gpu", "A100-80GB-SXM,H100-80GB-SXM"],
    "estimate_mixtral_qlora": ["estimate", *MIXTRAL_QLORA, "--gpu", "A40-48GB,A100-80GB-SXM,H100-80GB-SXM"],
    "estimate_mixtral_paper": ["estimate", *MIXTRAL_QLORA, "--gpu", "A40-48GB", "--estimator", "paper"],
    "estimate_mixtral_simulate": ["estimate", *MIXTRAL_QLORA, "--gpu", "A100-80GB-SXM", "--estimator", "simulate"],
    "estimate_full": ["estimate", *FULL, "--gpu", "A100-80GB-SXM,H100-80GB-SXM", "--batch-size", "4"],
    "estimate_torchtune": [
        "estimate",
        *DENSE_LORA,
        "--gpu",
        "H100-80GB-SXM",
        "--stack",
        "torchtune",
        "--chunked-loss",
    ],
    "estimate_gpus_4": ["estimate", *DENSE_LORA, "--gpu", "H100-80GB-SXM", "--gpus", "4", "--strategy", "ddp,fsdp2"],
    "estimate_gpus_auto": [
        "estimate",
        "--model",
        "mixtral-8x7b",
        "--method",
        "lora",
        "--epochs",
        "1",
        "--dataset",
        "math_14k",
        "--gpu",
        "H100-80GB-SXM,A100-80GB-SXM",
        "--gpus",
        "auto",
        "--max-gpus",
        "8",
        "--strategy",
        "ddp,fsdp2",
    ],
    "estimate_tp_pp": [
        "estimate",
        *["--model", "meta-llama/Llama-2-70b-hf", "--method", "full", "--gpu", "H100", "--gpus", "16"],
        *["--tp", "8", "--pp", "2", "--epochs", "1", "--queries", "10000"],
    ],
    "estimate_nemo_config": [
        "estimate",
        *["--config", str(ROOT / "tests" / "fixtures" / "configs" / "mlperf_llama2_70b_lora_nemo.yaml")],
        *["--model", "meta-llama/Llama-2-70b-hf", "--gpu", "H100", "--epochs", "1", "--queries", "3000"],
    ],
    "memory_mixtral_qlora": ["memory", "--model", "mixtral-8x7b", "--method", "qlora", "--gpu", "A100-80GB-SXM"],
    "memory_dense_lora": ["memory", "--model", "llama-3.1-8b", "--method", "lora", "--batch-size", "4"],
    "memory_full_gb": ["memory", "--model", "blackmamba-2.8b", "--method", "full", "--gpu-memory-gb", "40"],
    "memory_liger": ["memory", "--model", "llama-3.1-8b", "--method", "full", "--batch-size", "3", "--liger-kernel"],
    "estimate_liger": [
        "estimate",
        *["--model", "qwen2.5-0.5b", "--method", "lora", "--gpu", "RTX3080-10GB", "--seq-len", "1024"],
        *["--queries", "1000", "--epochs", "1", "--liger-kernel"],
    ],
    "max_batch": ["max-batch", "--model", "tiny-mixtral", "--device", "cpu", "--gpu", "A40-48GB", "--seq-len", "128"],
    "plan": [
        "plan",
        *DENSE_LORA,
        "--gpu",
        "H100-80GB-SXM,A100-80GB-SXM",
        "--max-gpus",
        "8",
        "--deadline",
        "10",
    ],
    "plan_moe": [
        "plan",
        *["--model", "mixtral-8x7b", "--method", "lora", "--gpu", "H100-80GB-SXM", "--max-gpus", "8"],
        *["--epochs", "1", "--queries", "14000"],
    ],
    "predict": ["predict", "--model", "mixtral-8x7b", "--gpu", "A40-48GB", "--batch-size", "4", "--dataset", "gsm8k"],
    "fit": ["fit", str(PAPER_MEASUREMENTS)],
    "cost": ["cost", "--queries", "10000", "--epochs", "3", "--throughput", "2.5", "--gpu", "H100-80GB-SXM"],
    "validate_fixture": ["validate", str(FIXTURE_CORPUS)],
}
if PUBLISHED_CORPUS.is_file():
    COMMANDS["validate_published"] = ["validate", str(PUBLISHED_CORPUS)]

# The demo's stages that run in seconds on a CPU, each on its own; their records are the output.
DEMO_STAGES = ("fit", "estimate")
DEMO_SNIPPET = (
    "import sys; from pathlib import Path; from tunecost.demo import STAGES; "
    "[s.run(Path(sys.argv[2]), None) for s in STAGES if s.name == sys.argv[1]]"
)


def _drop_volatile(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _drop_volatile(v) for k, v in obj.items() if k not in VOLATILE_KEYS}
    if isinstance(obj, list):
        return [_drop_volatile(v) for v in obj]
    return obj


def _normalised(text: str) -> str:
    with contextlib.suppress(ValueError):  # not JSON (an error message): compared as it is
        text = json.dumps(_drop_volatile(json.loads(text)), indent=2, sort_keys=True) + "\n"
    return _portable(text)


def _portable(text: str) -> str:
    return PACKAGE_PATH.sub("<src>/tunecost/", text)


def _run(argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    return f"exit {proc.returncode}\n{_normalised(proc.stdout)}"


def _wanted(name: str, only: list[str] | None, skip: list[str] | None) -> bool:
    return (not only or name in only) and not (skip and name in skip)


def record(out: Path, cache: Path | None, only: list[str] | None, skip: list[str] | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="same_outputs_") as tmp:
        env = {**os.environ, "TUNECOST_CACHE_DIR": str(cache or Path(tmp) / "cache"), "HF_HUB_OFFLINE": "1"}
        for name, args in COMMANDS.items():
            if not _wanted(name, only, skip):
                continue
            start = time.perf_counter()
            text = _run([sys.executable, "-m", "tunecost.cli.main", *args, "--json"], env)
            (out / f"{name}.txt").write_text(text)
            print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
        for stage in DEMO_STAGES:
            name = f"demo_{stage}"
            if not _wanted(name, only, skip):
                continue
            start = time.perf_counter()
            folder = Path(tmp) / name
            status = _run([sys.executable, "-c", DEMO_SNIPPET, stage, str(folder)], env)
            records = "".join(
                f"== {p.name}\n" + "".join(_normalised(line) for line in p.read_text().splitlines())
                for p in sorted(folder.glob("*.jsonl"))
            )
            (out / f"{name}.txt").write_text(status + records)
            print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)


def compare(a: Path, b: Path) -> int:
    """Each command's output in A beside B's; a command B did not run (--only, --skip) is listed, not failed."""
    names = sorted({p.name for p in a.glob("*.txt")} | {p.name for p in b.glob("*.txt")})
    differing = not_run = 0
    for name in names:
        pa, pb = a / name, b / name
        if not pb.is_file():
            print(f"{name}: not run in {b}")
            not_run += 1
            continue
        if not pa.is_file():
            print(f"{name}: missing in {a}")
            differing += 1
            continue
        ta, tb = _portable(pa.read_text()), _portable(pb.read_text())
        if ta == tb:
            print(f"{name}: identical")
            continue
        differing += 1
        print(f"{name}: DIFFERS")
        diff = difflib.unified_diff(ta.splitlines(), tb.splitlines(), str(pa), str(pb), lineterm="", n=1)
        for line in list(diff)[:20]:
            print(f"    {line}")
    print(f"{len(names) - differing - not_run} identical, {differing} differing, {not_run} not run")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="Folder to write one output file per command into.")
    group.add_argument("--compare", type=Path, nargs=2, metavar=("DIR_A", "DIR_B"))
    parser.add_argument("--cache", type=Path, help="Cache folder to use (default: a fresh temporary one).")
    parser.add_argument("--only", nargs="+", help="Run only these commands (names as in the output folder).")
    parser.add_argument("--skip", nargs="+", help="Leave these commands out (validate_published takes minutes).")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    record(args.out, args.cache, args.only, args.skip)
    return 0


if __name__ == "__main__":
    sys.exit(main())
