"""The paper's analytical model (Xia et al., IISWC 2024, §V): eqs. (1), (2) and the Table IV cost, against
hand-computed values."""

from __future__ import annotations

import math

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate.paper import (
    EQ1_ARTIFACT_SEQ_LEN,
    EQ1_COEFFICIENTS,
    EQ2_ARTIFACT_C3,
    cost_usd,
    max_batch_size_eq1,
    sparsity_fraction,
    throughput_eq2_artifact,
    throughput_eq2_printed,
    training_seconds,
)

MIXTRAL_MODEL_GB = 23.35  # Table I (and the artifact's Fig. 13 projection)


def _eq1_artifact(gpu_gb: float, sparsity: float = 0.25) -> int:
    return max_batch_size_eq1(
        gpu_memory_gb=gpu_gb, model_memory_gb=MIXTRAL_MODEL_GB, seq_len_tokens=512, sparsity=sparsity, c0=62, c1=0.89
    )


# ---- eq. (1): max batch size ---------------------------------------------------------------------------------


def test_coefficient_sets_are_the_papers() -> None:
    # the paper's artifact (Fig. 13 script): C0=62, C1=0.89, model 23.35 GB, seq 512; §V-A text: Mixtral C0=82,
    # C1=0.95; BlackMamba C0=83, C1=0.88; Table I: Mixtral 23.35 GB, BlackMamba 5.6 GB.
    art = EQ1_COEFFICIENTS[("mixtral-8x7b", "artifact")]
    assert (art.c0, art.c1, art.model_memory_gb) == (62, 0.89, 23.35)
    text = EQ1_COEFFICIENTS[("mixtral-8x7b", "text")]
    assert (text.c0, text.c1, text.model_memory_gb) == (82, 0.95, 23.35)
    bm = EQ1_COEFFICIENTS[("blackmamba-2.8b", "text")]
    assert (bm.c0, bm.c1, bm.model_memory_gb) == (83, 0.88, 5.6)
    assert EQ1_ARTIFACT_SEQ_LEN == 512
    assert EQ2_ARTIFACT_C3 == {"mixtral-8x7b": 1.8, "blackmamba-2.8b": 2.5}  # the artifact's eq. (2) fit


@pytest.mark.parametrize(
    ("gpu_gb", "expected"),
    [
        # Acceptance 4 (artifact's Fig. 13 projection, Mixtral top-2). Per query: 512*((1-0.89)+0.89*0.25)
        # = 512*0.3325 = 170.24.
        (40, 6),  # 62*(40-23.35)/170.24 = 1032.30/170.24 = 6.064 -> 6
        (48, 8),  # 62*(48-23.35)/170.24 = 1528.30/170.24 = 8.977 -> 8
        (80, 20),  # 62*56.65/170.24 = 20.63 -> 20
        # §V-A: "for 100GB and 120GB ... 28 and 35". 120 GB: 62*96.65/170.24 = 35.199 -> 35 (matches).
        # 100 GB: 62*76.65/170.24 = 27.915, which eq. (1)'s floor makes 27; the paper prints 28 (rounded).
        (120, 35),
        (100, 27),
    ],
)
def test_eq1_artifact_coefficients_mixtral_top2(gpu_gb: float, expected: int) -> None:
    assert _eq1_artifact(gpu_gb) == expected


def test_eq1_text_coefficients_hand_computed() -> None:
    # Mixtral, text coefficients C0=82, C1=0.95 (§V-A), 48 GB, seq 512:
    # sparse (0.25): per query 512*(0.05+0.2375) = 147.2; 82*24.65/147.2 = 2021.3/147.2 = 13.73 -> 13
    assert (
        max_batch_size_eq1(gpu_memory_gb=48, model_memory_gb=23.35, seq_len_tokens=512, sparsity=0.25, c0=82, c1=0.95)
        == 13
    )
    # dense (1.0): per query 512*(0.05+0.95) = 512; 2021.3/512 = 3.948 -> 3
    assert (
        max_batch_size_eq1(gpu_memory_gb=48, model_memory_gb=23.35, seq_len_tokens=512, sparsity=1.0, c0=82, c1=0.95)
        == 3
    )
    # BlackMamba, C0=83, C1=0.88, 5.6 GB (Table I), 48 GB, seq 512, sparsity 0.25:
    # per query 512*(0.12+0.22) = 174.08; 83*42.4/174.08 = 3519.2/174.08 = 20.216 -> 20
    assert (
        max_batch_size_eq1(gpu_memory_gb=48, model_memory_gb=5.6, seq_len_tokens=512, sparsity=0.25, c0=83, c1=0.88)
        == 20
    )


def test_eq1_zero_when_model_does_not_fit() -> None:
    # 24 GB card, 23.35 GB model: 62*0.65/170.24 = 0.24 -> 0 (fits the weights, not one query)
    assert _eq1_artifact(24) == 0
    assert _eq1_artifact(23.35) == 0  # no free memory
    assert _eq1_artifact(16) == 0  # the weights alone do not fit


def test_eq1_monotone_in_memory_and_sparsity() -> None:
    assert _eq1_artifact(48, sparsity=1.0) < _eq1_artifact(48, sparsity=0.25)
    sizes = [_eq1_artifact(g) for g in (40, 48, 80, 100, 120, 141)]
    assert sizes == sorted(sizes)


def test_eq1_rejects_nonpositive_seq_len() -> None:
    with pytest.raises(TunecostError, match="sequence length"):
        max_batch_size_eq1(gpu_memory_gb=48, model_memory_gb=23.35, seq_len_tokens=0, sparsity=0.25, c0=62, c1=0.89)


def test_sparsity_fraction() -> None:
    assert sparsity_fraction(2, 8) == 0.25  # the paper's sparse setup
    assert sparsity_fraction(8, 8) == 1.0  # dense
    for bad in (0, 9):
        with pytest.raises(TunecostError, match="1..8"):
            sparsity_fraction(bad, 8)


# ---- eq. (2): throughput -------------------------------------------------------------------------------------


def test_eq2_printed_hand_computed() -> None:
    # C2*log(B/(s*C3))+C4 with C2=1, C3=1.8, C4=0.5, B=4, s=0.25: log(4/0.45) = log(8.8889) = 2.18480 -> 2.68480
    assert throughput_eq2_printed(batch_size=4, sparsity=0.25, c2=1.0, c3=1.8, c4=0.5) == pytest.approx(
        2.684802, abs=1e-6
    )
    # "C4 ... equals the throughput when ... the logarithmic part is zero" (§V-B): B = s*C3
    assert throughput_eq2_printed(batch_size=0.45, sparsity=0.25, c2=3.0, c3=1.8, c4=0.7) == pytest.approx(0.7)


def test_eq2_artifact_hand_computed() -> None:
    # a + b*log(B)/(s*c3), a=0.3, b=0.2, c3=1.8, B=4, s=0.25: 0.2*1.386294/0.45 = 0.616131 -> 0.916131
    assert throughput_eq2_artifact(batch_size=4, sparsity=0.25, a=0.3, b=0.2, c3=1.8) == pytest.approx(
        0.916131, abs=1e-6
    )
    # batch 1: log(1) = 0, the throughput is the intercept a whatever the sparsity
    for s in (0.25, 1.0):
        assert throughput_eq2_artifact(batch_size=1, sparsity=s, a=0.3, b=0.2, c3=1.8) == pytest.approx(0.3)
    # dense, B=8: 0.3 + 0.2*log(8)/1.8 = 0.3 + 0.2*2.079442/1.8 = 0.531049
    assert throughput_eq2_artifact(batch_size=8, sparsity=1.0, a=0.3, b=0.2, c3=1.8) == pytest.approx(
        0.531049, abs=1e-6
    )


def test_eq2_forms_differ_only_by_a_constant_at_fixed_sparsity() -> None:
    # At one sparsity, printed with C2 = b/(s*c3), C4 = a - C2*log(1/(s*c3)) equals the artifact form.
    a, b, c3, s = 0.3, 0.2, 1.8, 0.25
    c2 = b / (s * c3)
    c4 = a - c2 * math.log(1 / (s * c3))
    for batch in (1, 2, 5, 17):
        assert throughput_eq2_printed(batch_size=batch, sparsity=s, c2=c2, c3=c3, c4=c4) == pytest.approx(
            throughput_eq2_artifact(batch_size=batch, sparsity=s, a=a, b=b, c3=c3)
        )


# ---- cost (§V-C, Table IV) -----------------------------------------------------------------------------------
# Table IV ("Mixtral on GS with sparse MoE", 10 epochs, CUDO prices). The printed costs reproduce with 15000
# queries (commonsense_15k's size, Table II), not 14000 (math_14k, which §V-C names): with 14000 the A40 row
# would be $30.42. Hand computation: cost = 15000*10/qps/3600 * $/h.


@pytest.mark.parametrize(
    ("qps", "usd_per_hour", "hours", "usd", "target", "tolerance"),
    [
        # 150000/1.01 = 148514.85 s = 41.2541 h; * 0.79 = 32.5908. The paper prints 32.7; we require
        # 32.6 +- 0.3.
        (1.01, 0.79, 41.254125, 32.590759, 32.6, 0.3),
        # 150000/2.74 = 54744.53 s = 15.2068 h; * 1.67 = 25.3954; printed 25.4 (one decimal: +- 0.05)
        (2.74, 1.67, 15.206813, 25.395377, 25.4, 0.05),
        # 150000/4.90 = 30612.24 s = 8.5034 h; * 2.1 = 17.8571; printed 17.9 (one decimal: +- 0.05)
        (4.90, 2.1, 8.503401, 17.857143, 17.9, 0.05),
    ],
)
def test_table_iv(qps: float, usd_per_hour: float, hours: float, usd: float, target: float, tolerance: float) -> None:
    seconds = training_seconds(num_queries=15000, epochs=10, queries_per_s=qps)
    assert seconds / 3600 == pytest.approx(hours, abs=1e-6)
    got = cost_usd(num_queries=15000, epochs=10, queries_per_s=qps, usd_per_gpu_hour=usd_per_hour)
    assert got == pytest.approx(usd, abs=1e-6)
    assert abs(got - target) <= tolerance


def test_cost_scales_with_gpus() -> None:
    one = cost_usd(num_queries=1000, epochs=2, queries_per_s=2.0, usd_per_gpu_hour=3.6)
    assert one == pytest.approx(1.0)  # 2000 q / 2 qps = 1000 s = 0.2778 h; * 3.6 = 1.0
    assert cost_usd(num_queries=1000, epochs=2, queries_per_s=2.0, usd_per_gpu_hour=3.6, num_gpus=4) == pytest.approx(
        4.0
    )


@pytest.mark.parametrize("bad", [0, -1, -0.5])
@pytest.mark.parametrize("field", ["num_queries", "epochs", "queries_per_s", "usd_per_gpu_hour"])
def test_cost_rejects_nonpositive_inputs(field: str, bad: float) -> None:
    kwargs = {"num_queries": 15000, "epochs": 10, "queries_per_s": 1.01, "usd_per_gpu_hour": 0.79, field: bad}
    if field == "usd_per_gpu_hour" and bad == 0:  # owned hardware
        assert cost_usd(**kwargs) == 0
        return
    with pytest.raises(TunecostError, match="must be >= 0" if field == "usd_per_gpu_hour" else "must be > 0"):
        cost_usd(**kwargs)
    if field != "usd_per_gpu_hour":
        kwargs.pop("usd_per_gpu_hour")
        with pytest.raises(TunecostError, match="must be > 0"):
            training_seconds(**kwargs)
