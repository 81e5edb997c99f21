"""Run metadata (tunecost.results.meta)."""

from __future__ import annotations

from tunecost.results.meta import (
    SCHEMA_VERSION,
    command_line,
    git_revision,
    merge_metadata,
    package_versions,
    run_metadata,
)


def test_run_metadata_has_every_documented_field():
    meta = run_metadata(device="cpu", command=["tunecost", "profile", "--out", "my dir"], workloads=[{"model": "m"}])
    for key in (
        "schema_version",
        "tool",
        "tool_version",
        "git_revision",
        "created",
        "device",
        "versions",
        "command",
        "workloads",
    ):
        assert key in meta
    assert meta["schema_version"] == SCHEMA_VERSION and meta["tool"] == "tunecost"
    assert meta["device"]["kind"] == "cpu"
    assert set(meta["device"]) >= {"kind", "name", "torch", "cuda", "num_threads", "host_cpu"}
    assert set(meta["versions"]) == {"torch", "transformers", "peft", "bitsandbytes"}
    assert meta["versions"]["torch"]  # installed here
    assert meta["command"] == "tunecost profile --out 'my dir'"  # shell-quoted
    assert meta["workloads"] == [{"model": "m"}]


def test_git_revision_is_none_outside_a_repository(tmp_path):
    assert git_revision(tmp_path) is None


def test_package_versions_missing_package_is_none():
    assert package_versions(["surely-not-installed-pkg-xyz"]) == {"surely-not-installed-pkg-xyz": None}


def test_command_line_quotes():
    assert command_line(["a", "b c"]) == "a 'b c'"


def test_merge_keeps_first_created_and_unions_workloads():
    old = {"created": "t0", "command": "cmd1", "workloads": [{"k": 1}]}
    new = {"created": "t1", "command": "cmd2", "workloads": [{"k": 1}, {"k": 2}]}
    merged = merge_metadata(old, new)
    assert merged["created"] == "t0" and merged["updated"] == "t1"
    assert merged["workloads"] == [{"k": 1}, {"k": 2}]
    assert merged["previous_commands"] == ["cmd1"]
    assert merge_metadata(None, new) == new
