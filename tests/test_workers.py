"""The test run's own set-up: under `make test` (--dist loadgroup) a module's tests stay on one worker, so its module
fixtures and shared launches are made once (tests/conftest.py)."""

from __future__ import annotations

import pytest


def test_a_module_runs_as_one_group_on_one_worker(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run under pytest-xdist --dist loadgroup")
    assert request.node.nodeid.endswith("@tests/test_workers.py")  # xdist names the group in the node id
