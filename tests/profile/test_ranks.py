"""`tunecost profile --nproc-per-node N`: real ranks launched by torch's elastic launcher (torchrun's library) on
gloo, tiny Mixtral under FSDP2 and DDP."""

from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.profile.model_setup import ModelSetup
from tunecost.profile.ranks import (
    RankProfile,
    check_rank_strategy,
    load_rank_profiles,
    profile_ranks,
    rank_point_id,
    save_rank_profiles,
    slowest_rank,
)

# one worker runs the module: its module-scoped launches (ddp_full, fsdp_lora) run once; the launches are `long`
# (CI runs them) but one, the single-rank launch through the launcher
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.xdist_group("profile-ranks")]
TINY = ModelSetup(model="tiny-mixtral", method="lora", random_weights=True, num_layers=1)


@pytest.fixture(scope="module")
def ddp_full(tmp_path_factory) -> list[RankProfile]:
    setup = ModelSetup(model="tiny-mixtral", method="full", random_weights=True, num_layers=1)
    logs = tmp_path_factory.mktemp("logs")
    return profile_ranks(setup, nproc_per_node=2, strategy="ddp", batch_size=2, seq_len=16, steps=2, log_dir=logs)


@pytest.fixture(scope="module")
def fsdp_lora(tmp_path_factory) -> list[RankProfile]:
    logs = tmp_path_factory.mktemp("logs")
    return profile_ranks(TINY, nproc_per_node=2, strategy="fsdp2", batch_size=2, seq_len=16, steps=2, log_dir=logs)


@pytest.mark.long
def test_every_rank_reports_its_steps_memory_and_collectives(ddp_full, fsdp_lora) -> None:
    for profiles in (ddp_full, fsdp_lora):
        assert [p.rank for p in profiles] == [0, 1]
        for p in profiles:
            assert p.world_size == 2 and p.device == "cpu" and len(p.step_seconds) == 2
            assert all(s > 0 for s in p.step_seconds)
            assert p.peak_allocated_bytes is None and p.peak_rss_bytes and p.peak_rss_bytes > 0
            assert p.comm_seconds >= 0


@pytest.mark.long
def test_ddp_all_reduces_every_trainable_gradient_once(ddp_full) -> None:
    # A full fine-tune in fp32 on CPU: DDP's buckets together hold every parameter's gradient, 4 bytes each.
    for p in ddp_full:
        assert p.trainable_params == p.total_params > 0
        assert p.collectives["all_reduce"]["bytes"] == 4 * p.trainable_params


@pytest.mark.long
def test_fsdp2_reduce_scatters_the_trainable_gradients_and_gathers_every_weight(fsdp_lora) -> None:
    for p in fsdp_lora:
        assert 0 < p.trainable_params < p.total_params
        # fully_shard pads each parameter's dim 0 to a multiple of the group size: at least every trainable fp32
        # gradient, padding at most (world_size - 1) rows of each parameter
        assert p.collectives["reduce_scatter"]["bytes"] >= 4 * p.trainable_params
        assert p.collectives["all_gather"]["bytes"] >= 4 * p.total_params  # every weight unsharded at least once
    assert fsdp_lora[0].collectives == fsdp_lora[1].collectives


@pytest.mark.long
def test_records_mark_the_slowest_rank_and_a_rerun_finds_the_point(tmp_path, fsdp_lora) -> None:
    point = rank_point_id(TINY, strategy="fsdp2", nproc_per_node=2, batch_size=2, seq_len=16)
    save_rank_profiles(tmp_path, point, fsdp_lora)
    rows = load_rank_profiles(tmp_path)[point]
    assert [r["rank"] for r in rows] == [0, 1]
    slow = slowest_rank(fsdp_lora)
    assert [r["rank"] for r in rows if r["slowest"]] == [slow.rank]
    assert all(r["kind"] == "rank" and r["median_step_seconds"] > 0 for r in rows)
    with pytest.raises(TunecostError, match="already holds"):  # a finished point is never overwritten
        save_rank_profiles(tmp_path, point, fsdp_lora)


@pytest.mark.parametrize(
    ("strategy", "method", "message"),
    [("zero3", "lora", "unknown --strategy"), ("fsdp2", "qlora", "QLoRA under FSDP2")],
)
def test_refused_before_launching(strategy, method, message) -> None:
    with pytest.raises(TunecostError, match=message):
        check_rank_strategy(strategy, 2, method)


@pytest.mark.long
def test_a_failing_rank_is_one_error(tmp_path) -> None:
    bad = ModelSetup(model="no-such-model", method="lora")  # each rank fails to build it
    with pytest.raises(TunecostError, match="a rank failed"):
        profile_ranks(bad, nproc_per_node=2, strategy="ddp", steps=1, log_dir=tmp_path)


@pytest.mark.long
def test_cli_profiles_once_and_resumes(tmp_path, cli_json, monkeypatch) -> None:
    out = tmp_path / "run"
    options = dict(model="tiny-mixtral", method="lora", random_weights=True, num_layers=1, nproc_per_node=2)
    first = cli_json("profile", out=out, **options, batch_sizes=2, seq_len=16, steps=1)
    assert [r["rank"] for r in first["ranks"]] == [0, 1]
    import tunecost.profile.ranks as ranks

    monkeypatch.setattr(ranks, "profile_ranks", lambda *a, **k: pytest.fail("a finished point was measured again"))
    again = cli_json("profile", out=out, **options, batch_sizes=2, seq_len=16, steps=1)
    assert again["ranks"] == first["ranks"]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--batch-sizes", "1,2", "--batch-sizes: --nproc-per-node profiles one point"),
        ("--strategy", "zero3", "unknown --strategy"),
        ("--method", "qlora", "QLoRA under FSDP2"),
        ("--dataset", "math_14k", "--dataset"),
    ],
)
def test_cli_bad_input_is_one_error_line(tmp_path, cli_error, option, value, message) -> None:
    method = [] if option == "--method" else ["--method", "lora"]
    line = cli_error(["profile", "--out", str(tmp_path / "run"), "--nproc-per-node", "2", *method, option, value])
    assert message in line


def test_cli_one_rank_with_a_strategy_runs_through_the_launcher(tmp_path, cli_json) -> None:
    """`--strategy` alone profiles one rank under that engine (the single-GPU check of the multi-rank path)."""
    options = dict(model="tiny-mixtral", method="lora", random_weights=True, num_layers=1, strategy="fsdp2")
    got = cli_json("profile", out=tmp_path / "run", **options, batch_sizes=1, seq_len=16, steps=1)
    (rank,) = got["ranks"]
    assert rank["world_size"] == 1 and rank["slowest"] and rank["strategy"] == "fsdp2"
    assert set(rank["collectives"]) <= {"all_gather", "reduce_scatter", "broadcast"}  # one rank still "gathers"
