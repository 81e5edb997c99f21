"""The estimator registry and the paper's estimator (eq. (1) batch size + eq. (2) throughput)."""

from __future__ import annotations

import math

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate.estimators import (
    estimator_names,
    get_estimator,
    paper_estimator,
    paper_max_batch_size,
)
from tunecost.models.catalog import model_catalog


def test_registry_has_paper() -> None:
    assert "paper" in estimator_names()
    assert "eq. (1)" in estimator_names()["paper"]
    assert get_estimator("paper") is paper_estimator


def test_unknown_estimator_lists_choices() -> None:
    with pytest.raises(
        TunecostError, match=r"unknown estimator 'papr'\. Did you mean 'paper'\?.*Valid choices: .*paper"
    ):
        get_estimator("papr")


def test_max_batch_size_coefficient_sets(make_request) -> None:
    # artifact coefficients: 8 at 48 GB (Table III); text (C0=82, C1=0.95): 82*24.65/147.2 = 13.73 -> 13
    mbs, note = paper_max_batch_size(make_request())
    assert mbs == 8 and "artifact coefficients C0=62, C1=0.89" in note and "seq_len 512" in note
    mbs, note = paper_max_batch_size(make_request(coefficient_set="text"))
    assert mbs == 13 and "text coefficients C0=82, C1=0.95" in note
    # A100-40GB (artifact): 62*16.65/170.24 = 6.06 -> 6
    assert paper_max_batch_size(make_request("A100-40GB"))[0] == 6
    # dense (8 of 8): per query 512*(0.11+0.89) = 512; 62*24.65/512 = 2.985 -> 2
    assert paper_max_batch_size(make_request(experts_per_token=8))[0] == 2
    # seq_len 256 halves the per-query memory: 62*24.65/85.12 = 17.95 -> 17
    assert paper_max_batch_size(make_request(seq_len=256))[0] == 17


def test_paper_estimator_a40_point(make_request) -> None:
    point = paper_estimator(make_request())
    assert point.max_batch_size == point.batch_size == 8
    assert point.queries_per_s is not None and point.queries_per_s > 1.005  # above the largest measured (B=4)
    assert any("fitted on 5 points" in n for n in point.notes)


def test_paper_estimator_no_measurements_on_gpu(make_request) -> None:
    point = paper_estimator(make_request("H200"))
    # 141 GB (artifact): 62*117.65/170.24 = 42.85 -> 42
    assert point.max_batch_size == 42
    assert point.queries_per_s is None
    assert any("no mixtral-8x7b/math_14k measurements on H200-141GB (have: A40-48GB)" in n for n in point.notes)


def test_paper_estimator_does_not_fit(make_request) -> None:
    point = paper_estimator(make_request("RTX4090"))  # 24 GB: 62*0.65/170.24 = 0.24 -> 0
    assert point.max_batch_size == 0 and point.queries_per_s is None
    assert any("does not fit" in n for n in point.notes)


def test_paper_estimator_method_mismatch(make_request) -> None:
    with pytest.raises(TunecostError, match="measured mixtral-8x7b with --method qlora only"):
        paper_estimator(make_request(method="full"))


def test_paper_estimator_model_without_coefficients(make_request) -> None:
    with pytest.raises(TunecostError, match="--estimator simulate"):
        paper_estimator(make_request(model="olmoe-1b-7b", experts_per_token=8))


def test_calibrate_adds_measurements_on_another_gpu(write_file, make_request) -> None:
    # Synthetic H100 points exactly on a + b*log(B)/(s*1.8) with a=0.6, b=0.5; the estimate at eq. (1)'s batch
    # (20 at 80 GB, artifact) must be the curve's value there.
    a, b = 0.6, 0.5
    rows = [f"mixtral-8x7b,math_14k,H100-80GB-SXM,2,0.25,{bs},{a + b * math.log(bs) / 0.45!r}" for bs in (1, 2, 4, 8)]
    path = write_file(
        "h100.csv", "model,dataset,gpu,experts_per_token,sparsity,batch_size,queries_per_s\n" + "\n".join(rows) + "\n"
    )
    point = paper_estimator(make_request("H100", calibrate=(path,)))
    assert point.max_batch_size == 20
    assert point.queries_per_s == pytest.approx(a + b * math.log(20) / 0.45, rel=1e-9)  # 0.6 + 0.5*2.9957/0.45
    assert any("extrapolation: batch 20 is outside the measured batch sizes 1..8" in n for n in point.notes)


@pytest.mark.skipif(
    "blackmamba-2.8b" not in model_catalog(),
    reason="blackmamba-2.8b is not in the model catalog yet (added by another issue)",
)
def test_blackmamba_falls_back_to_text_coefficients(make_request) -> None:
    mbs, note = paper_max_batch_size(make_request(model="blackmamba-2.8b", method="full"))
    # text C0=83, C1=0.88, 5.6 GB (Table I), seq 512, s=0.25: 83*42.4/174.08 = 20.2 -> 20
    assert mbs == 20 and "text coefficients" in note
