"""torchtune's shipped configs by name: each reads as its recipe runs it, a name reads as the same YAML in a file
does, and a name that is neither a file nor a shipped config is one error with the closest names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tunecost.catalog.torchtune_configs import RECIPES, load_torchtune_configs, torchtune_configs
from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.workload.frameworks.registry import read_config


def test_every_shipped_config_reads_as_its_recipe_runs_it() -> None:
    configs = torchtune_configs()
    assert {c.recipe for c in configs.values()} == set(RECIPES)
    for config in configs.values():
        job = read_config(config.name)
        assert (job.options["method"] == "full") == config.recipe.startswith("full_"), config.name
        # first word "torchtune", not the name of an option (a line about --config would go when --config is given)
        assert job.assumptions[0].startswith(
            f"torchtune config {config.name}: as it ships for `tune run {config.recipe}`"
        )
        assert config.source.endswith(f"recipes/configs/{config.name}.yaml") and "@" in config.source
        gpus = [a for a in job.assumptions if a.startswith(("GPUs: ", "num_gpus "))]
        if config.recipe.endswith("_single_device"):  # the recipe says one GPU; --gpus replaces the line
            assert gpus == [
                f"num_gpus 1: `tune run {config.recipe}` trains on one (--gpus prices its distributed recipe)"
            ]
        else:  # a distributed recipe: FSDP2 over every rank (data_parallel_shard_dim -1) where the file says no more
            assert job.options.get("strategy") is not None and all("give --gpus" in a for a in gpus), config.name


def test_a_name_reads_as_the_same_yaml_in_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = torchtune_configs()["llama3_2/3B_lora_single_device"]
    path = tmp_path / "3B_lora_single_device.yaml"
    path.write_text(yaml.safe_dump(shipped.config))
    by_name, by_file = read_config(shipped.name), read_config(path)
    assert by_name.options == by_file.options and by_name.options["lora_rank"] == 64
    one_gpu = "num_gpus 1: `tune run lora_finetune_single_device` trains on one (--gpus prices its distributed recipe)"
    assert by_name.assumptions[1:] == tuple(one_gpu if a.startswith("GPUs: ") else a for a in by_file.assumptions)
    assert one_gpu not in by_file.assumptions
    monkeypatch.chdir(tmp_path)  # a file of that name, where one exists, is read instead
    (tmp_path / "llama3_2").mkdir()
    (tmp_path / "llama3_2" / "3B_lora_single_device").write_text(yaml.safe_dump({**shipped.config, "dtype": "fp32"}))
    assert read_config(shipped.name).options["dtype"] == "fp32"


def test_an_unknown_name_is_one_error_with_the_closest() -> None:
    result = CliRunner().invoke(app, ["memory", "--config", "llama3_1/8B_lora_singledevice", "--seq-len", "512"])
    assert result.exit_code == 2
    assert "no such file, nor a config torchtune ships (close: llama3_1/8B_lora_single_device" in result.output
    assert "Traceback" not in result.output


def test_a_broken_catalog_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "torchtune_configs.json"
    path.write_text(json.dumps({"configs": [{"name": "x/1B_lora", "recipe": "ppo", "config": {}, "source": "s"}]}))
    with pytest.raises(TunecostError, match=r"torchtune_configs.json: config 'x/1B_lora': recipe 'ppo'"):
        load_torchtune_configs(path)
    path.write_text("{")
    with pytest.raises(TunecostError, match="torchtune_configs.json: not a torchtune config catalog"):
        load_torchtune_configs(path)
