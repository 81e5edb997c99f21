"""`--config` with a key the framework does not know: one `error:` line naming the file, the key and the closest
key, exit 2, before any estimate runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TYPO = """\
model_name_or_path: Qwen/Qwen2.5-0.5B
stage: sft
do_train: true
finetuning_type: lora
lora_rnak: 16
cutoff_len: 512
"""


@pytest.mark.parametrize("command", ["memory", "estimate", "max-batch"])
def test_a_typo_in_the_config_is_one_error_line(cli_error, tmp_path: Path, command: str) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO, encoding="utf-8")
    line = cli_error([command, "--config", str(path)])
    assert f"{path}: lora_rnak: not a key of LLaMA-Factory's config (did you mean lora_rank?)" in line


def test_a_typo_in_one_of_several_configs_names_that_file_and_the_nested_key(cli_error, tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"output_dir": "o", "per_device_train_batch_size": 2, "bf16": True}), encoding="utf-8")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_com": True}}), encoding="utf-8")
    line = cli_error(["memory", "--config", str(args), "--config", str(ds), "--model", "Qwen/Qwen2.5-0.5B"])
    assert f"{ds}: zero_optimization.overlap_com: not a key of DeepSpeed's config" in line
    assert "did you mean zero_optimization.overlap_comm?" in line


@pytest.mark.parametrize(
    ("key", "option", "flag"),
    [("cutoff_len: -5", "seq_len -5", "--seq-len"), ("lora_rank: 0", "lora_rank 0", "--lora-rank")],
)
def test_a_bad_value_the_config_gave_names_the_config(cli_error, tmp_path: Path, key, option, flag) -> None:
    """A value out of range is blamed on the flag that would set it; where the config set it, the line also names
    the file and the value, and a flag given on the command line is blamed alone."""
    path = tmp_path / "lf.yaml"
    path.write_text(TYPO.replace("lora_rnak: 16\n", "").replace("cutoff_len: 512\n", "") + key + "\n")
    line = cli_error(["estimate", "--config", str(path), "--gpu", "H100", "--queries", "100"])
    assert flag in line and f"({option} from --config {path})" in line
    given = cli_error(["estimate", "--config", str(path), "--gpu", "H100", "--queries", "100", flag, "-5"])
    assert flag in given and "from --config" not in given


def test_no_fused_adamw_runs_the_multi_tensor_adamw_under_torchtune() -> None:
    """torchtune's stack runs a fused AdamW unless told otherwise: --no-fused-adamw (or a recipe's
    optimizer.fused: False) is the multi-tensor one."""
    from tunecost.cli.common import stack_behaviour
    from tunecost.simulate.behaviour import ADAMW_FOREACH, ADAMW_FUSED, runs_fused_adamw

    assert runs_fused_adamw("torchtune", stack_behaviour("torchtune"))
    assert stack_behaviour("torchtune", fused_adamw=False).adamw_impl == ADAMW_FOREACH
    assert not runs_fused_adamw("torchtune", stack_behaviour("torchtune", fused_adamw=False))
    assert stack_behaviour("hf-peft", fused_adamw=True).adamw_impl == ADAMW_FUSED


@pytest.mark.long
def test_a_data_file_the_config_names_but_this_machine_lacks_is_said_not_fatal(cli_runner, tmp_path: Path) -> None:
    """A config written for the training cluster names its data there: estimating on a laptop, the file is not
    read (said), and the run's size and lengths come from --queries and --seq-len."""
    from tunecost.cli.main import app

    config = tmp_path / "ax.yml"
    config.write_text(
        "base_model: Qwen/Qwen2.5-0.5B\nadapter: lora\nlora_r: 8\nsequence_len: 512\nmicro_batch_size: 2\n"
        "datasets:\n  - path: /cluster/data/train.jsonl\n    type: alpaca\n",
        encoding="utf-8",
    )
    result = cli_runner.invoke(app, ["estimate", "--config", str(config), "--gpu", "H100", "--queries", "1000"])
    assert result.exit_code == 0, result.output
    assert "/cluster/data/train.jsonl" in result.stderr and "is not on this machine" in " ".join(result.stderr.split())


def test_a_folder_given_as_config_says_so(cli_error, tmp_path: Path) -> None:
    line = cli_error(["estimate", "--config", str(tmp_path), "--gpu", "H100"])
    assert f"{tmp_path}: a folder, not a config file" in line


def test_an_error_blames_the_option_it_names_not_a_word_of_its_prose(cli_runner, tmp_path: Path) -> None:
    """ "a run in optimizer steps" is about max_steps, not the optimizer the config also sets."""
    from tunecost.cli.main import app

    path = tmp_path / "args.json"
    args = {"per_device_train_batch_size": 2, "num_train_epochs": 1, "max_steps": 10, "optim": "adamw_torch"}
    path.write_text(json.dumps(args), encoding="utf-8")
    model = str(Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-llama-2l.json")
    args = [
        "estimate",
        "--config",
        str(path),
        "--model",
        model,
        "--method",
        "full",
        "--gpu",
        "H100",
        "--strategy",
        "ddp",
    ]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and "(optimizer" not in line
    assert f"(max_steps 10 from --config {path})" in " ".join(result.stderr.split())
