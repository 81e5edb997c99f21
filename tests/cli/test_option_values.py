"""Every value-taking option of every command, fed a blank value or an out-of-range number: exit code 2, exactly
one `error:` line, nothing on stdout, no traceback, no file changed. The probes come from walking the command tree
(benchmarks/audit_cli.py, the full audit), so a new option is covered here without a change. `make test` samples
one probe per option and kind; CI runs them all."""

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


def _params() -> list:
    """Every probe; `make test` runs one per option and kind (blank, number), its bad value taken in turn, and the
    others carry the `long` marker (`make test-long`; CI runs every test)."""
    probes, _ = audit.probes(kinds=("blank", "number"))
    groups: dict[tuple[str, str, str], list] = {}
    for probe in probes:
        if probe.kind == "blank" or probe.bad in NUMBERS:
            groups.setdefault((probe.command, probe.option, probe.kind), []).append(probe)
    out = []
    for turn, group in enumerate(groups.values()):
        for i, probe in enumerate(group):
            marks = [] if i == turn % len(group) else [pytest.mark.long]
            out.append(pytest.param(probe, marks=marks, id=f"{probe.command}:{probe.option}={probe.bad}"))
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
