"""Run length in optimizer steps: each reader's steps key, x its global batch, gives the run's queries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tunecost.errors import TunecostError
from tunecost.workload.frameworks.registry import read_config
from tunecost.workload.run_length import (
    global_batch_of,
    interleaved_queries,
    queries_for_steps,
    run_length,
    sliced_queries,
    training_queries,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "configs"
LLAMAFACTORY = {"model_name_or_path": "m", "stage": "sft", "finetuning_type": "lora", "output_dir": "o"}
AXOLOTL = {"base_model": "m", "datasets": [], "micro_batch_size": 2}


def _queries(path: Path, dataset_queries: int | None = None):
    o = read_config(path).options
    return run_length(
        dataset_queries=dataset_queries,
        epochs=o.get("epochs"),
        max_steps=o.get("max_steps"),
        max_steps_per_epoch=o.get("max_steps_per_epoch"),
        global_batch=global_batch_of(o),
    )


def _write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return path


def test_queries_for_steps() -> None:
    assert queries_for_steps(896, 8) == 7168
    with pytest.raises(TunecostError):
        queries_for_steps(0, 8)


def test_hf_max_steps_replaces_epochs(tmp_path: Path) -> None:
    args = {"output_dir": "o", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
    length = _queries(_write(tmp_path, "args.json", args | {"max_steps": 100, "num_train_epochs": 3}), 10**6)
    assert (length.num_queries, length.epochs) == (800, 1.0)
    assert "epochs" not in read_config(tmp_path / "args.json").options
    default = _queries(
        _write(tmp_path, "d.json", {"output_dir": "o", "per_device_train_batch_size": 4, "max_steps": 10})
    )
    assert default.num_queries == 40  # accumulation 1, one rank
    assert _queries(_write(tmp_path, "e.json", args | {"max_steps": -1})).epochs == 3.0  # -1: epochs


def test_llamafactory_and_axolotl_max_steps(tmp_path: Path) -> None:
    lf = {"model_name_or_path": "m", "stage": "sft", "finetuning_type": "lora", "per_device_train_batch_size": 2}
    lf |= {"gradient_accumulation_steps": 8, "max_steps": 50, "num_train_epochs": 3.0, "output_dir": "o"}
    assert _queries(_write(tmp_path, "lf.yaml", lf)).num_queries == 50 * 2 * 8
    ax = {"base_model": "m", "datasets": [], "micro_batch_size": 2, "max_steps": 30, "num_epochs": 4}
    assert _queries(_write(tmp_path, "ax.yaml", ax)).num_queries == 30 * 2  # axolotl's accumulation default 1


def test_nemo_mlperf_steps_before_epochs() -> None:
    length = _queries(FIXTURES / "mlperf_llama2_70b_lora_nemo.yaml", dataset_queries=3901)
    assert (length.num_queries, length.epochs) == (896 * 8, 1.0)
    assert length.note is not None and "896 x global batch 8 = 7168 queries" in length.note
    unknown = _queries(FIXTURES / "mlperf_llama2_70b_lora_nemo.yaml")
    assert unknown.num_queries == 7168  # dataset size unknown: the steps


def test_nemo_epochs_end_first(tmp_path: Path) -> None:
    data = yaml.safe_load((FIXTURES / "mlperf_llama2_70b_lora_nemo.yaml").read_text())
    data["trainer"]["max_epochs"] = 2
    length = _queries(_write(tmp_path, "nemo.yaml", data), dataset_queries=100)
    assert (length.num_queries, length.epochs) == (100, 2)  # 200 queries < 7168


def test_torchtune_max_steps_per_epoch_caps_each_epoch(tmp_path: Path) -> None:
    data = yaml.safe_load(
        (Path(__file__).parents[2] / "cli/configs/torchtune/lora_single_device/lora_single_device.yaml").read_text()
    )
    data |= {"max_steps_per_epoch": 10, "epochs": 3}
    length = _queries(_write(tmp_path, "tt.yaml", data), dataset_queries=52002)
    batch, accumulation = data["batch_size"], data.get("gradient_accumulation_steps", 1)
    assert (length.num_queries, length.epochs) == (10 * batch * accumulation, 3)
    assert _queries(_write(tmp_path, "tt.yaml", data), dataset_queries=5).num_queries == 5


def test_torchtitan_training_steps(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\nsteps = 40\n')
    assert _queries(path).num_queries == 80
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\n')
    assert _queries(path).num_queries == 10000 * 2  # torchtitan's default steps


def test_megatron_train_iters(tmp_path: Path) -> None:
    data = {"tensor_model_parallel_size": 1, "micro_batch_size": 2, "global_batch_size": 32, "seq_length": 2048}
    assert _queries(_write(tmp_path, "m.yaml", data | {"train_iters": 5})).num_queries == 160


def test_steps_without_batch_is_one_error() -> None:
    with pytest.raises(TunecostError, match="global batch"):
        run_length(dataset_queries=None, epochs=None, max_steps=10, global_batch=None)


def test_litgpt_max_steps_or_epochs_whichever_first(tmp_path: Path) -> None:
    cfg = {"checkpoint_dir": "checkpoints/Qwen/Qwen2.5-0.5B", "devices": 2, "train": {"micro_batch_size": 2}}
    steps = {**cfg, "train": {"micro_batch_size": 2, "max_steps": 100, "epochs": 1}}
    first = _queries(_write(tmp_path, "a.yaml", steps), dataset_queries=10**6)
    assert (first.num_queries, first.epochs) == (100 * 16, 1.0)  # litgpt's default global batch 16, all ranks
    assert any("global batch 16" in a for a in read_config(tmp_path / "a.yaml").assumptions)
    ended = _queries(_write(tmp_path, "b.yaml", steps), dataset_queries=500)
    assert (ended.num_queries, ended.epochs) == (500, 1)  # the one epoch ends before 100 x 16 queries
    stated = {**cfg, "train": {"max_steps": 10, "global_batch_size": 64}}
    assert _queries(_write(tmp_path, "c.yaml", stated)).num_queries == 640
    plain = read_config(_write(tmp_path, "d.yaml", {**cfg, "train": {"global_batch_size": 64}}))
    assert "max_steps" not in plain.options and plain.options["grad_accum"] == 32  # 64 / (micro 1 x 2 ranks)


@pytest.mark.parametrize(
    ("options", "accumulation"),
    [
        ({"queries_per_step": 32, "batch_size": 4, "num_gpus": 4}, 2),  # 32 / (4 x 4 ranks)
        ({"queries_per_step": 32, "batch_size": 4, "num_gpus": 8, "tp": 2}, 2),  # 4 data-parallel ranks
        ({"queries_per_step": 16, "batch_size": 4, "num_gpus": 4}, None),  # one micro-batch a step
        ({"queries_per_step": 30, "batch_size": 4, "num_gpus": 4}, None),  # not a whole count: left unset
        ({"queries_per_step": 64, "batch_size": 4, "num_gpus": 4, "pp": 2}, None),  # the pipeline's micro-batches
        ({"queries_per_step": 64, "batch_size": 4}, None),  # GPUs unstated
    ],
)
def test_a_stated_global_batch_gives_the_accumulation(options: dict, accumulation: int | None) -> None:
    from tunecost.workload.frameworks import accumulation_of

    lines = accumulation_of(options, "global_batch_size")
    assert options.get("grad_accum") == accumulation and bool(lines) == (accumulation is not None)


def test_torchtitan_global_batch_is_its_gradient_accumulation(tmp_path: Path) -> None:
    """train.py: gradient_accumulation_steps = global_batch_size / (local_batch_size x data-parallel degree)."""
    path = tmp_path / "titan.toml"
    path.write_text(
        '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\nglobal_batch_size = 32\n'
        "[parallelism]\ndata_parallel_shard_degree = 8\n"
    )
    job = read_config(path)
    assert job.options["grad_accum"] == 2 and _queries(path).num_queries == 10000 * 32


def test_torchtitan_refuses_a_global_batch_its_ranks_do_not_divide(tmp_path: Path) -> None:
    """train.py asserts global_batch_size % (local_batch_size x data-parallel degree) == 0: on the GPUs the file
    states, and (`registry.check_global_batch`) on a count given beside it."""
    from tunecost.workload.frameworks.registry import check_global_batch

    path = tmp_path / "titan.toml"
    head = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\nglobal_batch_size = 24\n'
    path.write_text(head + "[parallelism]\ndata_parallel_shard_degree = 8\n")
    with pytest.raises(TunecostError, match="training.global_batch_size 24: not a multiple of micro-batch 2 x 8"):
        read_config(path)
    path.write_text(head)  # the launcher's GPUs
    options = read_config(path).options
    check_global_batch("torchtitan", options, 6)  # 24 = 2 x 6 x 2
    with pytest.raises(TunecostError, match="x 8 data-parallel ranks on 8 GPUs, where torchtitan stops"):
        check_global_batch("torchtitan", options, 8)
    check_global_batch("litgpt", options, 8)  # litgpt floors the division: no check


def test_an_evaluation_split_leaves_the_rest_to_train() -> None:
    """A fraction is rounded up as `datasets`' train_test_split rounds its test size; a count is taken as is."""
    assert training_queries(52002, 0.1) == 52002 - 5201
    assert training_queries(1000, 0.05) == 950 and training_queries(1000, 200) == 800
    with pytest.raises(TunecostError, match="evaluation split 100 leaves none of the 100 queries to train"):
        training_queries(100, 100)


@pytest.mark.parametrize(("name", "key"), [("train.yaml", "val_size"), ("axolotl.yaml", "val_set_size")])
def test_llamafactory_and_axolotl_evaluation_splits(tmp_path: Path, name: str, key: str) -> None:
    base = LLAMAFACTORY if key == "val_size" else AXOLOTL
    assert read_config(_write(tmp_path, name, {**base, key: 0.05})).options["eval_split"] == 0.05
    assert read_config(_write(tmp_path, name, {**base, key: 500})).options["eval_split"] == 500
    assert "eval_split" not in read_config(_write(tmp_path, name, {**base, key: 0})).options
    with pytest.raises(TunecostError, match=f"{key}: must be a fraction in \\[0, 1\\) or a whole count, got 2.5"):
        read_config(_write(tmp_path, name, {**base, key: 2.5}))


def test_a_split_slice_takes_its_share_of_the_counted_split() -> None:
    """datasets' ReadInstruction: percentages rounded to the closest row, absolute and negative bounds, sums of
    slices; another split's share is unknown (None)."""
    assert sliced_queries("train[:95%]", 51760) == 49172 and sliced_queries("train", 100) == 100
    assert sliced_queries("train[10:20]", 100) == 10 and sliced_queries("train[-5%:]", 1000) == 50
    assert sliced_queries("train[:10%]+train[-80%:]", 1001) == 100 + 801
    assert sliced_queries("test[:10%]", 1000) is None and sliced_queries("train[20:10]", 100) == 0
    with pytest.raises(ValueError, match="Unrecognized instruction format"):
        sliced_queries("train[:x]", 100)


@pytest.mark.parametrize(
    ("rows", "probs"),
    [((3, 4, 5), None), ((7473, 15000), (0.5, 0.5)), ((5000, 5000), (0.3, 0.7)), ((900, 4000, 2500), (0.2, 0.5, 0.3))],
)
@pytest.mark.parametrize("over", [False, True])
def test_interleaved_queries_are_what_datasets_interleaves(rows: tuple, probs: tuple | None, over: bool) -> None:
    """datasets.interleave_datasets itself (seed 42, LLaMA-Factory's default): exact taken in turn; drawn, within
    three standard deviations of the draws that exhaust the source that stops it (negative binomial)."""
    import math

    import numpy as np
    from datasets import Dataset, interleave_datasets

    parts = [Dataset.from_dict({"i": np.zeros(n, dtype=np.uint8)}) for n in rows]
    until = "all_exhausted" if over else "first_exhausted"
    drawn = len(interleave_datasets(parts, probabilities=probs and list(probs), seed=42, stopping_strategy=until))
    counted = interleaved_queries(rows, probs, over=over)
    if probs is None:
        assert counted == drawn
        return
    n, p = (max if over else min)(zip(rows, probs, strict=True), key=lambda r: r[0] / r[1])
    assert abs(counted - drawn) <= 3 * math.sqrt(n * (1 - p)) / p
