"""Max batch size search (tunecost.profile.maxbatch): grow then bisect, OOM as a boundary, CLI on CPU."""

from __future__ import annotations

import json

import pytest

from tunecost.errors import TunecostError
from tunecost.profile.maxbatch import Probe, search_max_batch_size, simulated_search
from tunecost.workload.job import FineTuneJob


def _threshold_probe(max_fit: int, seen: list[int]):
    def probe(b: int) -> Probe:
        seen.append(b)
        return Probe(batch_size=b, fits=b <= max_fit, peak_bytes=b * 10)

    return probe


@pytest.mark.parametrize("max_fit", [1, 2, 3, 5, 8, 13, 100])
def test_grow_then_bisect_finds_the_largest_fitting_batch(max_fit):
    seen: list[int] = []
    best, _probes, hit = search_max_batch_size(_threshold_probe(max_fit, seen), limit=4096)
    assert best == max_fit and not hit
    grow = [b for b in seen if b & (b - 1) == 0][: max_fit.bit_length() + 1]
    assert seen[: len(grow)] == [2**i for i in range(len(grow))]  # doubling first
    assert len(seen) <= 2 * max_fit.bit_length() + 2  # then a bisection, not a linear scan
    assert max_fit + 1 in seen or max_fit + 1 > 4096  # the boundary itself was measured


def test_nothing_fits_is_zero_with_the_failing_probe():
    seen: list[int] = []
    best, probes, hit = search_max_batch_size(_threshold_probe(0, seen))
    assert best == 0 and seen == [1] and not probes[0].fits and not hit


def test_limit_stops_the_search():
    best, _, hit = search_max_batch_size(_threshold_probe(10**6, []), limit=12)
    assert best == 12 and hit
    with pytest.raises(TunecostError):
        search_max_batch_size(_threshold_probe(3, []), start=0)


def test_simulated_search_against_a_budget(monkeypatch):
    import tunecost.simulate.batch as batch

    monkeypatch.setattr(batch, "default_margin_fraction", lambda: 0.0)  # the search alone
    monkeypatch.setattr("tunecost.profile.maxbatch.default_margin_fraction", lambda: 0.0)
    job = FineTuneJob(model="tiny-mixtral", method="qlora", seq_len=128)
    per_query, fixed = 3_000_000, 10_000_000

    def peak(j: FineTuneJob) -> int:
        return fixed + per_query * j.batch_size

    result = simulated_search(job, fixed + per_query * 6 + 1, peak_bytes_fn=peak)
    assert result.max_batch_size == 6 and result.source == "simulated" and result.seq_len == 128
    assert result.boundary is not None and result.boundary.batch_size == 7
    nothing = simulated_search(job, fixed, peak_bytes_fn=peak)
    assert nothing.max_batch_size == 0 and nothing.boundary.batch_size == 1


def test_cli_max_batch_on_cpu_simulates_and_records(cli_runner, tmp_path, monkeypatch):
    import tunecost.simulate.batch as batch

    monkeypatch.setattr(batch, "default_margin_fraction", lambda: 0.0)  # the wiring and the record
    monkeypatch.setattr("tunecost.profile.maxbatch.default_margin_fraction", lambda: 0.0)
    from tunecost.cli.main import app
    from tunecost.profile import maxbatch

    def fake_peak(job):  # the simulator is tested by its owner; here the wiring and the record
        return 2**30 + job.batch_size * 2**28

    fake_peak.estimator = "test"
    monkeypatch.setattr(maxbatch, "simulator_need_bytes", fake_peak)
    job = ["max-batch", "--model", "tiny-mixtral", "--experts-per-token", "2", "--seq-len", "256"]
    args = [*job, "--gpu-memory-gib", "2", "--device", "cpu", "--out", str(tmp_path)]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # rich wraps long lines
    assert "max batch size: 4" in text and "batch 5 does not fit" in text
    row = json.loads((tmp_path / "max_batch.jsonl").read_text().splitlines()[0])
    assert row["kind"] == "max_batch" and row["max_batch_size"] == 4 and row["seq_len"] == 256
    assert row["source"] == "simulated" and row["memory_bytes"] == 2 * 2**30 and row["point_id"]
    # --gpu-memory-gb is 10^9 bytes, as in `tunecost memory`: 2 GB = 2e9 bytes holds 2^30 + B * 2^28 up to B = 3
    gb = json.loads(cli_runner.invoke(app, [*job, "--gpu-memory-gb", "2", "--device", "cpu", "--json"]).stdout)
    assert gb["memory_bytes"] == 2 * 10**9 and gb["max_batch_size"] == (2 * 10**9 - 2**30) // 2**28
    both = cli_runner.invoke(app, [*args, "--gpu-memory-gb", "2"])
    assert both.exit_code == 2 and "not both" in both.output
    small = cli_runner.invoke(app, [*job, "--device", "cpu", "--gpu-memory-gib", "0.5", "--json"])
    assert small.exit_code == 0 and json.loads(small.stdout)["max_batch_size"] == 0
    text = cli_runner.invoke(app, [*job, "--device", "cpu", "--gpu-memory-gib", "0.5"])
    assert "nothing fits" in " ".join(text.stdout.split())


def test_a_catalog_dataset_with_no_copy_is_probed_at_the_cutoff(cli_runner, monkeypatch, tmp_path):
    """A config's hub dataset (alpaca: the catalog's, with no copy here) probes at the cutoff; without one it is
    one error asking for --seq-len."""
    from tunecost.cli.main import app
    from tunecost.profile import maxbatch

    def fake_peak(job):
        return 2**30 + job.batch_size * job.seq_len * 2**20

    fake_peak.estimator = "test"
    monkeypatch.setattr(maxbatch, "simulator_need_bytes", fake_peak)
    base = ["max-batch", "--model", "tiny-mixtral", "--gpu-memory-gib", "2", "--device", "cpu", "--json"]
    cut = cli_runner.invoke(app, [*base, "--dataset", "alpaca", "--seq-len", "256"])
    assert cut.exit_code == 0, cut.output
    assert json.loads(cut.stdout)["seq_len"] == 256 and "alpaca has no copy here" in cut.stderr
    uncut = cli_runner.invoke(app, [*base, "--dataset", "dolly-15k"])
    assert uncut.exit_code == 2 and "dolly-15k has no copy here; give --seq-len N" in uncut.output
    profile = cli_runner.invoke(
        app, ["profile", "--model", "tiny-mixtral", "--dataset", "alpaca", "--out", str(tmp_path)]
    )
    assert profile.exit_code == 2 and "alpaca has no copy here; give --seq-len N" in profile.output


def test_cli_max_batch_needs_a_budget_on_cpu(cli_error):
    line = cli_error(["max-batch", "--model", "tiny-mixtral", "--device", "cpu"])
    assert "--gpu" in line
    assert "unknown model" in cli_error(["max-batch", "--model", "mixtral-9x9b", "--device", "cpu", "--gpu", "A40"])


def test_a_catalog_gpus_budget_is_the_device_itself_when_the_search_runs_on_it(monkeypatch):
    """`--gpu G` on a CUDA device that is G searches the device's whole memory (its own total is measured); on
    another device or on the CPU, G's usable memory from the catalog (a budget larger than the device is an error
    there)."""
    import torch

    from tunecost.catalog.gpus import get_gpu
    from tunecost.profile.maxbatch import catalog_gpu_budget

    a100, h100 = get_gpu("A100-80GB"), get_gpu("H100")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100-SXM4-80GB")
    assert catalog_gpu_budget(a100, "cuda:0") is None
    assert catalog_gpu_budget(h100, "cuda") == h100.usable_memory_bytes
    assert catalog_gpu_budget(a100, "cpu") == a100.usable_memory_bytes
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Some Unknown Accelerator")
    assert catalog_gpu_budget(a100, "cuda:1") == a100.usable_memory_bytes
