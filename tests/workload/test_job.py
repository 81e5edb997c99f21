"""FineTuneJob / LoraConfig validation: each bad field is a TunecostError naming the valid choices."""

from __future__ import annotations

import dataclasses

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.job import FineTuneJob, LoraConfig


def test_defaults_are_the_papers_setup() -> None:
    # §III / the artifact: QLoRA nf4 with double quantization, LoRA r16 (alpha 32) on experts + router, bf16,
    # FlashAttention-2, gradient checkpointing.
    job = FineTuneJob(model="mixtral-8x7b")
    assert (job.method, job.quant_type, job.double_quant, job.compute_dtype) == ("qlora", "nf4", True, "bf16")
    assert (job.lora.rank, job.lora.alpha, job.lora.targets) == (16, 32.0, ("experts", "router"))
    assert job.lora.scaling == 2.0
    assert job.attention == "flash" and job.gradient_checkpointing
    assert job.compute_bytes_per_element == 2 and job.worst_case_seq_len == 512


def test_frozen_and_keyword_only() -> None:
    job = FineTuneJob(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.batch_size = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        FineTuneJob("m")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("method", "prefix", "unsupported method 'prefix'; supported: full, lora, qlora"),
        ("compute_dtype", "int8", "unsupported compute dtype 'int8'; supported: bf16, fp16, fp32"),
        (
            "quant_type",
            "int4",
            r"unsupported quantization type 'int4'; did you mean 'int8'\? supported: nf4, fp4, gptq",
        ),
        ("attention", "flex", "unsupported attention implementation 'flex'; supported: flash, sdpa, eager"),
        (
            "optimizer",
            "adam",
            r"unsupported optimizer 'adam'; did you mean 'adamw'\? supported: adamw, adamw-8bit, adamw-4bit, sgd",
        ),
        ("batch_size", 0, "batch size must be >= 1, got 0"),
        ("batch_size", -2, "batch size must be >= 1, got -2"),
        ("seq_len", 0, "sequence length must be >= 1, got 0"),
        ("experts_per_token", 0, "experts per token must be >= 1, got 0"),
    ],
)
def test_bad_fields_raise(field: str, value: object, message: str) -> None:
    with pytest.raises(TunecostError, match=message):
        FineTuneJob(model="mixtral-8x7b", **{field: value})
    with pytest.raises(TunecostError, match=message):
        FineTuneJob(model="mixtral-8x7b").with_(**{field: value})  # copies are validated again


def test_lengths_instead_of_seq_len() -> None:
    job = FineTuneJob(model="m", seq_len=None, lengths=(10, 300, 42))
    assert job.worst_case_seq_len == 300
    with pytest.raises(TunecostError, match="give a sequence length, a dataset's lengths or a dataset"):
        FineTuneJob(model="m", seq_len=None)
    with pytest.raises(TunecostError, match="every query length must be >= 1 token"):
        FineTuneJob(model="m", seq_len=None, lengths=(10, 0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 0}, "LoRA rank must be >= 1, got 0"),
        ({"targets": ()}, "LoRA needs at least one target"),
        (
            {"targets": ("experts", "embeddings")},
            "unsupported LoRA target 'embeddings'; supported: attention, experts, router, mlp",
        ),
    ],
)
def test_bad_lora_config(kwargs, message) -> None:
    with pytest.raises(TunecostError, match=message):
        LoraConfig(**kwargs)


def test_job_gpus_strategy_and_stack() -> None:
    from tunecost.errors import TunecostError
    from tunecost.workload.job import DEFAULT_STACK, STACKS, FineTuneJob
    from tunecost.workload.parallel import ParallelPlan

    job = FineTuneJob(model="tiny-mixtral")
    assert (job.parallel, job.stack) == (ParallelPlan(), DEFAULT_STACK)
    assert (job.parallel.num_gpus, job.parallel.strategy) == (1, "single")
    assert FineTuneJob(model="tiny-mixtral", stack="hf-2024").stack == "hf-2024" and "hf-2024" in STACKS
    on_8 = FineTuneJob(model="tiny-mixtral", parallel=ParallelPlan(num_gpus=8, strategy="fsdp2"))
    assert (on_8.parallel.num_gpus, on_8.parallel.num_nodes) == (8, 1)
    with pytest.raises(TunecostError, match="software stack"):
        FineTuneJob(model="tiny-mixtral", stack="hf-2023")


def test_job_lengths_from_a_dataset_name_only() -> None:
    job = FineTuneJob(model="tiny-mixtral", seq_len=None, dataset="math_14k")
    assert job.dataset == "math_14k"
    with pytest.raises(TunecostError, match="gives no longest query"):
        _ = job.worst_case_seq_len


def test_lora_targets_by_anatomy_and_parsed() -> None:
    from tunecost.workload.job import default_lora_targets, parse_lora_targets

    assert default_lora_targets(is_moe=True) == ("experts", "router")
    assert default_lora_targets(is_moe=False) == ("attention", "mlp")
    assert parse_lora_targets(" attention, mlp ") == ("attention", "mlp")
    for bad, match in (
        ("", "at least one target"),
        ("attention,qkv", "unsupported LoRA target 'qkv'"),
        ("mlp,mlp", "named twice"),
    ):
        with pytest.raises(TunecostError, match=match):
            parse_lora_targets(bad)


def test_profile_setup_and_moe_lora_come_from_the_job() -> None:
    from tunecost.errors import TunecostError
    from tunecost.moe.spec import LoraSpec
    from tunecost.profile.model_setup import ModelSetup
    from tunecost.workload.job import LoraConfig

    job = FineTuneJob(model="tiny-mixtral", method="lora", experts_per_token=8, lora=LoraConfig(rank=8, alpha=16.0))
    setup = ModelSetup.from_job(job, device="cpu", num_layers=1)
    assert (setup.model, setup.method, setup.experts_per_token) == ("tiny-mixtral", "lora", 8)
    assert (setup.lora_rank, setup.lora_alpha, setup.num_layers, setup.device) == (8, 16.0, 1, "cpu")
    spec = LoraSpec.from_config(job.lora, expert_layout="fused")
    assert (spec.rank, spec.alpha, spec.targets, spec.expert_layout) == (8, 16.0, ("experts", "router"), "fused")
    with pytest.raises(TunecostError, match="LoRA target"):
        LoraSpec.from_config(LoraConfig(targets=("attention",)))


def test_base_quant_is_the_quantization_under_qlora_only() -> None:
    assert FineTuneJob(model="m", method="qlora", quant_type="int8").base_quant == "int8"
    assert FineTuneJob(model="m", method="lora", quant_type="int8").base_quant is None
