"""`--config` on `predict` and `profile`: a framework's config is the same job as its flags (or TARGETS.csv row)."""

from __future__ import annotations

import json

from tunecost.cli.main import app

LLAMAFACTORY = """
model_name_or_path: {model}
stage: sft
do_train: true
finetuning_type: {method}
cutoff_len: 64
per_device_train_batch_size: 2
disable_gradient_checkpointing: true
"""


def _predictions(cli_runner, args: list[str]) -> list[dict]:
    result = cli_runner.invoke(app, ["predict", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["predictions"]


def test_predict_answers_a_config_as_its_targets_row(cli_runner, write_file) -> None:
    config = write_file("train.yaml", LLAMAFACTORY.format(model="mixtral-8x7b", method="lora"))
    from_config = _predictions(cli_runner, ["--config", str(config), "--gpu", "A40"])
    from_flags = _predictions(
        cli_runner,
        ["--model", "mixtral-8x7b", "--method", "lora", "--gpu", "A40", "--batch-size", "2", "--seq-len", "64"],
    )
    row = write_file(
        "t.csv", "model,dataset,gpu,experts_per_token,batch_size,seq_len,method\nmixtral-8x7b,,A40,,2,64,lora\n"
    )
    assert from_config == from_flags == _predictions(cli_runner, ["--input", str(row)])
    assert from_config[0]["batch_size"] == 2 and from_config[0]["method"] == "lora"


def test_predict_needs_one_kind_of_target(cli_error, write_file) -> None:
    row = write_file("t.csv", "model,dataset,gpu,experts_per_token,batch_size\nmixtral-8x7b,math_14k,A40,2,4\n")
    assert "--gpu" in cli_error(["predict", "--model", "mixtral-8x7b"])
    assert "not both" in cli_error(["predict", "--input", str(row), "--model", "mixtral-8x7b", "--gpu", "A40"])


def test_profile_measures_the_job_of_a_config(cli_runner, write_file, tmp_path) -> None:
    config = write_file("train.yaml", LLAMAFACTORY.format(model="tiny-mixtral", method="lora"))
    args = ["--out", str(tmp_path / "run"), "--steps", "1", "--warmup-steps", "0", "--no-kernels"]
    args += ["--no-instrumentation-overhead", "--random-weights", "--device", "cpu", "--json"]
    result = cli_runner.invoke(app, ["profile", "--config", str(config), *args])
    assert result.exit_code == 0, result.output
    (point,) = json.loads(result.stdout)["points"]
    assert (point["model"], point["method"], point["batch_size"], point["seq_len"]) == ("tiny-mixtral", "lora", 2, 64)
