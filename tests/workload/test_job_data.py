"""The data of a job to price (tunecost.workload.job_data): a file's real token lengths or a catalog's facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tunecost.workload.job_data as job_data_module
from tunecost.errors import TunecostError
from tunecost.workload.job_data import JobData, job_data
from tunecost.workload.known_datasets import DATA_DIR_ENV
from tunecost.workload.tokenizers import tokenizer_by_name

ROWS = [
    {"instruction": "What is 2 plus 3?", "input": "", "output": "2 + 3 = 5. The answer is 5."},
    {"instruction": "Name a colour.", "input": "", "output": "Blue."},
    {"instruction": "Double the number.", "input": "21", "output": "21 x 2 = 42."},
]


@pytest.fixture(autouse=True)
def no_user_state(monkeypatch, tmp_path: Path) -> None:
    """No ~/.cache/tunecost and no user data folder; fresh in-process caches (tests patch the tokenizer)."""
    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    job_data_module._loads.cache_clear()
    job_data_module._lengths.cache_clear()


@pytest.fixture
def jsonl(write_file) -> Path:
    return write_file("data.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS))


def hand_count(row: dict) -> int:
    """BOS + the Mixtral tokens of instruction (+ "\\n" + input) + output: template "none", as `data stats`."""
    prompt = row["instruction"] + (f"\n{row['input']}" if row["input"] else "")
    return 1 + len(tokenizer_by_name("mistral").encode(prompt + row["output"]))


def test_a_file_is_counted_with_the_offline_mixtral_tokenizer(jsonl: Path):
    data = job_data(str(jsonl), model="mixtral-8x7b")
    assert (data.name, data.num_queries) == (str(jsonl), 3)
    assert data.lengths == tuple(hand_count(r) for r in ROWS)
    assert data.tokenizer is not None and data.tokenizer.startswith("mistral-v1")
    assert f"lengths of {jsonl}: 3 examples" in data.note
    assert "template none" in data.note and "mixtral-8x7b's own, offline copy" in data.note
    assert f"max {max(data.lengths)} tokens" in data.note


def test_another_model_gets_a_stand_in_when_its_tokenizer_is_not_local(jsonl: Path, monkeypatch):
    def offline_only(name: str, *, allow_download: bool = False):
        if name != "mistral":
            raise TunecostError(f"cannot load tokenizer {name!r}")
        return tokenizer_by_name(name)

    monkeypatch.setattr(job_data_module, "tokenizer_by_name", offline_only)
    data = job_data(str(jsonl), model="qwen2.5-0.5b")
    assert data.lengths == tuple(hand_count(r) for r in ROWS)
    assert "offline stand-in for qwen2.5-0.5b's own" in data.note


def test_the_models_own_tokenizer_when_it_loads(jsonl: Path, monkeypatch):
    asked = []

    def any_name(name: str, *, allow_download: bool = False):
        asked.append(name)
        return tokenizer_by_name("mistral")

    monkeypatch.setattr(job_data_module, "tokenizer_by_name", any_name)
    data = job_data(str(jsonl), model="qwen2.5-0.5b")
    assert "Qwen/Qwen2.5-0.5B" in asked
    assert "Qwen/Qwen2.5-0.5B's tokenizer (qwen2.5-0.5b's own)" in data.note


def test_counts_are_cached_per_file_version(jsonl: Path):
    first = job_data(str(jsonl), model="mixtral-8x7b")
    assert job_data(str(jsonl), model="mixtral-8x7b").lengths is first.lengths  # tokenized once
    jsonl.write_text(json.dumps(ROWS[0]) + "\n", encoding="utf-8")  # another size: counted again
    assert job_data(str(jsonl), model="mixtral-8x7b").num_queries == 1


def test_a_catalog_dataset_gives_its_facts_without_lengths():
    data = job_data("Commonsense_15K", model="mixtral-8x7b")
    assert (data.name, data.num_queries, data.lengths, data.tokenizer) == ("commonsense_15k", 15000, None, None)
    assert "not measured" in data.note and "median of 79 tokens" in data.note  # the paper's Fig. 2 median


def test_a_catalog_dataset_with_a_local_file_is_measured(monkeypatch, tmp_path: Path):
    (tmp_path / "math_14k.json").write_text(json.dumps(ROWS), encoding="utf-8")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    data = job_data("math_14k", model="mixtral-8x7b")
    assert (data.name, data.num_queries) == ("math_14k", 3)
    assert data.lengths == tuple(hand_count(r) for r in ROWS)
    assert data.note.startswith(f"lengths of math_14k ({tmp_path / 'math_14k.json'})")


@pytest.mark.parametrize("name", ["alpaca-cleaned", "yahma/alpaca-cleaned"])
def test_a_catalog_datasets_copy_in_the_local_hub_cache_is_measured(hub_cache, name: str):
    hub_cache("yahma/alpaca-cleaned", ROWS)
    data = job_data(name, model="mixtral-8x7b")
    assert (data.name, data.num_queries) == ("alpaca-cleaned", 3)  # the copy's rows, not the catalog's 51,760
    assert data.lengths == tuple(hand_count(r) for r in ROWS)
    assert data.note.startswith("lengths of alpaca-cleaned (yahma/alpaca-cleaned): 3 examples")


def test_a_chat_dataset_in_the_hub_cache_is_measured_on_its_split(hub_cache):
    """ultrachat-200k trains on split train_sft, a file named for it; its rows are role/content messages."""
    chats = [[("user", r["instruction"]), ("assistant", r["output"])] for r in ROWS]
    rows = [{"prompt": c[0][1], "messages": [{"role": role, "content": text} for role, text in c]} for c in chats]
    hub_cache("HuggingFaceH4/ultrachat_200k", rows, file="data/train_sft-00000-of-00001.json")
    data = job_data("ultrachat-200k", model="mixtral-8x7b")
    expected = [1 + len(tokenizer_by_name("mistral").encode(r["instruction"] + r["output"])) for r in ROWS]
    assert data.num_queries == 3 and data.lengths == tuple(expected)


def test_a_sharegpt_copy_whose_hub_id_has_a_dot_is_measured(hub_cache):
    turns = [[{"from": "human", "value": r["instruction"]}, {"from": "gpt", "value": r["output"]}] for r in ROWS]
    hub_cache("teknium/OpenHermes-2.5", [{"conversations": t} for t in turns])
    data = job_data("openhermes-2.5", model="mixtral-8x7b")
    assert data.num_queries == 3 and data.note.startswith("lengths of openhermes-2.5 (teknium/OpenHermes-2.5)")


def test_a_hub_copy_it_cannot_read_leaves_the_facts_and_says_why(hub_cache):
    hub_cache("yahma/alpaca-cleaned", [{"text": "no prompt or response columns"}])
    data = job_data("alpaca-cleaned", model="mixtral-8x7b")
    assert (data.num_queries, data.lengths) == (51760, None)
    assert "lengths not measured" in data.note and "its local hub copy was not read: " in data.note


def test_an_embedded_known_dataset_is_measured():
    data = job_data("synthetic-arith", model="mixtral-8x7b")
    assert data.lengths is not None and data.num_queries == len(data.lengths) > 0


def test_an_unknown_name_lists_the_catalog_and_says_a_file_works():
    with pytest.raises(TunecostError, match="unknown dataset 'comonsense_15k'") as err:
        job_data("comonsense_15k", model="mixtral-8x7b")
    message = str(err.value)
    assert "Did you mean 'commonsense_15k'?" in message
    assert "commonsense_15k, dolly-15k, gsm8k" in message and "a file (.json" in message


def test_a_missing_file_is_named(tmp_path: Path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TunecostError, match=f"not found: {missing}.*Valid choices"):
        job_data(str(missing), model="mixtral-8x7b")


def test_a_malformed_file_names_its_row(write_file):
    bad = write_file("bad.jsonl", json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(TunecostError, match=f"{bad}: row 2 is malformed"):
        job_data(str(bad), model="mixtral-8x7b")


def test_job_data_checks_itself():
    with pytest.raises(TunecostError):
        JobData(name="d", num_queries=2, lengths=(3,), tokenizer="t", note="")
    with pytest.raises(TunecostError):
        JobData(name="d", num_queries=0, lengths=None, tokenizer=None, note="")
