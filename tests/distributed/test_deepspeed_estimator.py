"""DeepSpeed's own estimator beside ZeRO setups: its formulas against outputs DeepSpeed printed, and the largest
module it needs, counted on the tiny configs."""

from __future__ import annotations

import pytest
from tiny_jobs import CONFIGS, tiny_job

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.distributed.deepspeed_estimator import zero2_gpu_bytes, zero3_gpu_bytes
from tunecost.estimate.gpu_search import estimate_multi_gpu
from tunecost.models.catalog import resolve_model
from tunecost.models.params import count_parameters
from tunecost.workload.job import LoraConfig

GIB = 2**30


@pytest.mark.parametrize(
    ("offload_optimizer", "offload_params", "printed_gib"),
    [(True, True, 0.06), (True, False, 0.17), (False, False, 1.08)],
)
def test_zero3_reproduces_deepspeeds_printout_for_t5_small(offload_optimizer, offload_params, printed_gib):
    """estimate_zero3_model_states_mem_needs_all_live(t5-small, 1 GPU) as printed in
    https://blog.csdn.net/u012327567/article/details/132278598 ("60M total params, 16M largest layer params"):
    t5-small holds 60,506,624 parameters; its largest module is the shared embedding, 32,128 x 512."""
    gpu_bytes = zero3_gpu_bytes(
        total_params=60_506_624,
        largest_module_params=32_128 * 512,
        num_gpus=1,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
    )
    assert round(gpu_bytes / GIB, 2) == printed_gib


def test_zero2_offload_keeps_the_16_bit_weights():
    """DeepSpeed's memory docs (t5-3b, 2851M parameters, 8 GPUs, offload_optimizer=cpu): 5.31 GB per GPU."""
    assert round(zero2_gpu_bytes(total_params=2_851_000_000, num_gpus=8, offload_optimizer=True) / GIB, 2) == 5.31
    assert zero2_gpu_bytes(total_params=800, num_gpus=8, offload_optimizer=False) == 2 * 800 + 18 * 800 // 8


def test_largest_module_is_counted_on_the_model():
    """tiny Llama: the embedding and the LM head, 512 x 64 each; tiny Mixtral: one layer's experts module,
    8 experts x (gate-up 2 x 128 x 64 + down 64 x 128), held by the module itself (transformers' fused experts)."""
    assert count_parameters(resolve_model(str(CONFIGS / "tiny-llama-2l.json"))).largest_module == 512 * 64
    mixtral = count_parameters(resolve_model(str(CONFIGS / "tiny-mixtral-2l.json")))
    assert mixtral.largest_module == 8 * (2 * 128 * 64 + 64 * 128)


def test_zero_setups_carry_deepspeeds_estimate_and_others_do_not():
    job = tiny_job("tiny-mixtral-2l", "lora", LoraConfig(rank=8, targets=("attention",)))
    answer = estimate_multi_gpu(
        job, gpus=[resolve_gpu_name("H100").gpu], strategies=["fsdp2", "zero2", "zero3"], num_gpus=4
    )
    by_strategy = {s.plan.strategy: s.deepspeed_estimate_bytes for s in answer.setups}
    counts = count_parameters(resolve_model(job.model))
    assert by_strategy["fsdp2"] is None
    assert by_strategy["zero2"] == 2 * counts.total + int(18 * counts.total / 4)
    assert by_strategy["zero3"] == 4 * counts.largest_module + int(18 * counts.total / 4)
    assert any("every parameter trainable" in note for note in answer.notes)
