"""Every value-taking option of every command, fed a blank value or an out-of-range number: exit code 2, exactly
one `error:` line, nothing on stdout, no traceback, no file changed. The probes come from walking the command tree
(benchmarks/audit_cli.py, the full audit), so a new option is covered here without a change."""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path

import pytest

AUDIT_SCRIPT = Path(__file__).parents[2] / "benchmarks" / "audit_cli.py"


def _load_audit():
    spec = importlib.util.spec_from_file_location("audit_cli", AUDIT_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


audit = _load_audit()
# Out-of-range numbers kept here; the audit also runs 0, inf and 10^20, and the file and output probes.
NUMBERS = ("-1", "nan", "1e20")
# A known gap of `estimate` (its own command module): an unknown --dataset name is accepted when --queries is given.
KNOWN_GAPS = {("estimate", "--dataset")}


def _params() -> list:
    probes, _ = audit.probes(kinds=("blank", "number"))
    out = []
    for probe in probes:
        if probe.kind == "number" and probe.bad not in NUMBERS:
            continue
        gap = (probe.command, probe.option) in KNOWN_GAPS and probe.kind == "number"
        marks = [pytest.mark.xfail(reason="estimate accepts it", strict=False)] if gap else []
        out.append(pytest.param(probe, id=f"{probe.command}:{probe.option}={probe.bad}", marks=marks))
    return out


@pytest.fixture(scope="module")
def scratch_template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("audit-template")
    audit._make_template(root)
    return root


@pytest.mark.parametrize("probe", _params())
def test_a_bad_value_is_one_error_line(probe, scratch_template: Path) -> None:
    previous = signal.signal(signal.SIGALRM, audit._on_alarm)
    try:
        outcome = audit.run_probe(probe, scratch_template, timeout=60)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not outcome.problems, f"{probe.command} {probe.option} {probe.bad}: {outcome.problems}"


def test_every_command_with_options_is_probed() -> None:
    """Each command that takes a value has a valid invocation in the audit's BASE, so none goes unchecked."""
    probes, uncovered = audit.probes()
    assert not uncovered
    assert {"memory", "profile", "trainability", "bench moe", "data stats", "predict"} <= {p.command for p in probes}
