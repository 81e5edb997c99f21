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
