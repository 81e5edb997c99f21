"""The safety margin on a predicted fit (data/memory_margin.csv), as benchmarks/memory_margin.py computed it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.catalog.memory_margin import MemoryMargin, default_memory_margin, load_memory_margins, margin_note
from tunecost.errors import TunecostError


def test_bundled_default_margin() -> None:
    m = default_memory_margin()
    assert 0 < m.fraction < 0.5
    assert m.quantile == 0.9
    assert m.rows > 100  # validate's modelled peak-memory rows of the shipped corpus
    assert "benchmarks/memory_margin.py" in m.command
    assert m.as_of


def test_note_names_percentile_and_rows() -> None:
    m = default_memory_margin()
    note = margin_note(m)
    assert f"safety margin {round(m.fraction * 100)} %" in note
    assert "90th percentile" in note
    assert f"over {m.rows} published memory measurements" in note
    assert "benchmarks/memory_margin.py" in note and m.as_of in note


def test_note_of_a_given_margin() -> None:
    m = MemoryMargin(
        fraction=0.08, quantile=0.9, rows=179, command="python benchmarks/x.py --write", as_of="2026-12-01"
    )
    assert margin_note(m) == (
        "safety margin 8 %: the 90th percentile of under-prediction over 179 published memory measurements "
        "(benchmarks/x.py, 2026-12-01)"
    )


def test_bad_fraction_names_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "memory_margin.csv"
    path.write_text("# margins\nname,fraction,quantile,rows,command,as_of\ndefault,1.5,0.9,10,cmd,2026-12-01\n")
    with pytest.raises(TunecostError, match=r"memory_margin\.csv: row 1: fraction"):
        load_memory_margins(path)
