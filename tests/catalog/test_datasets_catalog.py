"""The dataset catalog beyond the paper's rows: names and hub ids, row counts with sources, token-length statistics
and how the length model uses them (tunecost.catalog.datasets, tunecost.estimate.throughput.lengths)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tunecost.catalog.datasets as datasets_module
from tunecost.catalog.datasets import DATASET_CATALOG_PATH, dataset_catalog, get_dataset_facts
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.lengths import (
    DEFAULT_LOG_SIGMA,
    dataset_lengths,
    log_sigma_from_p95,
    lognormal_lengths,
    median_from_mean_tokens,
)

# (spelling a user types, hub id, catalog name, rows of the split) -- sources in datasets.csv / docs/datasets.md
LISTED = [
    ("alpaca", "tatsu-lab/alpaca", "alpaca", 52002),  # Stanford Alpaca datasheet: 52,002 instances
    ("alpaca_cleaned", "yahma/alpaca-cleaned", "alpaca-cleaned", 51760),  # viewer 51.8k rows
    ("dolly-15k", "databricks/databricks-dolly-15k", "dolly-15k", 15011),
    ("OpenHermes-2.5", "teknium/OpenHermes-2.5", "openhermes-2.5", 1000000),  # "1 million" (rounded by the card)
    ("UltraChat-200k", "HuggingFaceH4/ultrachat_200k", "ultrachat-200k", 207865),  # card: train_sft 207865
    ("SlimOrca", "Open-Orca/SlimOrca", "slimorca", 517982),
    ("MetaMathQA", "meta-math/MetaMathQA", "metamathqa", 395000),  # MetaMathQA-395K
    ("CodeAlpaca", "sahil2801/CodeAlpaca-20k", "codealpaca-20k", 20022),
    ("OpenAssistant", "OpenAssistant/oasst1", "oasst1", 84437),  # card: train 84437 messages
    ("GSM8K-train", "openai/gsm8k", "gsm8k-train", 7473),  # GSM8K train.jsonl lines; the hub id means train
]
LLM_ADAPTERS = [("commonsense_15k", 15000), ("math_14k", 14000), ("math_data", 3260)]
PAPER_ROWS = {"commonsense_15k": 79, "math_14k": 174, "hellaswag": 272, "gsm8k": 148}  # Table II / Fig. 2


def _clear_caches() -> None:
    dataset_catalog.cache_clear()
    dataset_lengths.cache_clear()


@pytest.fixture
def catalog_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """`catalog_with(ROW, ...)`: the bundled catalog plus these CSV rows, in place of the bundled one."""

    def use(*rows: str) -> Path:
        path = tmp_path / "datasets.csv"
        path.write_text(DATASET_CATALOG_PATH.read_text(encoding="utf-8") + "".join(f"{r}\n" for r in rows))
        monkeypatch.setattr(datasets_module, "DATASET_CATALOG_PATH", path)
        _clear_caches()
        return path

    yield use
    _clear_caches()  # before monkeypatch restores the path: the next lookup reads the bundled file again


@pytest.mark.parametrize(("spelling", "hub_id", "name", "num_queries"), LISTED)
def test_listed_datasets_resolve_by_name_and_hub_id(spelling: str, hub_id: str, name: str, num_queries: int) -> None:
    by_name, by_hub = get_dataset_facts(spelling), get_dataset_facts(hub_id)
    assert by_name is by_hub
    assert (by_name.name, by_name.num_queries, by_name.hub_id) == (name, num_queries, hub_id)
    assert by_name.source and by_name.as_of and by_name.split
    # the hub id's last part in any case: this row, or (gsm8k) the catalog row of that name from the same hub id
    assert get_dataset_facts(hub_id.rsplit("/", 1)[-1].upper()).hub_id == hub_id


def test_a_hub_id_with_rows_of_several_splits_means_its_training_split() -> None:
    """ultrachat_200k has rows of train_sft and test_sft, none named "train": the hub id is the one named after it."""
    assert get_dataset_facts("HuggingFaceH4/ultrachat_200k").name == "ultrachat-200k"
    test = get_dataset_facts("ultrachat-200k-test-sft")
    assert (test.hub_id, test.split, test.num_queries) == ("HuggingFaceH4/ultrachat_200k", "test_sft", 23110)


@pytest.mark.parametrize(("name", "num_queries"), LLM_ADAPTERS)
def test_llm_adapters_sets_resolve(name: str, num_queries: int) -> None:
    facts = get_dataset_facts(name.replace("_", "-").upper())
    assert (facts.name, facts.num_queries) == (name, num_queries)
    assert facts.source and facts.as_of


def test_every_row_has_a_count_a_source_and_sourced_lengths() -> None:
    for facts in dataset_catalog().values():
        assert facts.num_queries >= 1 and facts.source and facts.as_of, facts.name
        measured = [facts.median_tokens, facts.p95_tokens, facts.max_tokens, facts.mean_tokens]
        if any(v is not None for v in measured):
            assert facts.tokenizer and facts.length_source, facts.name


def test_names_the_paper_uses_keep_their_rows() -> None:
    assert get_dataset_facts("GSM8K").name == "gsm8k"  # the paper's test split, not the hub id's train split
    assert get_dataset_facts("gsm8k_train").name == "gsm8k-train"
    with pytest.raises(TunecostError, match=r"Did you mean 'slimorca'\?"):
        get_dataset_facts("slimorka")


def test_length_summary_names_the_statistic_used() -> None:
    assert get_dataset_facts("math_14k").length_summary == "a log-normal around the paper's median of 174 tokens"
    assert get_dataset_facts("gsm8k").length_summary.endswith("paper's median of 148 tokens")
    assert get_dataset_facts("gsm8k-train").length_summary.startswith(
        "a log-normal through median 186, p95 335, max 561 tokens (mistral-v1 tokenizer; "
    )
    assert "no token-length statistic" in get_dataset_facts("oasst1").length_summary


@pytest.mark.parametrize(("name", "median"), PAPER_ROWS.items())
def test_paper_rows_lengths_are_unchanged(name: str, median: float) -> None:
    """Exactly the paper-median log-normal of before (gsm8k's measured columns are not used)."""
    facts = get_dataset_facts(name)
    assert facts.median_tokens_paper == median and facts.length_statistic == "paper median"
    for batch in (1, 8, 60):
        got = dataset_lengths(name, batch)
        want = lognormal_lengths(median, batch, log_sigma=DEFAULT_LOG_SIGMA)
        assert (got.padded_len_tokens, got.mean_len_tokens, got.mean_sq_len_tokens2) == (
            want.padded_len_tokens,
            want.mean_len_tokens,
            want.mean_sq_len_tokens2,
        )
    assert dataset_lengths("math_14k", 4).source == (
        "math_14k: log-normal, paper median 174 tokens, sigma 0.35, cut at 1024, padded to the longest in the batch"
    )


def test_log_sigma_from_p95_by_hand() -> None:
    assert log_sigma_from_p95(100, 200) == pytest.approx(math.log(2) / 1.6448536, rel=1e-6)
    assert log_sigma_from_p95(100, 100) == 0.0
    assert median_from_mean_tokens(100, 0.0) == 100
    with pytest.raises(TunecostError):
        log_sigma_from_p95(200, 100)


@pytest.mark.parametrize("name", ["gsm8k-train", "math_data"])
def test_median_p95_max_give_a_distribution_that_matches_them(name: str) -> None:
    facts = get_dataset_facts(name)
    assert facts.median_tokens is not None and facts.p95_tokens is not None and facts.max_tokens is not None
    assert facts.mean_tokens is not None
    lens = dataset_lengths(name, 1)
    sigma = log_sigma_from_p95(facts.median_tokens, facts.p95_tokens)
    assert f"p95 {facts.p95_tokens:g}" in lens.source and f"cut at max {facts.max_tokens:g}" in lens.source
    # one query per batch: the padded length is the mean; the log-normal's mean lands within 3 % of the measured
    # mean (benchmarks/dataset_lengths.py), a check the fit did not use
    assert lens.mean_len_tokens == pytest.approx(facts.median_tokens * math.exp(sigma**2 / 2), rel=0.01)
    assert lens.mean_len_tokens == pytest.approx(facts.mean_tokens, rel=0.03)
    assert dataset_lengths(name, 256).padded_len_tokens <= facts.max_tokens + 8  # never past the data's longest


def test_a_mean_only_dataset_estimates_and_says_it_used_a_mean(catalog_with: Callable[..., Path]) -> None:
    catalog_with("mean-only,1000,,instruction,,train,,,,,150,llama,a test row,a test row,2026-12-02")
    assert get_dataset_facts("mean_only").length_statistic == "mean"
    assert get_dataset_facts("mean_only").length_summary.startswith("a log-normal from a mean of 150 tokens")
    lens = dataset_lengths("mean-only", 4)
    assert "from a mean (no median published) of 150 tokens" in lens.source
    assert f"= {median_from_mean_tokens(150, DEFAULT_LOG_SIGMA):.1f}" in lens.source
    assert lens.mean_len_tokens == pytest.approx(150, rel=0.01)  # the log-normal keeps the published mean

    from tunecost.estimate.calibrated import calibrated_model
    from tunecost.estimate.throughput.targets import throughput_target

    target = throughput_target(model="mixtral-8x7b", gpu="A40-48GB", batch_size=4, dataset="mean-only")
    pred = calibrated_model().predict(target)
    assert pred.queries_per_s > 0
    assert any(n.startswith("lengths: mean-only: log-normal from a mean") for n in pred.notes), pred.notes


def test_a_dataset_without_lengths_is_a_clear_error(cli_error: Callable[[list[str]], str], monkeypatch) -> None:
    from tunecost.estimate import calibrated

    monkeypatch.setattr(calibrated, "max_batch_size_for", lambda req: pytest.fail("searched a batch first"))
    facts = get_dataset_facts("alpaca")
    assert facts.length_statistic == ""
    with pytest.raises(TunecostError, match=r"alpaca has no token-length statistic.*--dataset FILE.*--seq-len"):
        dataset_lengths("alpaca", 4)
    line = cli_error(["estimate", "--model", "mixtral-8x7b", "--gpu", "A40", "--dataset", "alpaca", "--epochs", "1"])
    assert "no token-length statistic" in line and "--seq-len" in line
    assert "`hf download tatsu-lab/alpaca --repo-type dataset` (its local copy is counted)" in line


@pytest.mark.long
def test_seq_len_prices_a_dataset_without_lengths(cli_runner) -> None:
    from tunecost.cli.main import app

    args = ["estimate", "--model", "mixtral-8x7b", "--gpu", "A40", "--dataset", "yahma/alpaca-cleaned"]
    result = cli_runner.invoke(app, [*args, "--epochs", "1", "--seq-len", "256", "--json"])
    assert result.exit_code == 0, result.output
    assert '"num_queries": 51760' in result.stdout and '"dataset": "alpaca-cleaned"' in result.stdout


def test_seq_len_cuts_a_catalog_dataset_instead_of_padding_to_it() -> None:
    """`--dataset D --seq-len L` is a maximum length (HF collators, torchtune, axolotl and LLaMA-Factory pad each
    batch to its longest): the catalog's log-normal cut at L; fixed L only without a length statistic."""
    from tunecost.estimate.estimators import lengths_note, sizing_seq_len
    from tunecost.estimate.throughput.targets import job_lengths
    from tunecost.workload.job import FineTuneJob

    job = FineTuneJob(model="llama-3.1-8b", method="lora", batch_size=8, seq_len=2048, dataset="math_14k")
    sized, lengths = job_lengths(job)
    assert (
        sized.seq_len == 2048 and lengths.source.startswith("math_14k: log-normal") and "cut at 2048" in lengths.source
    )
    assert lengths.mean_len_tokens < 400 < 2048  # median 174: nowhere near every query at 2048
    assert lengths.padded_len_tokens == pytest.approx(
        dataset_lengths("math_14k", 8, cutoff_tokens=2048).padded_len_tokens
    )
    # no published longest: the log-normal's longest of 14,000 queries, 174 x exp(0.35 x z(1 - 1/14000)) = 659
    assert sizing_seq_len(job) == 664 == sizing_seq_len(job.with_(seq_len=8192))  # padded to a multiple of 8
    assert sizing_seq_len(job.with_(seq_len=256)) == 256
    assert sizing_seq_len(job.with_(seq_len=None)) == 512  # the paper's datasets without --seq-len: eq. (1)'s 512
    assert "cut at --seq-len 2048, each batch padded to its longest" in lengths_note(job)
    assert lengths_note(job).endswith(
        "memory sized at the longest batch, 664 tokens (the length model's longest of 14,000)"
    )
    short = job.with_(seq_len=128)
    assert job_lengths(short)[1].padded_len_tokens <= 128 + 8
    fixed = job.with_(dataset="alpaca")  # no length statistic: every query padded to seq_len
    assert job_lengths(fixed)[1].source == "fixed seq_len 2048"
    assert lengths_note(fixed) == (
        "tokens per query: every query padded to --seq-len 2048 (alpaca: no token-length statistic in the catalog)"
    )
    no_data = job.with_(dataset=None)
    assert job_lengths(no_data)[1].source == "fixed seq_len 2048"


def test_seq_len_sizes_memory_at_a_published_longest(catalog_with: Callable[..., Path]) -> None:
    from tunecost.estimate.estimators import sizing_seq_len
    from tunecost.workload.job import FineTuneJob

    catalog_with("capped,1000,,math,,train,,100,150,300,,mistral-v1,x,x,2026-12-05")
    job = FineTuneJob(model="llama-3.1-8b", method="lora", batch_size=1, seq_len=2048, dataset="capped")
    assert sizing_seq_len(job) == 304 == sizing_seq_len(job.with_(seq_len=None))  # the longest (300), padded
    assert sizing_seq_len(job.with_(seq_len=256)) == 256


def test_loader_rejects_inconsistent_rows(catalog_with: Callable[..., Path]) -> None:
    catalog_with("bad,10,,math,,train,,200,100,,,mistral-v1,x,x,2026-12-02")
    with pytest.raises(TunecostError, match=r"row 17: dataset bad: median 200 tokens above p95 100"):
        dataset_catalog()
    catalog_with("nolen-source,10,,math,,train,,100,,,,,,x,2026-12-02")
    with pytest.raises(TunecostError, match="need a tokenizer and a length_source"):
        dataset_catalog()
    catalog_with("other,10,,math,,train,dolly,,,,,,,x,2026-12-02")
    with pytest.raises(TunecostError, match="'dolly' already names dataset dolly-15k"):
        dataset_catalog()


@pytest.mark.long
def test_a_length_note_quoting_a_chat_template_prints(cli_runner) -> None:
    """gsm8k-train's length source quotes Mistral's "[INST] ... [/INST]": printed as text, not read as markup."""
    from tunecost.cli.main import app

    args = ["estimate", "--model", "llama-3.1-8b", "--method", "lora", "--gpu", "H100", "--dataset", "gsm8k-train"]
    result = cli_runner.invoke(app, [*args, "--epochs", "1", "--seq-len", "2048"])
    assert result.exit_code == 0, result.output
    assert "[/INST]" in result.stdout and "cut at --seq-len 2048" in " ".join(result.stdout.split())
