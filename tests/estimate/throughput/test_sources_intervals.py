"""Several GPUs in one calibration (tunecost.estimate.throughput.sources), the cross-GPU interval
(intervals.py) and leave-one-GPU-out (validate.py), on the paper's A40 and A100-40GB points."""

from __future__ import annotations

import math
import shutil
import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.errors import TunecostError
from tunecost.estimate.conformal import Halfwidth, conformal_halfwidth, conformal_rank, error_interval
from tunecost.estimate.throughput.calibrate import CalibratedModel, calibrate
from tunecost.estimate.throughput.intervals import (
    HOST_CLOCK_CHAIN_LOG_HALFWIDTH,
    HeldOut,
    IntervalEvidence,
    combined_halfwidth,
    gpu_distance,
    interval_parts,
    speed_of,
)
from tunecost.estimate.throughput.sources import (
    alias_notes,
    calibrate_files,
    calibration_files,
    load_calibration_points,
)
from tunecost.estimate.throughput.targets import ThroughputTarget, throughput_target
from tunecost.estimate.throughput.validate import leave_one_gpu_out

FIXTURES = Path(__file__).parents[2] / "fixtures" / "measurements"
A40_CSV = FIXTURES / "measured_throughput_a40.csv"
A100_CSV = FIXTURES / "measured_throughput_a100_40gb.csv"


@pytest.fixture(scope="module")
def two_gpu_model() -> CalibratedModel:
    return calibrate_files([A40_CSV, A100_CSV])


def _target(gpu: str, batch: int = 2, k: int = 2) -> ThroughputTarget:
    return throughput_target(model="mixtral-8x7b", gpu=gpu, batch_size=batch, experts_per_token=k, dataset="math_14k")


def test_two_files_make_one_calibration_of_two_gpus(two_gpu_model: CalibratedModel) -> None:
    assert two_gpu_model.num_points == 54 + 4  # rows of the two files
    assert two_gpu_model.gpus == ("A100-40GB", "A40-48GB")
    assert str(A40_CSV) in two_gpu_model.source and str(A100_CSV) in two_gpu_model.source
    evidence = two_gpu_model.evidence
    assert evidence is not None and evidence.transfer is not None  # leave-one-GPU-out ran: the A100's 4 points
    assert len(evidence.transfer.errors) == 4 and not any(evidence.transfer.cross_architecture)
    assert evidence.workload is not None and len(evidence.workload.errors) == 58  # every group held out once
    assert two_gpu_model.in_sample_mape <= 0.08


def test_a_folder_is_every_csv_in_it(tmp_path: Path) -> None:
    shutil.copy(A40_CSV, tmp_path / "a.csv")
    shutil.copy(A100_CSV, tmp_path / "b.csv")
    (tmp_path / "readme.txt").write_text("not a calibration file")
    assert calibration_files([tmp_path]) == [tmp_path / "a.csv", tmp_path / "b.csv"]
    assert calibration_files([f"{tmp_path / 'a.csv'},{tmp_path / 'b.csv'}"]) == [tmp_path / "a.csv", tmp_path / "b.csv"]
    with pytest.raises(TunecostError, match="named twice"):
        calibration_files([tmp_path, tmp_path / "a.csv"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TunecostError, match="no .csv files"):
        calibration_files([empty])
    with pytest.raises(TunecostError, match="not found"):
        calibration_files([tmp_path / "missing.csv"])


def test_one_gpu_named_two_ways_is_merged_and_said(tmp_path: Path) -> None:
    text = A100_CSV.read_text().replace("A100-40GB", "a100 40gb", 2)  # two rows under an alias
    path = tmp_path / "alias.csv"
    path.write_text(text)
    points = load_calibration_points(path)
    (note,) = alias_notes(points)
    assert "A100-40GB" in note and "'a100 40gb'" in note and "merged" in note
    assert len(points) == 4  # nothing dropped


def test_one_gpu_calibration_borrows_the_bundled_transfer_errors(two_gpu_model: CalibratedModel) -> None:
    model = calibrate_files([A40_CSV])
    assert model.evidence is not None and model.evidence.transfer is not None
    assert "one GPU calibrated" in model.evidence.note and "bundled calibration" in model.evidence.note
    pred = model.predict(_target("H100"))
    assert pred.queries_per_s_low < pred.queries_per_s < pred.queries_per_s_high
    assert [k for k, _, _ in pred.interval_parts][:2] == ["calibrated workload", "other architecture"]


def test_interval_widens_with_distance_from_the_calibrated_gpus(two_gpu_model: CalibratedModel) -> None:
    def width(gpu: str, batch: int = 2) -> float:
        p = two_gpu_model.predict(_target(gpu, batch))
        return math.log(p.queries_per_s_high / p.queries_per_s_low)

    assert width("A40") < width("A100-80GB") < width("H100")  # calibrated < near < far
    assert width("H100", 17) != width("H100", 2)  # the batch term and the host share move it


def test_interval_kinds_say_what_applies(two_gpu_model: CalibratedModel) -> None:
    def kinds(gpu: str, batch: int = 2, model: str = "mixtral-8x7b") -> list[str]:
        t = throughput_target(model=model, gpu=gpu, batch_size=batch, dataset="math_14k")
        return [k for k, _, _ in two_gpu_model.predict(t).interval_parts]

    assert kinds("A40") == ["calibrated workload"]
    assert kinds("A100-80GB") == ["calibrated workload", "other GPU"]  # Ampere, as both calibrated GPUs
    assert kinds("H100")[:2] == ["calibrated workload", "other architecture"]
    assert "other host CPU" in kinds("H100")  # the DGX's Xeon, not the calibration's reference host
    assert "batch beyond calibrated" in kinds("A40", 64)
    assert kinds("A40", 2, "olmoe-1b-7b")[0] == "workload not calibrated"


def test_interval_parts_by_hand() -> None:
    slow = GpuTerms(name="A", matmul_flops_per_s=1e14, fp32_flops_per_s=1e13, memory_bytes_per_s=1e12, source="t")
    fast = GpuTerms(name="B", matmul_flops_per_s=4e14, fp32_flops_per_s=4e13, memory_bytes_per_s=4e12, source="t")
    assert speed_of(fast) / speed_of(slow) == pytest.approx(4.0)
    assert gpu_distance(fast, [slow]) == pytest.approx(math.log(4.0))
    assert gpu_distance(slow, [slow, fast]) == 0.0
    transfer = HeldOut(
        kind="other GPU", errors=tuple([0.01] * 30 + [0.2]), source="t", cross_architecture=(False,) * 31
    )
    workload = HeldOut(kind="workload not calibrated", errors=tuple(0.01 * i for i in range(1, 40)), source="w")
    evidence = IntervalEvidence(transfer=transfer, workload=workload, note="")
    common = {"in_sample": Halfwidth(0.05, "in"), "evidence": evidence, "batch_size": 4, "calibrated_max_batch": 8}
    parts = interval_parts(target=fast, calibrated=[slow], workload_calibrated=True, cross_architecture=False, **common)
    # 31 errors: the 31st (0.2) bounds a new one at 95 %; scaled by the distance
    assert parts == [
        ("calibrated workload", 0.05, "in"),
        ("other GPU", pytest.approx(0.2 * math.log(4.0)), parts[1][2]),
    ]
    assert combined_halfwidth(parts) == pytest.approx(math.hypot(0.05, 0.2 * math.log(4.0)))
    on = interval_parts(target=slow, calibrated=[slow], workload_calibrated=False, cross_architecture=False, **common)
    assert on == [("workload not calibrated", pytest.approx(0.38), on[0][2])]  # error 38 of 39
    other_host = GpuTerms(
        name="A", matmul_flops_per_s=1e14, fp32_flops_per_s=1e13, memory_bytes_per_s=1e12, source="t", host_cpu="x"
    )
    hosted = interval_parts(
        target=other_host,
        calibrated=[slow],
        workload_calibrated=True,
        cross_architecture=False,
        host_fraction=0.5,
        **common,
    )
    assert hosted[1] == ("other host CPU", pytest.approx(HOST_CLOCK_CHAIN_LOG_HALFWIDTH * 0.5), hosted[1][2])


def test_batch_term_grows_beyond_the_farthest_held_out_batch() -> None:
    terms = GpuTerms(name="A", matmul_flops_per_s=1e14, fp32_flops_per_s=1e13, memory_bytes_per_s=1e12, source="t")
    errors = tuple(0.01 * i for i in range(1, 20))  # 19 errors: the largest (0.19) bounds a new one
    held = HeldOut(kind="batch beyond calibrated", errors=errors, source="b", distances=(0.2, 0.5))
    evidence = IntervalEvidence(transfer=None, workload=None, note="", batch=held)

    def batch_part(batch: int) -> float:
        parts = interval_parts(
            in_sample=Halfwidth(0.05, "in"),
            evidence=evidence,
            target=terms,
            calibrated=[terms],
            workload_calibrated=True,
            cross_architecture=False,
            batch_size=batch,
            calibrated_max_batch=8,
        )
        return dict((k, h) for k, h, _ in parts).get("batch beyond calibrated", 0.0)

    assert batch_part(8) == 0.0
    assert batch_part(9) == batch_part(13) == pytest.approx(0.19)  # within the held-out reach (ln(13/8) < 0.5)
    assert batch_part(32) == pytest.approx(0.19 * math.log(4) / 0.5)  # beyond it: in proportion to the distance


def test_conformal_halfwidth_ranks_or_falls_back_to_student_t() -> None:
    from scipy.stats import t as student_t

    h = conformal_halfwidth([0.1 * i for i in range(1, 20)], "s")  # 19 errors: the largest is the 95 % bound
    assert h.value == pytest.approx(1.9) and "error 19 of 19" in h.basis
    few = conformal_halfwidth([0.03, -0.04], "s")
    rms = math.sqrt((0.03**2 + 0.04**2) / 2)
    assert few.value == pytest.approx(student_t.ppf(0.975, 2) * rms * math.sqrt(1.5)) and "Student t" in few.basis
    with pytest.raises(ValueError):
        conformal_halfwidth([], "s")


@given(
    st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=40),
    st.sampled_from([0.5, 0.8, 0.9, 0.95]),
    st.sampled_from([0.01, 0.04, 0.09]),
)
def test_a_higher_level_is_never_narrower(errors: list[float], level: float, step: float) -> None:
    # a level too high to rank falls back to Student t, which must not undercut a lower level's ranked bound
    higher = min(level + step, 0.99)
    assert conformal_halfwidth(errors, "s", higher).value >= conformal_halfwidth(errors, "s", level).value
    if conformal_rank(len(errors), higher) is None:
        wide = error_interval(errors, "s", higher)
        assert wide.low <= min(errors) and wide.high >= max(errors)


def test_error_interval_follows_errors_that_share_a_sign() -> None:
    from scipy.stats import t as student_t

    # enough to rank: the conformal |error| quantile, on both sides of zero whatever the signs
    ranked = error_interval([-0.1 * i for i in range(1, 20)], "s")
    assert (ranked.low, ranked.high) == (pytest.approx(-1.9), pytest.approx(1.9))
    # too few: centred on their mean, as wide as their spread (a normal sample's prediction interval)
    biased = [-0.3, -0.35, -0.4, -0.25, -0.5, -0.3]
    got = error_interval(biased, "s")
    half = student_t.ppf(0.975, 5) * statistics.stdev(biased) * math.sqrt(1 + 1 / 6)
    assert got.low == pytest.approx(statistics.fmean(biased) - half) and got.high < 0 < -got.low
    assert "mean and spread of 6" in got.basis
    # the same errors with their signs mixed: about zero, and wider (their spread is larger)
    mixed = error_interval([e * (-1) ** i for i, e in enumerate(biased)], "s")
    assert mixed.low < 0 < mixed.high and abs(mixed.low + mixed.high) < 0.2 * (mixed.high - mixed.low)
    assert mixed.high - mixed.low > got.high - got.low


def test_leave_one_gpu_out_predicts_the_a100_from_the_a40() -> None:
    points = load_calibration_points(A40_CSV) + load_calibration_points(A100_CSV)
    results = leave_one_gpu_out(points)
    # the A100-40GB's 4 points can be left out (54 remain); the A40's cannot (4 remain, fewer than a fit needs)
    (only,) = results
    assert only.group[2] == "A100-40GB" and len(only.checks) == 4
    assert only.model.gpus == ("A40-48GB",)
    assert math.isfinite(only.mape) and only.mape < 0.5


def test_a_measured_gpu_profile_replaces_catalog_values_for_its_gpu() -> None:
    from tunecost.estimate.calibrated import calibrated_model

    measured = GpuTerms(
        name="h100",  # an alias: re-keyed to the catalog name
        matmul_flops_per_s=700e12,
        fp32_flops_per_s=50e12,
        memory_bytes_per_s=3.0e12,
        kernel_launch_s=20e-6,
        host_step_s=0.03,
        source="profile: test",
    )
    plain = calibrated_model([A40_CSV, A100_CSV])
    profiled = calibrated_model([A40_CSV, A100_CSV], gpu_terms=[measured])
    a, b = plain.predict(_target("H100", 1)), profiled.predict(_target("H100", 1))
    assert any("profile: test" in n for n in b.notes) and not any("profile: test" in n for n in a.notes)
    assert b.step.kernel_overhead_s == pytest.approx(20e-6 * b.counts.total_kernels)  # measured launch time
    # the host-speed term drops out of the interval once the host times are measured on that machine
    assert math.log(b.queries_per_s_high / b.queries_per_s) < math.log(a.queries_per_s_high / a.queries_per_s)
    assert profiled.predict(_target("A40")).queries_per_s == pytest.approx(plain.predict(_target("A40")).queries_per_s)


def test_a_profile_of_an_unknown_device_asks_which_gpu_it_is(gpu_terms) -> None:
    from tunecost.estimate.calibrated import calibrated_model

    odd = gpu_terms(name="NVIDIA Foo 80GB", source="profile: odd")
    with pytest.raises(TunecostError, match="GPU=FILE"):
        calibrated_model([A40_CSV], gpu_terms=[odd])


def test_a_named_host_changes_the_host_share_and_the_calibration_host_drops_the_host_term(
    two_gpu_model: CalibratedModel,
) -> None:
    def predict(host: str | None):
        target = throughput_target(
            model="mixtral-8x7b", gpu="H100", batch_size=1, experts_per_token=2, dataset="math_14k", host_cpu=host
        )
        return two_gpu_model.predict(target)

    default, ref, named = predict(None), predict("Xeon Platinum 8380"), predict("8480C")
    assert default.host_cpu == named.host_cpu == "Xeon Platinum 8480C" and ref.host_cpu == "Xeon Platinum 8380"
    assert default.queries_per_s == pytest.approx(named.queries_per_s)
    assert named.queries_per_s > ref.queries_per_s  # the faster host shortens the host share of the step
    assert named.step.gpu_s == pytest.approx(ref.step.gpu_s)
    kinds = [[k for k, _, _ in p.interval_parts] for p in (default, ref, named)]
    # another catalog CPU than the calibration's carries its per-clock uncertainty, named or assumed; the
    # calibration's own host does not (what another machine of that host changes is in the transfer errors)
    assert "other host CPU" in kinds[0] and "other host CPU" in kinds[2] and "other host CPU" not in kinds[1]
    assert any("assumed" in n for n in default.notes) and any("(named)" in n for n in named.notes)


def test_host_cpu_column_of_a_measurement_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text(
        "model,dataset,gpu,experts_per_token,sparsity,batch_size,queries_per_s,host_cpu\n"
        "mixtral-8x7b,math_14k,A100-40GB,2,0.25,1,0.449,EPYC 7763\n"
        "mixtral-8x7b,math_14k,A100-40GB,2,0.25,2,0.815,\n"
    )
    first, second = load_calibration_points(path)
    assert first.target.host_cpu == "EPYC 7763" and second.target.host_cpu is None
    path.write_text(path.read_text().replace("EPYC 7763", "Z80"))
    with pytest.raises(TunecostError, match=r"m.csv: row 1: unknown host CPU 'Z80'"):
        load_calibration_points(path)


def test_a_calibrated_gpu_on_another_host_gets_the_host_term(two_gpu_model: CalibratedModel) -> None:
    def width(host: str | None) -> float:
        target = throughput_target(
            model="mixtral-8x7b", gpu="A40", batch_size=2, experts_per_token=2, dataset="math_14k", host_cpu=host
        )
        pred = two_gpu_model.predict(target)
        return math.log(pred.queries_per_s_high / pred.queries_per_s)

    assert width("Xeon Platinum 8380") == pytest.approx(width(None))  # the calibration's own host
    assert width("EPYC 9654") > width(None)  # same GPU, another machine


def test_a_cache_that_cannot_be_written_does_not_stop_a_calibration(tmp_path: Path, monkeypatch) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(blocked))
    model = calibrate_files([A40_CSV, A100_CSV])
    assert model.evidence is not None and model.evidence.workload is not None


def test_a_fit_is_kept_on_disk_and_a_bad_copy_is_refitted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(tmp_path))
    points = load_calibration_points(A40_CSV)
    first = calibrate(points, transfer_check=False)
    kept = list((tmp_path / "calibration-fits").glob("*.json"))
    assert kept  # one file per fitted stack
    again = calibrate(points, transfer_check=False)
    assert again.params == first.params and again.run_overhead_s == first.run_overhead_s
    for path in kept:
        path.write_text("{not json")
    refitted = calibrate(points, transfer_check=False)
    assert refitted.params.as_dict() == pytest.approx(first.params.as_dict())
