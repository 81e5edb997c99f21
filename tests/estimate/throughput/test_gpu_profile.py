"""The GPU profile file: round trip and every malformed case (each a TunecostError naming file and field)."""

from __future__ import annotations

import copy
import json

import pytest

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.gpu_profile import (
    OPTIONAL_VALUES,
    REQUIRED_VALUES,
    load_gpu_profile,
    profile_document,
    write_gpu_profile,
)

TERMS = GpuTerms(
    name="Test GPU",
    matmul_flops_per_s=5.0e14,
    matmul_half_rows=96.0,
    fp32_flops_per_s=5.0e13,
    memory_bytes_per_s=2.5e12,
    dequant_bytes_per_s=1.0e12,
    kernel_launch_s=6e-6,
    host_step_s=4e-5,
    source="test",
)
META = {
    "created": "2026-11-25T06:00:00+00:00",
    "device": {"kind": "cuda", "name": "Test GPU", "torch": "2.x", "cuda": "12.x"},
    "methods": {"matmul_flops_per_s": "square GEMM"},
}


def _write_doc(tmp_path, doc, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_round_trip_keeps_every_value_and_names_the_source(tmp_path):
    path = write_gpu_profile(tmp_path / "gpu.json", TERMS, META)
    back = load_gpu_profile(path)
    for field in (*REQUIRED_VALUES, *OPTIONAL_VALUES):
        assert getattr(back, field) == getattr(TERMS, field), field
    assert back.name == "Test GPU"
    assert back.source == "profile: gpu.json measured 2026-11-25T06:00:00+00:00 on Test GPU"
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 1 and doc["device"]["cuda"] == "12.x"
    assert doc["values"]["matmul_flops_per_s"] == {"value": 5.0e14, "unit": "FLOP/s", "method": "square GEMM"}


def test_optional_values_may_be_null(tmp_path):
    terms = GpuTerms(name="cpu", matmul_flops_per_s=1e11, fp32_flops_per_s=1e11, memory_bytes_per_s=1e10, source="test")
    back = load_gpu_profile(write_gpu_profile(tmp_path / "cpu.json", terms, META))
    assert all(getattr(back, f) is None for f in OPTIONAL_VALUES)


def test_existing_file_is_kept_without_overwrite(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text("mine", encoding="utf-8")
    with pytest.raises(TunecostError, match="already exists"):
        write_gpu_profile(path, TERMS, META)
    assert path.read_text() == "mine"
    write_gpu_profile(path, TERMS, META, overwrite=True)
    assert load_gpu_profile(path).matmul_flops_per_s == 5.0e14


def test_writer_refuses_a_profile_it_could_not_read_back(tmp_path):
    bad = GpuTerms(name="x", matmul_flops_per_s=float("nan"), fp32_flops_per_s=1, memory_bytes_per_s=1, source="t")
    with pytest.raises(TunecostError, match="matmul_flops_per_s"):
        write_gpu_profile(tmp_path / "bad.json", bad, META)
    assert not (tmp_path / "bad.json").exists()


def _mutations():
    good = profile_document(TERMS, META)

    def mutate(fn):
        doc = copy.deepcopy(good)
        fn(doc)
        return doc

    yield "schema", mutate(lambda d: d.update(schema_version=2)), "schema_version"
    yield "schema-missing", mutate(lambda d: d.pop("schema_version")), "schema_version"
    yield "kind", mutate(lambda d: d.update(kind="run")), "kind"
    yield "name-missing", mutate(lambda d: d.pop("name")), "'name'"
    yield "created-type", mutate(lambda d: d.update(created=5)), "'created'"
    yield "device-type", mutate(lambda d: d.update(device="H100")), "'device'"
    yield "values-missing", mutate(lambda d: d.pop("values")), "'values'"
    for field in (*REQUIRED_VALUES, *OPTIONAL_VALUES):
        yield f"{field}-missing", mutate(lambda d, f=field: d["values"].pop(f)), f"values.{field}"
    for field in REQUIRED_VALUES:
        yield f"{field}-null", mutate(lambda d, f=field: d["values"][f].update(value=None)), f"values.{field}"
    for field in (*REQUIRED_VALUES, *OPTIONAL_VALUES):
        for label, bad in (("str", "1e12"), ("bool", True), ("nan", float("nan")), ("inf", float("inf")), ("0", 0)):
            yield (
                f"{field}-{label}",
                mutate(lambda d, f=field, b=bad: d["values"][f].update(value=b)),
                f"values.{field}",
            )
    yield "negative", mutate(lambda d: d["values"]["kernel_launch_s"].update(value=-1e-6)), "values.kernel_launch_s"
    yield "entry-not-object", mutate(lambda d: d["values"].update(host_step_s=4e-5)), "values.host_step_s"
    yield "method-missing", mutate(lambda d: d["values"]["host_step_s"].pop("method")), "values.host_step_s.method"
    yield (
        "unknown-field",
        mutate(lambda d: d["values"].update(matmul_flops={"value": 1, "method": "x"})),
        "matmul_flops",
    )


@pytest.mark.parametrize(("label", "doc", "field"), list(_mutations()), ids=[m[0] for m in _mutations()])
def test_malformed_profile_names_file_and_field(tmp_path, label, doc, field):
    path = _write_doc(tmp_path, doc)
    with pytest.raises(TunecostError) as err:
        load_gpu_profile(path)
    assert str(path) in str(err.value) and field in str(err.value), str(err.value)


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", '"a string"'])
def test_not_a_profile_object(tmp_path, text):
    path = tmp_path / "p.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TunecostError, match=str(path)):
        load_gpu_profile(path)


def test_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(TunecostError, match="calibrate-gpu"):
        load_gpu_profile(tmp_path / "none.json")
