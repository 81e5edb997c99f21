"""The ncu CSV parser on fixtures in ncu's documented layouts (tests/fixtures/ncu/README.md), and the time-weighted
utilization of Figs. 9 and 10 checked against hand sums."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.profile import kernels as K
from tunecost.profile import nvtx as N
from tunecost.profile.ncu import (
    ALL_CLASSES,
    KernelCounterRow,
    duration_seconds,
    parse_ncu_csv,
    parse_ncu_csv_file,
    parse_number,
    parse_nvtx_cell,
    time_weighted_utilization,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ncu"


def test_numbers_and_units():
    assert parse_number("1,234,567.5") == 1234567.5
    assert parse_number(" 12 ") == 12.0
    assert parse_number("n/a") is None
    assert parse_number("") is None
    assert duration_seconds("30,000", "nsecond") == pytest.approx(30e-6)
    assert duration_seconds("750.00", "usecond") == pytest.approx(750e-6)
    assert duration_seconds("1.25", "msecond") == pytest.approx(1.25e-3)
    assert duration_seconds("2", "second") == 2.0
    assert duration_seconds("5", "") == pytest.approx(5e-9)  # gpu__time_duration's base unit is ns
    assert duration_seconds("5", "cycle") is None
    assert duration_seconds("n/a", "nsecond") is None


def test_nvtx_cell():
    cell = (
        '3170  "<default domain>:tunecost.moe:none:none:none:none:none:none"  '
        '"<default domain>:tunecost.moe.experts:none:none:none:none:none:none" '
    )
    assert parse_nvtx_cell(cell) == (N.MOE_BLOCK, N.EXPERTS)
    # a range name holding ":" survives (the six attribute fields are counted from the end)
    assert parse_nvtx_cell('1  "<default domain>:a:b:none:none:none:none:none:none"') == ("a:b",)
    assert parse_nvtx_cell("") == ()


def test_raw_page_fixture():
    result = parse_ncu_csv_file(FIXTURES / "raw_moe.csv", batch_size=32)
    rows = {r.launch_id: r for r in result.rows}
    assert sorted(rows) == list(range(11))  # launches 0..10; the truncated row and the n/a duration are skipped
    assert all(r.batch_size == 32 and r.source == "ncu" for r in result.rows)
    first = rows[0]
    assert first.kernel_class == K.MATMUL_W1W3_GATE_UP
    assert first.nvtx_ranges == (N.MOE_BLOCK, N.EXPERTS, N.W1W3)
    assert first.duration_s == pytest.approx(30_000e-9)  # "30,000" nsecond
    assert (first.sm_pct, first.dram_pct, first.mem_pct) == (60.0, 20.0, 30.0)
    assert first.kernel_name.startswith("void cutlass::Kernel2<")
    classes = {i: r.kernel_class for i, r in rows.items()}
    assert classes == {
        0: K.MATMUL_W1W3_GATE_UP,
        1: K.MATMUL_W2_DOWN,
        2: K.ROUTER,
        3: K.SOFTMAX,
        4: K.TOPK,
        5: K.ELEMENTWISE,
        6: K.DEQUANTIZE,
        7: K.OTHER,
        8: K.MATMUL_W1W3_GATE_UP,
        9: K.LORA,
        10: K.OTHER,
    }
    # kernel names with commas inside quotes came through whole
    assert rows[4].kernel_name.endswith("T2, T1 *)")
    assert rows[10].nvtx_ranges == ()  # a launch outside any range
    assert rows[7].sm_pct is None and rows[7].dram_pct == 30.0  # "n/a" SM throughput kept as None
    warnings = " | ".join(result.warnings)
    assert "line 15: expected 17 fields, got 9" in warnings
    assert "line 16: unusable duration 'n/a'" in warnings
    assert "line 11: no usable sm__throughput" in warnings


def test_all_rows_bad_names_the_first_bad_line():
    with pytest.raises(TunecostError, match=r"no usable kernel rows.*line 3: unusable duration 'n/a'.*2 more"):
        parse_ncu_csv_file(FIXTURES / "raw_all_bad.csv")


def test_not_an_ncu_export():
    with pytest.raises(TunecostError, match="not an ncu CSV export"):
        parse_ncu_csv("==PROF== Connected\nhello,world\n")
    with pytest.raises(TunecostError, match="no gpu__time_duration.sum column"):
        parse_ncu_csv('"ID","Kernel Name","sm__throughput.avg.pct_of_peak_sustained_elapsed"\n"","","%"\n"0","k","5"\n')


def test_header_only_is_empty_with_a_warning():
    result = parse_ncu_csv('"ID","Kernel Name","gpu__time_duration.sum"\n"","","nsecond"\n==PROF== Disconnected\n')
    assert result.rows == ()
    assert "no kernel rows" in result.warnings[0]


def test_details_page_fixture():
    result = parse_ncu_csv_file(FIXTURES / "details_moe.csv", batch_size=1)
    assert [r.kernel_class for r in result.rows] == [K.MATMUL_W1_GATE, K.MATMUL_W3_UP]
    w1, w3 = result.rows
    assert w1.duration_s == pytest.approx(1.25e-3)  # "1.25" msecond
    assert (w1.sm_pct, w1.dram_pct, w1.mem_pct) == (72.1, 38.5, 41.2)
    assert w3.duration_s == pytest.approx(750e-6)  # "750.00" usecond
    assert (w3.sm_pct, w3.dram_pct) == (50.0, 25.0)
    assert any("unusable duration 'n/a'" in w for w in result.warnings)  # the all-n/a launch 2


def test_time_weighted_utilization_by_hand():
    util = time_weighted_utilization(parse_ncu_csv_file(FIXTURES / "raw_moe.csv", batch_size=32).rows)
    gate_up = util[(32, K.MATMUL_W1W3_GATE_UP)]  # launches 0 and 8
    assert gate_up.num_kernels == 2
    assert gate_up.duration_s == pytest.approx(40_000e-9)
    assert gate_up.sm_pct == pytest.approx((30_000 * 60 + 10_000 * 80) / 40_000)  # 65.0
    assert gate_up.dram_pct == pytest.approx((30_000 * 20 + 10_000 * 40) / 40_000)  # 25.0
    assert gate_up.mem_pct == pytest.approx((30_000 * 30 + 10_000 * 45) / 40_000)  # 33.75
    other = util[(32, K.OTHER)]  # launch 7 (SM n/a) and launch 10: a missing value is left out, not zero
    assert other.sm_pct == pytest.approx(90.0)
    assert other.dram_pct == pytest.approx((500 * 30 + 1_000 * 1) / 1_500)
    durations_ns = [30_000, 10_000, 2_000, 1_000, 1_000, 4_000, 6_000, 500, 10_000, 2_000, 1_000]
    sm = [60, 40, 10, 5, 3, 20, 80, None, 80, 30, 90]
    dram = [20, 50, 5, 10, 2, 70, 60, 30, 40, 10, 1]
    total = util[(32, ALL_CLASSES)]
    assert total.num_kernels == 11
    assert total.duration_s == pytest.approx(67_500e-9)
    assert total.sm_pct == pytest.approx(3_738_000 / 67_000)  # sum(d*sm) over the 10 with a value / their time
    assert total.sm_pct == pytest.approx(
        sum(d * s for d, s in zip(durations_ns, sm) if s is not None) / sum(d for d, s in zip(durations_ns, sm) if s)
    )
    assert total.dram_pct == pytest.approx(2_198_000 / 67_500)
    assert total.dram_pct == pytest.approx(sum(d * u for d, u in zip(durations_ns, dram)) / sum(durations_ns))
    assert gate_up.time_share == pytest.approx(40_000 / 67_500)
    assert sum(u.time_share for (b, c), u in util.items() if c != ALL_CLASSES) == pytest.approx(1.0)


def _row(batch: int, cls: str, seconds: float, sm: float | None, dram: float | None) -> KernelCounterRow:
    return KernelCounterRow(
        kernel_name="k",
        kernel_class=cls,
        nvtx_ranges=(),
        duration_s=seconds,
        sm_pct=sm,
        dram_pct=dram,
        batch_size=batch,
    )


def test_time_weighting_keeps_batch_sizes_apart():
    rows = [
        _row(1, K.MATMUL_W2_DOWN, 1.0, 10.0, 80.0),
        _row(1, K.MATMUL_W2_DOWN, 3.0, 30.0, 40.0),
        _row(8, K.MATMUL_W2_DOWN, 2.0, 90.0, 20.0),
        _row(8, K.SOFTMAX, 2.0, None, None),
    ]
    util = time_weighted_utilization(rows)
    assert util[(1, K.MATMUL_W2_DOWN)].sm_pct == pytest.approx((1 * 10 + 3 * 30) / 4)  # 25, not the mean 20
    assert util[(1, K.MATMUL_W2_DOWN)].dram_pct == pytest.approx((1 * 80 + 3 * 40) / 4)  # 50
    assert util[(8, K.MATMUL_W2_DOWN)].sm_pct == pytest.approx(90.0)
    assert util[(8, K.SOFTMAX)].sm_pct is None  # durations only (torch.profiler rows): no utilization
    assert util[(8, ALL_CLASSES)].sm_pct == pytest.approx(90.0)
    assert util[(8, ALL_CLASSES)].time_share == 1.0
    assert util[(8, K.SOFTMAX)].time_share == pytest.approx(0.5)
    assert next(iter(util)) == (1, ALL_CLASSES)  # ordered by batch size, then class name
