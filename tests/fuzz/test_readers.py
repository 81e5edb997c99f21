"""Every reader a user's file goes through, fed arbitrary bytes and near-valid text (hypothesis): the result is
rows or a `TunecostError`, never another exception. Each test is bounded to a few seconds."""

from __future__ import annotations

import contextlib
import json
import tempfile
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunecost.errors import TunecostError

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

MEASUREMENT_HEADER = "model,dataset,gpu,experts_per_token,sparsity,batch_size,queries_per_s\n"
PRICES_HEADER = "provider,gpu,usd_per_gpu_hour,date,source_url\n"
TARGETS_HEADER = "model,dataset,gpu,experts_per_token,batch_size\n"

cells = st.one_of(
    st.sampled_from(["", "0", "-1", "1", "2", "8", "nan", "inf", "1e999", "1e300", "5e-324", "2.5", "x", "A40"]),
    st.sampled_from(["mixtral-8x7b", "blackmamba-2.8b", "gsm8k", "A40-48GB", "cudo", '"a,b"', '"', "\0", "é"]),
    st.text(max_size=8),
)
csv_rows = st.lists(st.lists(cells, min_size=0, max_size=8).map(",".join), max_size=5).map("\n".join)
raw = st.one_of(st.binary(max_size=300), st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")))


def _file(data: bytes, name: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="tunecost-fuzz-"))
    path = folder / name
    path.write_bytes(data)
    return path


def _only_tunecost_errors(read, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(TunecostError):
            read(path)


@FUZZ
@given(st.one_of(raw, csv_rows.map(lambda rows: (MEASUREMENT_HEADER + rows).encode())))
def test_measurements_csv(data: bytes) -> None:
    from tunecost.estimate.measurements import load_measurements

    _only_tunecost_errors(load_measurements, _file(data, "m.csv"))


@FUZZ
@given(st.one_of(raw, csv_rows.map(lambda rows: (PRICES_HEADER + rows).encode())))
def test_prices_csv(data: bytes) -> None:
    from tunecost.catalog.prices import price_catalog

    _only_tunecost_errors(price_catalog, _file(data, "p.csv"))


@FUZZ
@given(st.one_of(raw, csv_rows.map(lambda rows: (TARGETS_HEADER + rows).encode())))
def test_targets_csv(data: bytes) -> None:
    from tunecost.cli.commands.predict import read_targets

    _only_tunecost_errors(read_targets, _file(data, "t.csv"))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
dataset_keys = st.sampled_from(["instruction", "output", "input", "answer", "question", "ctx", "endings", "label"])
dataset_rows = st.dictionaries(dataset_keys, json_values, max_size=5)


@FUZZ
@given(
    st.one_of(
        raw.map(lambda b: (b, "d.jsonl")),
        raw.map(lambda b: (b, "d.json")),
        st.lists(dataset_rows, max_size=4).map(lambda rows: (json.dumps(rows).encode(), "d.json")),
        st.lists(dataset_rows, max_size=4).map(
            lambda rows: ("\n".join(json.dumps(r) for r in rows).encode(), "d.jsonl")
        ),
    )
)
def test_dataset_json_and_jsonl(case: tuple[bytes, str]) -> None:
    from tunecost.workload.datasets import load_dataset

    data, name = case
    _only_tunecost_errors(lambda p: load_dataset(str(p)), _file(data, name))


record_rows = st.dictionaries(
    st.sampled_from(["schema_version", "model", "batch_size", "queries_per_s", "experts_per_token", "gpu", "usd"]),
    json_values,
    max_size=7,
)


@FUZZ
@given(
    st.one_of(raw, st.lists(record_rows, max_size=4).map(lambda rs: "\n".join(map(json.dumps, rs)).encode())),
    st.one_of(raw, json_values.map(lambda v: json.dumps({"versions": v, "device": v}).encode())),
)
def test_run_records_and_meta(records: bytes, meta: bytes) -> None:
    from tunecost.io import read_jsonl
    from tunecost.report.html import _meta_html
    from tunecost.report.run_dir import load_run
    from tunecost.report.summary import summary_lines

    path = _file(records, "throughput.jsonl")
    (path.parent / "meta.json").write_bytes(meta)
    _only_tunecost_errors(read_jsonl, path)
    _only_tunecost_errors(lambda p: summary_lines(load_run(p.parent)), path)
    _only_tunecost_errors(lambda p: _meta_html(load_run(p.parent)), path)


gpu_values = st.one_of(
    json_values,
    st.sampled_from([1, 1.5, 0, -1, 1e300, 10**400, True, "1e12"]),
    st.integers(),
    st.floats(),
)


def _gpu_profile_doc(values: dict[str, object], value: object, extra: object) -> dict[str, object]:
    from tunecost.estimate.throughput.gpu_profile import VALUE_FIELDS

    fields = {f: {"value": values.get(f, value), "unit": "x", "method": "fuzz"} for f in VALUE_FIELDS}
    return {
        "schema_version": 1,
        "kind": "gpu_profile",
        "name": "G",
        "created": "now",
        "device": {},
        "values": fields,
        "gemms": extra,
    }


@FUZZ
@given(
    st.one_of(
        raw,
        json_values.map(lambda v: json.dumps(v).encode()),
        st.tuples(
            st.dictionaries(st.sampled_from(["matmul_flops_per_s", "kernel_launch_s"]), gpu_values),
            gpu_values,
            json_values,
        ).map(lambda t: json.dumps(_gpu_profile_doc(*t)).encode()),
        st.integers(1, 5000).map(lambda n: ("[" * n + "]" * n).encode()),
    )
)
def test_gpu_profile_json(data: bytes) -> None:
    from tunecost.estimate.throughput.gpu_profile import load_gpu_profile

    _only_tunecost_errors(load_gpu_profile, _file(data, "gpu.json"))


CORPUS_HEADER = (
    "id,source,model,method,lora_rank,lora_alpha,lora_targets,quantization,compute_dtype,batch_size_per_gpu,"
    "seq_len,seq_len_kind,grad_ckpt,attention,optimizer,stack,gpu,num_gpus,quantity,value,unit\n"
)
CORPUS_ROW = (
    "x-1,src,mixtral-8x7b,{method},{rank},{alpha},{targets},{quant},bf16,{batch},{seq},padded,on,sdpa,adamw,"
    "hf-transformers+peft,A100-SXM4-80GB,{gpus},{quantity},{value},GiB"
)
corpus_rows = st.builds(
    CORPUS_ROW.format,
    method=st.sampled_from(["full", "lora", "qlora", "x", ""]),
    rank=cells,
    alpha=cells,
    targets=st.sampled_from(["all", "q_proj;v_proj", "", "x"]),
    quant=st.sampled_from(["none", "nf4", "", "x"]),
    batch=cells,
    seq=cells,
    gpus=cells,
    quantity=st.sampled_from(["nvidia_smi_gib", "peak_allocated_gib", "oom", "tokens_per_s", "", "x"]),
    value=cells,
)


@FUZZ
@given(
    st.one_of(
        raw,
        csv_rows.map(lambda rows: (CORPUS_HEADER + rows).encode()),
        st.lists(corpus_rows, max_size=3).map(lambda rows: (CORPUS_HEADER + "\n".join(rows)).encode()),
    )
)
def test_validation_corpus_csv(data: bytes) -> None:
    from tunecost.validate import read_corpus, validate_rows

    _only_tunecost_errors(lambda p: validate_rows(read_corpus([p])), _file(data, "corpus.csv"))


@FUZZ
@given(
    st.one_of(
        raw,
        json_values.map(lambda v: json.dumps(v).encode()),
        json_values.map(lambda v: json.dumps({"lengths": v}).encode()),
        st.lists(cells, max_size=5).map(lambda xs: "\n".join(xs).encode()),
    )
)
def test_dataset_lengths_file(data: bytes) -> None:
    from tunecost.cli.commands.memory import _read_lengths

    _only_tunecost_errors(_read_lengths, _file(data, "lengths.json"))
