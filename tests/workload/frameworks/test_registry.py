"""Several files, one job: each file read by its framework, stated values over other files' defaults."""

from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigJob
from tunecost.workload.frameworks.registry import merge_configs


def _job(path: str, options: dict, assumptions: tuple[str, ...] = ()) -> ConfigJob:
    return ConfigJob(framework=path.split(".")[0], path=path, options=options, assumptions=assumptions)


def test_a_stated_value_wins_over_another_files_default() -> None:
    args = _job("args.json", {"dtype": "fp32", "batch_size": 2}, ("dtype fp32: the Trainer's default",))
    accelerate = _job("accelerate.yaml", {"dtype": "bf16", "num_gpus": 2})
    merged = merge_configs([args, accelerate])
    assert merged.options == {"dtype": "bf16", "batch_size": 2, "num_gpus": 2}
    assert "dtype fp32: the Trainer's default" not in merged.assumptions  # overridden, so not assumed


def test_lora_beside_4bit_is_qlora_and_two_stated_values_clash() -> None:
    assert merge_configs([_job("a.json", {"method": "lora"}), _job("b.json", {"method": "qlora"})]).options == {
        "method": "qlora"
    }
    with pytest.raises(TunecostError, match=r"b.json: lora_rank is 16 but a.json says 8"):
        merge_configs([_job("a.json", {"lora_rank": 8}), _job("b.json", {"lora_rank": 16})])
