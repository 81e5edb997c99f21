"""Bad-input audit of the whole command line: every option of every command, fed values no user should get away
with, run through typer's CliRunner.

The commands and options come from walking the click command tree of `tunecost.cli.main.app`, so a new command or
option is audited without a change here (a new command with required options needs a line in BASE, or the audit
says it has none). Each probe starts from a valid invocation of its command (BASE), replaces one option with a bad
value, and runs in a fresh scratch folder holding a measurements CSV, a targets CSV, a dataset, a run folder, a
file that is not UTF-8, a folder and an unrelated existing file. A probe passes when the command exits with code 2,
prints exactly one `error:` line on stderr and nothing on stdout, shows no traceback, finishes within --timeout
seconds and leaves every file that was in the scratch folder unchanged.

Bad values: '' and '   ' for every option that takes text or a path; -1 and 0 (except where they are valid), nan,
inf, 1e20, 10^20 and 2 x 10^9 (past any GPU, within int32; except counts of queries and seeds) for every option that
takes a value; for every path (and every text option whose help names a file, folder or path): a missing file
(absolute, and a relative path of several parts), a folder, a file that is not UTF-8; for every output (--out,
--output): a path under an existing file, an existing file (no --force), and each input of the same invocation;
for every option of one value the valid invocation gives: the same option given twice.

    PYTHONPATH=src python benchmarks/audit_cli.py [--timeout 20] [--only COMMAND] [--kinds blank,number] [--verbose]

Prints one line per failing probe, the counts, and the commands skipped; exits 1 when any probe failed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"

# A valid invocation of each command ({name} is a file or folder of the scratch folder). Options a probe replaces
# are taken out of it first.
BASE: dict[str, list[str]] = {
    "bench moe": ["--tokens", "8", "--hidden", "16", "--intermediate", "16", "--repeats", "1", "--impls", "eager"],
    "calibrate-gpu": ["--out", "{scratch}/new/profile.json", "--device", "cpu", "--quick"],
    "cost": ["--queries", "1000", "--epochs", "1", "--throughput", "1", "--usd-per-hour", "1"],
    "data list": [],
    "data stats": ["{data}"],
    "demo": ["--out", "{scratch}/demo"],
    "estimate": ["--model", "mixtral-8x7b", "--gpu", "A40", "--epochs", "1", "--queries", "1000"],
    "eval": ["--model", "tiny-mixtral", "--dataset", "synthetic-arith-test", "--limit", "1"],
    "fit": ["{measurements}"],
    "gpu-counters": ["--out", "{scratch}/counters"],
    "gpus": [],
    "max-batch": ["--model", "tiny-mixtral", "--random-weights", "--device", "cpu", "--seq-len", "16"],
    "memory": ["--model", "tiny-mixtral"],
    "models": [],
    "plan": [
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "lora",
        "--gpu",
        "H100",
        "--max-gpus",
        "1",
        "--queries",
        "1000",
        "--epochs",
        "1",
        "--seq-len",
        "128",
    ],
    "predict": ["--input", "{targets}"],
    "prices": [],
    "profile": ["--out", "{scratch}/profile", "--random-weights", "--device", "cpu", "--steps", "1", "--seq-len", "16"],
    "report": ["{run}"],
    "trainability": ["--out", "{scratch}/train", "--epochs", "1", "--num-train", "2", "--num-eval", "2"],
    "validate": [],
}
# Options for which 0 is a valid value (no warm-up, seed 0, the first layer, no LoRA dropout; module "0", the first
# decoder layer, as PEFT's modules_to_save matches a name's last component; a pipeline split that counts the
# embedding or the head as no layer, Megatron's).
ZERO_IS_VALID = {"--warmup", "--warmup-steps", "--seed", "--layers", "--modules-to-save", "--lora-dropout"}
ZERO_IS_VALID |= {"--pp-first-stage-less-layers", "--pp-last-stage-less-layers"}
ZERO_IS_VALID |= {"--usd-per-hour"}  # a price of 0: owned hardware (`CostEstimate`)
# Options for which -1 is a valid value (GPTQ's group size -1: one group over all inputs).
MINUS_ONE_IS_VALID = {"--gptq-group-size"}
LARGE = "2000000000"
# Options (or "command option") for which 2 x 10^9 is a valid value: counts of queries or examples (up to 10^12; past
# a dataset's size they mean all of it) and 32-bit seeds.
LARGE_IS_VALID = {
    "--queries",
    "--run-queries",
    "--num-train",
    "--num-eval",
    "--dataset-limit",
    "--seed",
    "eval --limit",
}
# Commands that stop at a missing device before any work on a machine without one: on such a machine their probes
# show only that the checks before that stop hold.
NEEDS_GPU = {"gpu-counters"}
NUMBERS = ["-1", "0", "nan", "inf", "1e20", "100000000000000000000", LARGE]
BLANKS = ["", "   "]
INPUT_FILES = ("measurements", "targets", "data")


KINDS = ("blank", "number", "file", "output", "repeat")


@dataclass
class Probe:
    command: str
    option: str
    kind: str  # one of KINDS
    bad: str  # the bad value, or what is bad about it
    args: list[str]


@dataclass
class Outcome:
    probe: Probe
    problems: list[str]
    seconds: float


def _command_tree() -> Iterator[tuple[str, Any]]:
    from typer.main import get_command

    from tunecost.cli.main import app

    def walk(command: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            yield " ".join(path), command
            return
        for name, sub in sorted(subcommands.items()):
            yield from walk(sub, [*path, name])

    yield from walk(get_command(app), [])


def _name(param: Any) -> str:
    return next((o for o in param.opts if o.startswith("-")), param.name)


def _is_positional(param: Any) -> bool:
    return not any(o.startswith("-") for o in param.opts)


def _annotation(param: Any) -> Any:
    descriptor = getattr(param, "type_descriptor", None)
    return descriptor.annotation if descriptor is not None else getattr(param, "type", None)


def _without(args: list[str], param: Any, option_params: dict[str, Any]) -> list[str]:
    """`args` without `param` (an option and its value, or the positional argument)."""
    if _is_positional(param):
        return _drop_positional(args)
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in param.opts:
            skip = not getattr(option_params.get(a), "is_flag", False)
            continue
        out.append(a)
    return out


def _drop_positional(args: list[str]) -> list[str]:
    """BASE lists a command's positional argument first when it has one."""
    return args[1:] if args and not args[0].startswith("-") else args


def _with(args: list[str], param: Any, value: str) -> list[str]:
    return [value, *args] if _is_positional(param) else [*args, _name(param), value]


def _mentions_files(param: Any) -> bool:
    words = (getattr(param, "help", None) or "").lower()
    return any(w in words for w in ("file", "folder", "path", "directory"))


def probes(only: str | None = None, kinds: tuple[str, ...] = KINDS) -> tuple[list[Probe], list[str]]:
    """Every probe of every command (of those `kinds`), and the commands the audit could not cover."""
    out: list[Probe] = []
    uncovered: list[str] = []
    for path, command in _command_tree():
        if only and path != only:
            continue
        if path not in BASE:
            uncovered.append(f"{path}: no valid invocation in BASE")
            continue
        params = [p for p in command.params if not getattr(p, "is_flag", False) and p.expose_value]
        option_params = {o: p for p in command.params for o in p.opts}
        for param in params:
            name = _name(param)
            base = _without(BASE[path], param, option_params)
            annotation = _annotation(param)
            takes_path = "Path" in str(annotation)
            is_output = name in ("--out", "--output", "--emit")  # --emit: the folder a recipe is written into
            # a number is a valid file name: paths get the file probes below instead
            valid = {"0"} if name in ZERO_IS_VALID else set()
            valid |= {LARGE} if {name, f"{path} {name}"} & LARGE_IS_VALID else set()
            valid |= {"-1"} if name in MINUS_ONE_IS_VALID else set()
            numbers = [] if takes_path or is_output else [v for v in NUMBERS if v not in valid]
            for value in BLANKS:
                out.append(Probe(path, name, "blank", repr(value), _with(base, param, value)))
            for value in numbers:
                out.append(Probe(path, name, "number", value, _with(base, param, value)))
            given = BASE[path][BASE[path].index(name) + 1] if name in BASE[path] else None
            if given is not None and not param.multiple and not _is_positional(param):
                out.append(Probe(path, name, "repeat", "given twice", [*BASE[path], name, given]))
            if is_output:
                out.append(Probe(path, name, "output", "under an existing file", _with(base, param, "{existing}/sub")))
                out.append(Probe(path, name, "output", "an existing file", _with(base, param, "{existing}")))
                for given in [a for a in base if a.strip("{}") in (*INPUT_FILES, "run")]:
                    target = "{run}/fit.jsonl" if given == "{run}" else given
                    out.append(Probe(path, name, "output", f"the input {given}", _with(base, param, target)))
            elif takes_path or _mentions_files(param):
                missing = (("missing file", "{scratch}/missing.csv"), ("missing relative path", "no/such/file.json"))
                for bad, value in (*missing, ("not UTF-8", "{not_utf8}")):
                    out.append(Probe(path, name, "file", bad, _with(base, param, value)))
                if name != "RUN_DIR" and param.name != "run_dir" and "folder" not in (param.help or "").lower():
                    out.append(Probe(path, name, "file", "a folder", _with(base, param, "{folder}")))
    return [p for p in out if p.kind in kinds], uncovered


def _scratch(template: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="audit-"))
    shutil.copytree(template, folder, dirs_exist_ok=True)
    return folder


def _make_template(root: Path) -> None:
    shutil.copy(FIXTURES / "measurements" / "measured_throughput_a40.csv", root / "measurements.csv")
    (root / "targets.csv").write_text(
        "model,dataset,gpu,experts_per_token,batch_size\nmixtral-8x7b,math_14k,A40,2,4\n", encoding="utf-8"
    )
    shutil.copy(FIXTURES / "data" / "gsm8k_original.jsonl", root / "data.jsonl")
    (root / "not_utf8.bin").write_bytes(bytes(range(128, 256)) * 4)
    (root / "existing.txt").write_text("a file the user already had\n", encoding="utf-8")
    (root / "folder").mkdir()
    from typer.testing import CliRunner

    from tunecost.cli.main import app

    result = CliRunner().invoke(app, ["fit", str(root / "measurements.csv"), "--out", str(root / "run")])
    if result.exit_code != 0:
        raise SystemExit(f"could not make the run folder for `report`: {result.output}")


def _fill(args: list[str], scratch: Path) -> list[str]:
    names = {
        "scratch": scratch,
        "measurements": scratch / "measurements.csv",
        "targets": scratch / "targets.csv",
        "data": scratch / "data.jsonl",
        "run": scratch / "run",
        "not_utf8": scratch / "not_utf8.bin",
        "existing": scratch / "existing.txt",
        "folder": scratch / "folder",
    }
    return [a.format(**{k: str(v) for k, v in names.items()}) for a in args]


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


class Runaway(BaseException):
    """Raised by the alarm in a probe that runs past --timeout (a BaseException: no command may catch it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise Runaway


def run_probe(probe: Probe, template: Path, timeout: float) -> Outcome:
    from typer.testing import CliRunner

    from tunecost.cli.main import app

    scratch = _scratch(template)
    before = _digests(scratch)
    problems: list[str] = []
    start = time.perf_counter()
    cwd = os.getcwd()
    os.chdir(scratch)  # a relative path a command writes lands in the scratch folder
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        result = CliRunner().invoke(app, _fill(probe.command.split() + probe.args, scratch))
    except Runaway:
        result = None
        problems.append(f"runaway (> {timeout:g} s)")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(cwd)
    seconds = time.perf_counter() - start
    if result is not None:
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            problems.append(f"traceback: {type(result.exception).__name__}: {str(result.exception)[:120]}")
        elif result.exit_code != 2:
            problems.append(f"exit code {result.exit_code}")
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        if len(errors) != 1 or len(result.stderr.strip().splitlines()) != 1:
            problems.append(f"{len(errors)} error lines in {len(result.stderr.strip().splitlines())} stderr lines")
        if result.stdout.strip():
            problems.append("output on stdout")
    after = _digests(scratch)
    changed = sorted(name for name, digest in before.items() if after.get(name) != digest)
    if changed:
        problems.append(f"changed files that existed before: {', '.join(changed)}")
    shutil.rmtree(scratch, ignore_errors=True)
    if result is not None and problems:
        problems.append(f"stderr: {result.stderr.strip()[:200]!r}")
    return Outcome(probe, problems, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=20.0, help="Seconds before a probe counts as a runaway.")
    parser.add_argument("--only", help="Audit only this command (e.g. 'bench moe').")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"Probes to run, a comma list of {', '.join(KINDS)}.")
    parser.add_argument("--verbose", action="store_true", help="Print every probe, not only the failing ones.")
    options = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    signal.signal(signal.SIGALRM, _on_alarm)
    all_probes, uncovered = probes(options.only, tuple(options.kinds.split(",")))
    template = Path(tempfile.mkdtemp(prefix="audit-template-"))
    _make_template(template)
    counts: Counter[str] = Counter()
    started = time.perf_counter()
    slowest: list[tuple[float, str]] = []
    for probe in all_probes:
        outcome = run_probe(probe, template, options.timeout)
        label = f"{probe.command} {probe.option} <{probe.bad}>"
        slowest.append((outcome.seconds, label))
        for problem in outcome.problems:
            if problem.startswith("stderr:"):
                continue
            kind = problem.split(":")[0].split(" (")[0]
            kind = "wrong error lines" if "error lines" in kind else kind
            kind = "exit code != 2" if kind.startswith("exit code") else kind
            counts[kind] += 1
        if outcome.problems or options.verbose:
            print(
                f"{'FAIL' if outcome.problems else 'ok  '} {label} ({outcome.seconds:.1f} s): "
                + "; ".join(outcome.problems),
                flush=True,
            )
    shutil.rmtree(template, ignore_errors=True)
    print()
    commands = sorted({p.command for p in all_probes})
    print(f"{len(all_probes)} probes over {len(commands)} commands in {time.perf_counter() - started:.0f} s")
    no_values = sorted(path for path, _ in _command_tree() if path not in commands and not options.only)
    if no_values:
        print(f"no value to probe (flags only): {', '.join(no_values)}")
    for kind in (
        "traceback",
        "runaway",
        "exit code != 2",
        "wrong error lines",
        "output on stdout",
        "changed files that existed before",
    ):
        print(f"  {kind}: {counts[kind]}")
    print("slowest: " + ", ".join(f"{label} {s:.1f} s" for s, label in sorted(slowest, reverse=True)[:3]))
    for line in uncovered:
        print(f"not covered: {line}")
    for command in sorted(NEEDS_GPU & set(commands)):
        print(
            f"note: {command} stops at 'needs a GPU' on a machine without one; its probes there check only "
            "what is checked before that"
        )
    failed = sum(counts.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
