"""The record kinds of results.schema: `record` holds a row to its kind, and docs/dev/records.md names every kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.results.records import record
from tunecost.results.schema import POINT_KEYS, RECORD_KINDS, point_id

DOC = Path(__file__).resolve().parents[2] / "docs" / "dev" / "records.md"


def test_a_row_without_a_field_of_its_kind_is_refused() -> None:
    keys = dict.fromkeys(POINT_KEYS, 1) | {"point_id": "p", "stage": "forward", "seconds": 0.1}
    assert record("stages", **keys, steps=3)["kind"] == "stages"
    with pytest.raises(ValueError, match="'stages' record lacks steps"):
        record("stages", **keys)
    with pytest.raises(ValueError, match="unknown record kind 'stage'"):
        record("stage", **keys, steps=3)


def test_the_point_id_is_the_same_whatever_the_order_of_the_keys() -> None:
    keys = {"model": "m", "method": "lora", "batch_size": 2, "seq_len": None, "extra": 1}
    assert point_id(keys) == point_id(dict(reversed(keys.items())))
    assert point_id(keys) == "model=m|method=lora|batch_size=2|seq_len=-|extra=1"


def test_the_records_doc_names_every_kind_and_file() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [f"{k} ({s.file})" for k, s in RECORD_KINDS.items() if f"`{s.file}`" not in text or k not in text]
    assert not missing, f"docs/dev/records.md does not describe: {missing}"
