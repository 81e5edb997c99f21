"""Bad inputs found by a new user's audit: each is one `error:` line naming the option or file, exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_huge_csv_field_names_file_and_row(tmp_path: Path, cli_error) -> None:
    path = tmp_path / "m.csv"
    path.write_text("model,dataset,gpu,experts_per_token,batch_size,queries_per_s\n" + "x" * 200_000 + "\n")
    line = cli_error(["fit", str(path)])
    assert "m.csv" in line and "row 1" in line and "field larger than field limit" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["memory", "--model", "mixtral-8x7b", "--batch-size", "100000000000000000000"],
            "--batch-size: must be positive and at most 65536",
        ),
        (["bench", "moe", "--tokens", "100000000000000000000"], "--tokens: must be positive and at most"),
    ],
)
def test_sizes_past_int64_name_the_option(cli_error, args: list[str], expected: str) -> None:
    assert expected in cli_error(args)


@pytest.mark.parametrize(("flag", "value"), [("--epochs", "nan"), ("--epochs", "0"), ("--lora-alpha", "-1")])
def test_a_number_out_of_range_names_the_option(cli_error, flag: str, value: str) -> None:
    epochs = [] if flag == "--epochs" else ["--epochs", "1"]
    line = cli_error(["estimate", "--model", "mixtral-8x7b", "--gpu", "A40", *epochs, flag, value])
    assert line.startswith(f"error: {flag}: must be a positive number at most")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--gpu", "H100", "--gpu=A100"], "error: --gpu given 2 times (H100, A100); it takes one"),
        (["--gpu", "A40", "--seq-len", "512", "--seq-len", "1024"], "error: --seq-len given 2 times (512, 1024)"),
        (["--gpu=", "--gpu", "A100"], "error: --gpu given 2 times (, A100)"),
    ],
)
def test_an_option_of_one_value_given_twice_is_refused(cli_error, args: list[str], expected: str) -> None:
    """Click keeps the last of a repeated option; the user who gave both meant something else."""
    assert cli_error(["estimate", "--model", "qwen2.5-0.5b", *args]).startswith(expected)
    assert cli_error(["data", "stats", "synthetic-arith", "--bins", "5", "--bins", "9"]).startswith(
        "error: --bins given 2 times (5, 9)"
    )  # a group's command too


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--queries", "1e300", "--epochs", "1e300", "--throughput", "1e-300", "--usd-per-hour", "1"], "at most"),
        (
            ["--queries", "1", "--epochs", "1", "--throughput", "1", "--usd-per-hour", "1", "--provider", "nosuchprov"],
            "unknown provider 'nosuchprov'",
        ),
    ],
)
def test_cost_refuses_absurd_inputs(cli_error, args: list[str], expected: str) -> None:
    assert expected in cli_error(["cost", *args])


def test_cost_reads_a_garbage_prices_file_beside_usd_per_hour(tmp_path: Path, cli_error) -> None:
    prices = tmp_path / "p.csv"
    prices.write_text("garbage\n1,2\n", encoding="utf-8")
    line = cli_error(
        ["cost", "--queries", "1", "--epochs", "1", "--throughput", "1", "--usd-per-hour", "1", "--prices", str(prices)]
    )
    assert "p.csv" in line


@pytest.mark.parametrize(("cell", "shown"), [("1e300", "1e+300"), ("5e-324", "4.94066e-324")])
def test_fit_refuses_absurd_measurements(tmp_path: Path, cli_error, paper_a40_csv: Path, cell: str, shown: str) -> None:
    lines = paper_a40_csv.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + "," + cell
    path = tmp_path / "m.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert f"row 1: queries_per_s must be between 1e-06 and 1e+06, got {shown}" in cli_error(["fit", str(path)])


def test_data_stats_deep_nesting_and_infinite_label(tmp_path: Path, cli_error) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert "nested too deeply" in cli_error(["data", "stats", str(deep)])
    row = json.loads((FIXTURES / "data" / "hellaswag.jsonl").read_text(encoding="utf-8").splitlines()[0])
    bad = tmp_path / "inf.jsonl"
    bad.write_text(json.dumps(row).replace(json.dumps(row["label"]) + ', "split"', '1e999, "split"') + "\n")
    assert "'label' should be an ending index, got inf" in cli_error(["data", "stats", str(bad)])


def test_report_on_odd_records(tmp_path: Path, cli_error, cli_runner) -> None:
    from tunecost.cli.main import app

    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "throughput.jsonl").write_text("garbage\n", encoding="utf-8")
    result = cli_runner.invoke(app, ["report", str(garbage)])
    assert result.exit_code == 2 and "no readable run records" in result.stderr
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "throughput.jsonl").write_text('{"schema_version": [1], "model": "m"}\n', encoding="utf-8")
    (listed / "deep.jsonl").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n", encoding="utf-8")
    (listed / "meta.json").write_text('{"versions": [1, 2]}', encoding="utf-8")
    result = cli_runner.invoke(app, ["report", str(listed)])
    assert result.exit_code == 0, result.output
    assert "format version [&#x27;[1]&#x27;]" in (listed / "report.html").read_text(encoding="utf-8")


def test_trainability_names_the_unknown_dataset_and_option(tmp_path: Path, cli_error) -> None:
    line = cli_error(["trainability", "--out", str(tmp_path / "t"), "--dataset", "nosuchds"])
    assert "unknown dataset for --dataset 'nosuchds'" in line
    assert "--num-eval: must be positive and at most 1000000000000, got -1" in cli_error(
        ["trainability", "--out", str(tmp_path / "t"), "--num-eval", "-1"]
    )


def test_the_optional_kernel_warning_of_bitsandbytes_is_dropped() -> None:
    import logging

    import tunecost.cli.main  # noqa: F401  (installs the filter)

    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    noise = logger.makeRecord(
        logger.name,
        logging.WARNING,
        "ops.py",
        1,
        "Failed to load CPU gemm_4bit_forward from kernels-community: %s",
        ("x",),
        None,
    )
    other = logger.makeRecord(logger.name, logging.WARNING, "ops.py", 1, "something else", (), None)
    assert not logger.filter(noise) and logger.filter(other)


@pytest.mark.long
def test_piped_tables_keep_every_name_whole(cli_runner) -> None:
    from tunecost.cli.main import app

    result = cli_runner.invoke(app, ["models"])
    assert result.exit_code == 0 and "blackmamba-2.8b" in result.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["memory"],
        ["estimate", "--gpu", "A100-80GB", "--queries", "1000", "--epochs", "1"],
        ["profile", "--batch-sizes", "1", "--out", "{tmp}/run"],
    ],
)
def test_seq_len_beyond_learned_positions_names_the_option(cli_error, command: list[str], tmp_path: Path) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    line = cli_error([*args, "--model", "santacoder", "--method", "full", "--seq-len", "4096"])
    assert "--seq-len 2048 or less" in line and "learned position embeddings" in line
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_max_batch_limit_out_of_range_is_named_before_any_probe(cli_error) -> None:
    line = cli_error(
        ["max-batch", "--model", "tiny-mixtral", "--device", "cpu", "--gpu-memory-gb", "24", "--limit", "0"]
    )
    assert line.startswith("error: --limit: must be positive and at most")
