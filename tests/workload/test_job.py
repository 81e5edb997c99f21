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
        ("quant_type", "int4", "unsupported 4-bit quantization type 'int4'; supported: nf4, fp4"),
        ("attention", "flex", "unsupported attention implementation 'flex'; supported: flash, sdpa, eager"),
        ("optimizer", "adam", "unsupported optimizer 'adam'; supported: adamw, adamw-8bit, sgd"),
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
    with pytest.raises(TunecostError, match="give a sequence length or a dataset's lengths"):
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

    job = FineTuneJob(model="tiny-mixtral")
    assert (job.num_gpus, job.gpus_per_node, job.strategy, job.stack) == (1, None, "single", DEFAULT_STACK)
    assert FineTuneJob(model="tiny-mixtral", stack="hf-2024").stack == "hf-2024" and "hf-2024" in STACKS
    for bad, match in (
        ({"stack": "hf-2023"}, "software stack"),
        ({"strategy": "fsdp2", "num_gpus": 8}, "multi-GPU strategy"),
        ({"num_gpus": 8}, "needs a multi-GPU strategy"),
        ({"num_gpus": 0}, "number of GPUs"),
        ({"gpus_per_node": 2}, "GPUs per node"),
    ):
        with pytest.raises(TunecostError, match=match):
            FineTuneJob(model="tiny-mixtral", **bad)


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
