"""No command replaces a file the user gave or already had: outputs onto inputs are refused always, existing
outputs without --force; usage errors are one `error:` line with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.outputs import check_output_path

TARGETS = "model,dataset,gpu,experts_per_token,batch_size\nmixtral-8x7b,math_14k,A40,2,4\n"
DATA = Path(__file__).parents[1] / "fixtures" / "data" / "gsm8k_original.jsonl"


def test_guard_refuses_inputs_even_with_force(tmp_path: Path) -> None:
    given = tmp_path / "m.csv"
    given.write_text("x\n", encoding="utf-8")
    with pytest.raises(TunecostError, match="one of this command's inputs"):
        check_output_path(given, force=True, inputs=[given])
    with pytest.raises(TunecostError, match="already exists; pass --force"):
        check_output_path(given, force=False)
    assert check_output_path(given, force=True) == given
    with pytest.raises(TunecostError, match="is a file, not a folder"):
        check_output_path(given / "out.csv", force=True)
    with pytest.raises(TunecostError, match="is a folder"):
        check_output_path(tmp_path, force=True)


def test_predict_never_writes_onto_its_inputs(tmp_path: Path, write_file, paper_a40_csv, cli_error) -> None:
    targets = write_file("t.csv", TARGETS)
    calib = tmp_path / "m.csv"
    calib.write_bytes(paper_a40_csv.read_bytes())
    before = (targets.read_bytes(), calib.read_bytes())
    for out in (targets, calib):
        line = cli_error(
            ["predict", "--input", str(targets), "--calibrate", str(calib), "--output", str(out), "--force"]
        )
        assert "--output" in line and "inputs" in line
    assert (targets.read_bytes(), calib.read_bytes()) == before


def test_predict_keeps_an_existing_output_without_force(tmp_path: Path, write_file, cli_runner, cli_error) -> None:
    targets = write_file("t.csv", TARGETS)
    out = write_file("pred.csv", "mine\n")
    assert "pass --force" in cli_error(["predict", "--input", str(targets), "--output", str(out)])
    assert out.read_text(encoding="utf-8") == "mine\n"
    result = cli_runner.invoke(app, ["predict", "--input", str(targets), "--output", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").startswith("model,")


def test_data_stats_never_replaces_the_dataset(tmp_path: Path, cli_error) -> None:
    ds = tmp_path / "ds.jsonl"
    ds.write_bytes(DATA.read_bytes())
    assert "inputs" in cli_error(["data", "stats", str(ds), "--out", str(ds), "--force"])
    assert ds.read_bytes() == DATA.read_bytes()
    taken = tmp_path / "stats.jsonl"
    taken.write_text("mine\n", encoding="utf-8")
    assert "pass --force" in cli_error(["data", "stats", str(ds), "--out", str(taken)])
    assert taken.read_text(encoding="utf-8") == "mine\n"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["estimate", "--no-such-option"], "No such option"),
        (["memory", "--batch-size", "abc"], "--batch-size"),
        (["no-such-command"], "No such command"),
        (["models", "extra"], "unexpected extra argument"),
    ],
)
def test_usage_errors_are_one_line(cli_error, args: list[str], expected: str) -> None:
    assert expected in cli_error(args)
