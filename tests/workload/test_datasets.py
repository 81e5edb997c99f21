from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunecost.errors import TunecostError
from tunecost.workload.datasets import load_dataset, parse_columns, rows_to_dataset
from tunecost.workload.formats import gsm8k_reference_answer
from tunecost.workload.known_datasets import DATA_DIR_ENV

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def test_llm_adapters_format():
    ds = load_dataset(str(FIXTURES / "llm_adapters_math.json"))
    assert (ds.format, len(ds), ds.name) == ("llm-adapters", 4, "llm_adapters_math")
    first = ds.examples[0]
    assert first.prompt.startswith("Tom has 3 apples") and first.response.startswith("\nA: Tom has")
    assert first.answer == "7.0"
    # a non-empty `input` is joined to the instruction with a newline, as LLaMA-Factory does
    assert ds.examples[3].prompt == "Half of 5 is what?\nGive a decimal."


def test_input_output_format_and_alpaca_rows_stay_alpaca():
    """NeMo's SFT JSONL and torchtune's instruct_dataset columns; an alpaca row (instruction, input, output) is
    still alpaca's."""
    ds = rows_to_dataset([{"input": "2+2?", "output": "4"}], name="nemo", source="nemo.jsonl")
    assert ds.format == "input-output" and (ds.examples[0].prompt, ds.examples[0].response) == ("2+2?", "4")
    alpaca = rows_to_dataset([{"instruction": "Add", "input": "2+2", "output": "4"}], name="a", source="a.json")
    assert alpaca.format == "llm-adapters"


def test_gsm8k_original_format():
    ds = load_dataset(str(FIXTURES / "gsm8k_original.jsonl"))
    assert ds.format == "gsm8k" and len(ds) == 3
    assert [e.answer for e in ds.examples] == ["72", "2500", "10"]
    assert ds.examples[0].response.endswith("#### 72")
    assert gsm8k_reference_answer("so 1,000\n#### 1,000") == "1000"
    with pytest.raises(ValueError):
        gsm8k_reference_answer("no final answer")


def test_hellaswag_format():
    ds = load_dataset(str(FIXTURES / "hellaswag.jsonl"))
    assert ds.format == "hellaswag" and len(ds) == 3
    ex = ds.examples[0]
    assert ex.label == 3 and len(ex.choices) == 4 and ex.response == ex.choices[3]
    assert ex.choices[0].startswith(" ")  # endings continue the context after a space
    wikihow = ds.examples[2]
    assert "[header]" not in wikihow.prompt and "[title]" not in wikihow.prompt and wikihow.label == 0


def test_column_mapping():
    ds = load_dataset(
        str(FIXTURES / "custom_columns.jsonl"), columns=parse_columns("prompt=question,response=solution,answer=final")
    )
    assert ds.format == "columns" and [e.answer for e in ds.examples] == ["42", "5"]
    with pytest.raises(TunecostError, match="KEY=COLUMN"):
        parse_columns("prompt")
    with pytest.raises(TunecostError, match="column mapping needs"):
        load_dataset(str(FIXTURES / "custom_columns.jsonl"), columns={"prompt": "question"})


CHAT = [("system", "Be brief."), ("user", "Name a colour."), ("assistant", "Blue."), ("user", "And another?")]


def test_chat_messages_and_sharegpt_conversations(tmp_path):
    """The prompt is every turn before the last assistant turn, the response that turn and the rest."""
    messages = [{"messages": [{"role": r, "content": c} for r, c in CHAT[:3]]}]
    roles = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = [{"conversations": [{"from": roles[r], "value": c} for r, c in CHAT]}]
    for rows, fmt in ((messages, "messages"), (sharegpt, "conversations")):
        ds = rows_to_dataset(rows, name="chat", source="chat")
        ex = ds.examples[0]
        assert ds.format == fmt and ex.prompt == "Be brief.\nName a colour." and ex.response.startswith("Blue.")
    assert ex.response == "Blue.\nAnd another?"
    path = tmp_path / "chat.parquet"  # list-of-struct cells come back from parquet as arrays
    import pandas as pd

    pd.DataFrame(messages * 2).to_parquet(path)
    assert load_dataset(str(path)).examples[1].response == "Blue."


def test_a_conversation_without_an_assistant_turn_is_a_malformed_row():
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}]
    rows.append({"messages": [{"role": "user", "content": "Hi"}]})
    with pytest.raises(TunecostError, match=r"row 2 is malformed \('messages' has no assistant turn\)"):
        rows_to_dataset(rows, name="chat", source="chat.json")
    with pytest.raises(TunecostError, match=r"row 1 is malformed \(turn 0 of 'messages' needs 'role'"):
        rows_to_dataset([{"messages": [{"text": "Hi"}]}], name="chat", source="chat.json")


def test_unknown_format_names_columns_and_accepted_formats():
    with pytest.raises(TunecostError) as err:
        load_dataset(str(FIXTURES / "unknown_format.json"))
    message = str(err.value)
    assert "['query', 'reply', 'score']" in message
    for accepted in ("instruction", "question", "ctx", "role, content", "from, value", "column mapping"):
        assert accepted in message


def test_malformed_row_reported_with_index_and_skipped_only_on_request():
    path = str(FIXTURES / "malformed_rows.json")
    with pytest.raises(TunecostError, match=r"row 2 is malformed \(missing 'output'\)"):
        load_dataset(path)
    ds = load_dataset(path, skip_bad_rows=True)
    assert len(ds) == 2 and ds.skipped_rows == (1,)


def test_non_json_line_reported_with_index():
    path = str(FIXTURES / "malformed_line.jsonl")
    with pytest.raises(TunecostError, match=r"row 2 is malformed \(line 2 is not JSON"):
        load_dataset(path)
    assert load_dataset(path, skip_bad_rows=True).skipped_rows == (1,)


def test_empty_dataset_is_an_error(tmp_path):
    with pytest.raises(TunecostError, match="empty"):
        load_dataset(str(FIXTURES / "empty.json"))
    with pytest.raises(TunecostError, match="empty"):
        rows_to_dataset([{"question": "q"}], name="x", source="test", fmt="gsm8k", skip_bad_rows=True)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(TunecostError, match="empty"):
        load_dataset(str(blank))


def test_bad_files_and_names(tmp_path):
    with pytest.raises(TunecostError, match="not found"):
        load_dataset(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(TunecostError, match="not valid JSON"):
        load_dataset(str(bad))
    with pytest.raises(TunecostError, match="Did you mean 'gsm8k'"):
        load_dataset("gsm8kk")
    with pytest.raises(TunecostError, match="unknown dataset format"):
        rows_to_dataset([{"a": 1}], name="x", source="x", fmt="nope")


def test_known_name_resolves_under_data_dir(tmp_path, monkeypatch):
    (tmp_path / "llm-adapters").mkdir()
    (tmp_path / "llm-adapters" / "boolq_test.json").write_text((FIXTURES / "llm_adapters_boolq.json").read_text())
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    ds = load_dataset("boolq")
    assert ds.name == "boolq" and len(ds) == 2 and ds.source.endswith("boolq_test.json")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(TunecostError, match="TUNECOST_DATA_DIR"):
        load_dataset("math_14k")


def test_hub_name_without_cache_or_download_is_a_clear_error(tmp_path, monkeypatch):
    import huggingface_hub

    def not_cached(*args, **kwargs):
        assert kwargs.get("local_files_only") is True  # never downloads unless allowed
        raise FileNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_cached)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(TunecostError, match="allow_download"):
        load_dataset("hellaswag")


def test_limit_and_synthetic_names():
    ds = load_dataset("synthetic-arith", limit=5)
    assert len(ds) == 5 and ds.format == "llm-adapters"
    assert load_dataset("synthetic-arith-test").name == "synthetic-arith-test"
    with pytest.raises(TunecostError, match="positive"):
        ds.head(0)


# ------------------------------------------------------------------------------------------ CLI: data stats


def _cli(args):
    from tunecost.cli.main import app

    return CliRunner().invoke(app, args)


def test_cli_data_stats_json_and_out(tmp_path):
    out = tmp_path / "lengths.jsonl"
    result = _cli(
        [
            "data",
            "stats",
            str(FIXTURES / "llm_adapters_math.json"),
            "--tokenizer",
            "mistral",
            "--template",
            "none",
            "--batch-size",
            "2",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_queries"] == 4 and "mistral" in report["tokenizer"] and report["template"] == "none"
    assert report["min_tokens"] <= report["median_tokens"] <= report["max_tokens"]
    assert sum(b["count"] for b in report["histogram"]) == 4
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["record"] == "summary" and rows[0]["kind"] == "lengths"
    assert sum(r["count"] for r in rows if r["record"] == "histogram") == 4


def test_cli_data_stats_writes_nothing_without_out_and_reports_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _cli(["data", "stats", str(FIXTURES / "gsm8k_original.jsonl")])
    assert result.exit_code == 0, result.output
    assert "gsm8k_original" in result.output and "mistral" in result.output
    assert list(tmp_path.iterdir()) == []
    bad = _cli(["data", "stats", str(FIXTURES / "malformed_rows.json")])
    assert bad.exit_code == 2 and "row 2" in bad.output
    skipped = _cli(["data", "stats", str(FIXTURES / "malformed_rows.json"), "--skip-bad-rows", "--json"])
    assert skipped.exit_code == 0 and json.loads(skipped.stdout)["skipped_rows"] == [2]
    listing = _cli(["data", "list", "--json"])
    assert listing.exit_code == 0 and any(r["name"] == "math_14k" for r in json.loads(listing.stdout))
    from tunecost.catalog.datasets import dataset_catalog

    assert set(dataset_catalog()) <= {r["name"] for r in json.loads(listing.stdout)}  # every name estimate takes


def test_a_catalog_dataset_name_loads_its_hub_copy(monkeypatch) -> None:
    """`tunecost data stats alpaca`: the catalog's hub id and split, read from the local cache (never a download
    unless allowed)."""
    import tunecost.workload.datasets as datasets_module

    asked = []

    def rows(repo_id, config, split, *, allow_download):
        asked.append((repo_id, config, split, allow_download))
        return [{"instruction": "Add 2 and 3.", "input": "", "output": "5"}]

    monkeypatch.setattr(datasets_module, "load_hub_rows", rows)
    ds = datasets_module.load_dataset("alpaca")
    assert asked == [("tatsu-lab/alpaca", None, "train", False)] and len(ds) == 1
