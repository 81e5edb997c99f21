"""Tensor, pipeline and context degrees read from torchtitan TOML and torchtune YAML, with each framework's
defaults and one error line naming the config key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigJob
from tunecost.workload.frameworks.registry import read_config
from tunecost.workload.parallel import ParallelPlan

# torchtitan/models/llama3/train_configs/llama3_70b.toml's shape, with every model-parallel degree
TITAN_70B = """\
[job]
dump_folder = "./outputs"

[model]
name = "llama3"
flavor = "70B"

[training]
local_batch_size = 8
seq_len = 8192
dtype = "bfloat16"

[parallelism]
data_parallel_shard_degree = 2
tensor_parallel_degree = 8
pipeline_parallel_degree = 4
context_parallel_degree = 2
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_microbatch_size = 2

[activation_checkpoint]
mode = "full"
"""

# recipes/configs/llama3_3/70B_full_multinode.yaml's parallel keys
TUNE_70B = """\
model:
  _component_: torchtune.models.llama3_3.llama3_3_70b
tensor_parallel_dim: 8
tensor_parallel_plan:
  _component_: torchtune.models.llama3.base_llama_tp_plan
data_parallel_shard_dim: 2
data_parallel_replicate_dim: 1
batch_size: 4
dtype: bf16
optimizer:
  _component_: torch.optim.AdamW
enable_activation_checkpointing: True
"""


def _read(tmp_path: Path, text: str, suffix: str) -> ConfigJob:
    path = tmp_path / f"config{suffix}"
    path.write_text(text)
    return read_config(path)


def _plan(job: ConfigJob) -> ParallelPlan:
    names: tuple[str, ...] = ("num_gpus", "strategy", "tp", "pp", "cp", "sequence_parallel", "micro_batches")
    names += ("pipeline_schedule", "virtual_stages")
    return ParallelPlan(**{k: job.options[k] for k in names if k in job.options})


def _error(tmp_path: Path, text: str, suffix: str) -> str:
    with pytest.raises(TunecostError) as err:
        _read(tmp_path, text, suffix)
    message = str(err.value)
    assert message.startswith(str(tmp_path / f"config{suffix}")) and "\n" not in message
    return message


def test_torchtitan_every_degree(tmp_path: Path) -> None:
    job = _read(tmp_path, TITAN_70B, ".toml")
    plan = _plan(job)
    assert (plan.tp, plan.pp, plan.cp, plan.dp, plan.num_gpus) == (8, 4, 2, 2, 2 * 8 * 4 * 2)
    assert plan.sequence_parallel and plan.pipeline_schedule == "interleaved-1f1b"
    # torchtitan: micro-batches = local_batch_size / microbatch size; interleaved: 2 stages per rank by default
    assert (job.options["batch_size"], plan.num_micro_batches, plan.virtual_stages) == (2, 4, 2)
    assert job.options["strategy"] == "fsdp2-shard-grad-op"  # "default" under PP: not resharded after forward


def test_torchtitan_defaults(tmp_path: Path) -> None:
    text = TITAN_70B.replace('pipeline_parallel_schedule = "Interleaved1F1B"\n', "")
    job = _read_toml(tmp_path, text.replace("pipeline_parallel_microbatch_size = 2\n", ""))
    assert (job.options["pipeline_schedule"], job.options.get("virtual_stages")) == ("1f1b", None)  # the plan's 1
    assert (job.options["batch_size"], job.options["micro_batches"]) == (1, 8)  # microbatch size 1
    for start in ("pipeline_schedule 1f1b: torchtitan's default", "parallelism.pipeline_parallel_microbatch_size 1"):
        assert any(a.startswith(start) for a in job.assumptions), start
    assert any(a.startswith("parallelism.disable_loss_parallel false") for a in job.assumptions)


def _read_toml(tmp_path: Path, text: str) -> ConfigJob:
    return _read(tmp_path, text, ".toml")


def test_torchtitan_layers_per_stage_and_gpipe(tmp_path: Path) -> None:
    # Llama 3.1 70B: 80 layers; (80 + 1 + 1) / 11 -> 8 stages over 4 ranks: 2 each
    text = TITAN_70B.replace("microbatch_size = 2", "microbatch_size = 2\npipeline_parallel_layers_per_stage = 11")
    job = _read_toml(tmp_path, text.replace("context_parallel_degree = 2", "context_parallel_degree = 1"))
    assert job.options["virtual_stages"] == 2 and "cp" not in job.options
    parts = "microbatch_size = 2\nmodule_fqns_per_model_part = " + str([[f"layers.{i}"] for i in range(16)])
    assert _read_toml(tmp_path, TITAN_70B.replace("microbatch_size = 2", parts)).options["virtual_stages"] == 4
    job = _read_toml(tmp_path, TITAN_70B.replace('"Interleaved1F1B"', '"gpipe"'))
    assert (job.options["pipeline_schedule"], job.options.get("virtual_stages")) == ("gpipe", None)


def test_torchtitan_shard_left_over(tmp_path: Path) -> None:
    job = _read_toml(tmp_path, TITAN_70B.replace("data_parallel_shard_degree = 2", "data_parallel_shard_degree = -1"))
    assert "num_gpus" not in job.options and job.options["strategy"] == "fsdp2-shard-grad-op"
    assert any("left after the model-parallel degrees" in a for a in job.assumptions)
    job = _read_toml(tmp_path, TITAN_70B.replace("data_parallel_shard_degree = 2", "data_parallel_shard_degree = 1"))
    assert (job.options["strategy"], job.options["num_gpus"]) == ("single", 64)  # a data-parallel group of one
    hsdp = TITAN_70B.replace("shard_degree = 2", "shard_degree = 2\ndata_parallel_replicate_degree = 3")
    job = _read_toml(tmp_path, hsdp)
    assert (job.options["strategy"], job.options["num_gpus"], job.options["gpus_per_node"]) == ("hsdp", 384, 32)


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ('"Interleaved1F1B"', '"ZBVZeroBubble"', "parallelism.pipeline_parallel_schedule: 'ZBVZeroBubble'"),
        ('"Interleaved1F1B"', '"DualPipeV"', "parallelism.pipeline_parallel_schedule: 'DualPipeV'"),
        ("microbatch_size = 2", "microbatch_size = 3", "parallelism.pipeline_parallel_microbatch_size: 3"),
        ("tensor_parallel_degree = 8", "tensor_parallel_degree = 16", "parallelism.tensor_parallel_degree 16"),
        ("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 3", "parallelism.pipeline_parallel_degree"),
        ("seq_len = 8192", "seq_len = 8200", "training.seq_len: 8200"),
        (
            "microbatch_size = 2",
            "microbatch_size = 2\npipeline_parallel_layers_per_stage = 41",
            "layers_per_stage: 2 stages over 4 ranks",
        ),
        ("microbatch_size = 2", "microbatch_size = 4", "pipeline_parallel_microbatch_size"),  # 2 micro-batches, pp 4
        ("microbatch_size = 2", 'microbatch_size = 2\npipeline_parallel_schedule_csv = "s.csv"', "schedule_csv: "),
        ("microbatch_size = 2", 'microbatch_size = 2\nmodule_fqns_per_model_part = [["layers.0"]]', "fqns_per"),
    ],
)
def test_torchtitan_errors_name_the_key(tmp_path: Path, old: str, new: str, named: str) -> None:
    assert old in TITAN_70B
    assert named in _error(tmp_path, TITAN_70B.replace(old, new), ".toml")


def test_torchtitan_sequence_parallel_switch(tmp_path: Path) -> None:
    # torchtitan's TOML versions always apply SequenceParallel with TP; the Python configs added the switch
    assert any(a.startswith("sequence parallelism on") for a in _read_toml(tmp_path, TITAN_70B).assumptions)
    text = TITAN_70B.replace(
        "tensor_parallel_degree = 8", "tensor_parallel_degree = 8\nenable_sequence_parallel = false"
    )
    assert _read_toml(tmp_path, text).options["sequence_parallel"] is False


def test_torchtitan_async_tp_needs_compile(tmp_path: Path) -> None:
    text = TITAN_70B.replace(
        "tensor_parallel_degree = 8", "tensor_parallel_degree = 8\nenable_async_tensor_parallel = true"
    )
    assert "parallelism.enable_async_tensor_parallel: " in _error(tmp_path, text, ".toml")
    job = _read_toml(tmp_path, text + "\n[compile]\nenable = true\n")
    assert any(a.startswith("parallelism.enable_async_tensor_parallel") for a in job.assumptions)


def test_torchtune_tensor_and_context(tmp_path: Path) -> None:
    job = _read(tmp_path, TUNE_70B, ".yaml")
    plan = _plan(job)
    assert (plan.tp, plan.cp, plan.dp, plan.num_gpus, plan.sequence_parallel) == (8, 1, 2, 16, True)
    job = _read(tmp_path, TUNE_70B + "context_parallel_dim: 2\n", ".yaml")
    assert (_plan(job).cp, job.options["num_gpus"]) == (2, 32)
    other_plan = TUNE_70B.replace("llama3.base_llama_tp_plan", "qwen2.my_plan")
    job = _read(tmp_path, other_plan, ".yaml")
    assert job.options["sequence_parallel"] is False and any("sequence parallelism off" in a for a in job.assumptions)


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("tensor_parallel_dim: 8", "tensor_parallel_dim: 16", "tensor_parallel_dim 16 does not divide"),
        ("tensor_parallel_dim: 8", "tensor_parallel_dim: 0", "tensor_parallel_dim: must be at least 1"),
        (
            "tensor_parallel_plan:\n  _component_: torchtune.models.llama3.base_llama_tp_plan\n",
            "",
            "tensor_parallel_plan",
        ),
        (
            "llama3_3.llama3_3_70b",
            "llama3_3.lora_llama3_3_70b\n  lora_attn_modules: ['q_proj']",
            "tensor_parallel_dim: ",
        ),
    ],
)
def test_torchtune_errors_name_the_key(tmp_path: Path, old: str, new: str, named: str) -> None:
    assert old in TUNE_70B
    assert named in _error(tmp_path, TUNE_70B.replace(old, new), ".yaml")


def test_deepspeed_autotp(tmp_path: Path) -> None:
    # DeepSpeed 0.16+ AutoTP training: tensor_parallel.autotp_size (0: off), runtime/tensor_parallel/config.py
    text = '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}, "tensor_parallel": {%s}}'
    job = _read(tmp_path, text % '"autotp_size": 4', ".json")
    assert job.options["tp"] == 4 and job.options["sequence_parallel"] is False  # stated: the CLI's default is on
    assert any("AutoTP all-reduces" in a for a in job.assumptions)
    assert "tp" not in _read(tmp_path, text % '"autotp_size": 0', ".json").options
    assert "tensor_parallel: autotp_size: " in _error(tmp_path, text % '"autotp_size": -2', ".json")


def test_torchtitan_reshards_after_forward_by_default_without_a_pipeline(tmp_path: Path) -> None:
    text = TITAN_70B.replace("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 1")
    assert text != TITAN_70B
    job = _read(tmp_path, text, ".toml")
    assert job.options["strategy"] == "fsdp2"


def test_torchtitan_tp_pp_without_fsdp_trains_in_fp32(tmp_path: Path) -> None:
    """maybe_enable_amp: TP or PP with a data-parallel shard of 1 (and no CP) runs without mixed precision."""
    text = TITAN_70B.replace('dtype = "bfloat16"\n', "").replace(
        "data_parallel_shard_degree = 2", "data_parallel_shard_degree = 1"
    )
    text = text.replace("context_parallel_degree = 2", "context_parallel_degree = 1")
    job = _read(tmp_path, text, ".toml")
    assert (job.options["strategy"], job.options["dtype"]) == ("single", "fp32")
    assert any("disables mixed precision" in a for a in job.assumptions)
    sharded = _read(tmp_path, text.replace("data_parallel_shard_degree = 1", "data_parallel_shard_degree = 2"), ".toml")
    assert sharded.options["dtype"] == "bf16"  # FSDP's mixed precision: bf16 compute


def test_gemma2_soft_capping_is_not_sdpa_in_frameworks_own_model_code() -> None:
    from tunecost.workload.frameworks.model_parallel import own_attention

    assert own_attention("torchtune", "google/gemma-2-9b")[0] == "eager"
    assert own_attention("litgpt", "meta-llama/Llama-3.1-8B")[0] == "sdpa"
    assert own_attention("litgpt", None)[0] == "sdpa"


def test_torchtitan_deals_layers_its_stages_do_not_divide(tmp_path: Path) -> None:
    """torchtitan splits 80 layers over 3 stages (`generate_llm_fqn_per_model_part`): no even split is asked."""
    text = TITAN_70B.replace("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 3")
    job = _read_toml(tmp_path, text.replace('"Interleaved1F1B"', '"1F1B"'))
    assert (job.options["pp"], job.options["num_gpus"]) == (3, 96)


def test_torchtitan_stages_past_the_layers_name_the_key(tmp_path: Path) -> None:
    """82 effective layers (80, the embedding and the head) over 96 stages: a stage would hold nothing."""
    text = TITAN_70B.replace("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 96")
    message = _error(tmp_path, text.replace('"Interleaved1F1B"', '"1F1B"'), ".toml")
    assert "parallelism.pipeline_parallel_degree 96: 96 pipeline stages leave a stage without layers" in message


def test_torchtitan_reads_what_its_first_and_last_stages_count_the_embedding_and_head_as(tmp_path: Path) -> None:
    text = TITAN_70B.replace('"Interleaved1F1B"', '"1F1B"')
    job = _read_toml(tmp_path, text)
    assert "first_stage_less_layers" not in job.options  # torchtitan's defaults are the plan's (1 and 1)
    less = text.replace("[parallelism]", "[parallelism]\npipeline_parallel_first_stage_less_layers = 0")
    assert _read_toml(tmp_path, less).options["first_stage_less_layers"] == 0
    bad = text.replace("[parallelism]", "[parallelism]\npipeline_parallel_last_stage_less_layers = -1")
    assert "parallelism.pipeline_parallel_last_stage_less_layers: must be at least 0" in _error(tmp_path, bad, ".toml")
