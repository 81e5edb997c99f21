"""The shipped corpus's SantaCoder (GPTBigCode) and Granite-3.0 MoE rows map to simulated jobs of the catalog
models; the MoE benchmark run without MoE kernels is its own named stack."""

from __future__ import annotations

import pytest

from tunecost.validate import read_corpus
from tunecost.validate.corpus import DEFAULT_CORPUS_PATH
from tunecost.validate.mapping import map_row
from tunecost.validate.stacks import stack_for

ROWS = {row.id: row for row in read_corpus([DEFAULT_CORPUS_PATH])}


@pytest.mark.parametrize(
    ("row_id", "model", "method", "targets", "stack", "num_gpus"),
    [
        ("fms-02", "santacoder", "full", None, "hf-trainer", 1),
        # LoRA targets q_proj;k_proj;v_proj;o_proj;c_attn: SantaCoder has only the fused c_attn of those
        ("fms-88", "santacoder", "qlora", ("attention",), "hf-trainer-bnb", 1),
        ("fms-163", "granite-3.0-3b-a800m", "full", None, "hf-trainer-no-moe-kernels", 1),
        ("fms-165", "granite-3.0-3b-a800m", "full", None, "hf-trainer-no-moe-kernels", 2),
    ],
)
def test_rows_map_to_catalog_models(row_id, model, method, targets, stack, num_gpus) -> None:
    mapped = map_row(ROWS[row_id])
    assert mapped.job.model == model and mapped.job.method == method
    assert targets is None or mapped.job.lora.targets == targets
    assert mapped.stack.name == stack and mapped.stack.simulator_stack == "hf-peft"
    assert mapped.num_gpus == num_gpus


def test_no_moe_kernels_stack_is_hf_trainer_otherwise() -> None:
    moe = stack_for("hf-transformers+accelerate (no MoE kernels)")
    dense = stack_for("hf-transformers+accelerate")
    assert moe.name == "hf-trainer-no-moe-kernels" and dense.name == "hf-trainer"
    assert (moe.kept_for_backward, moe.loss, moe.adapters, moe.allocator) == (
        dense.kept_for_backward,
        dense.loss,
        dense.adapters,
        dense.allocator,
    )
    assert set(dense.not_modelled) < set(moe.not_modelled)


def test_a_row_beyond_learned_positions_is_modelled_at_the_model_s_positions() -> None:
    """SantaCoder's 2048 learned positions (`wpe`) take no 4096-token sequence: the fms rows at seq_len 4096 ran
    cut to 2048, and the row says so in its reason."""
    row = ROWS["fms-02"]
    assert row.get("seq_len") == "4096"
    mapped = map_row(row)
    assert mapped.job.seq_len == 2048
    assert "2048 learned positions" in mapped.note and "4096" in mapped.note


def test_a_row_within_positions_has_no_note() -> None:
    mapped = map_row(ROWS["fms-14"])  # Mistral-7B (rotary positions) at 4096
    assert mapped.job.seq_len == 4096 and mapped.note == ""


def test_hugging_face_library_names_are_the_hf_trainer_stacks() -> None:
    named = {  # (stack cell, quantization) -> stack
        ("HF Trainer", "none"): "hf-trainer",
        ("Hugging Face PEFT", "bnb-nf4"): "hf-trainer-bnb",
        ("huggingface accelerate", "none"): "hf-trainer",
        ("peft + bitsandbytes", "bnb-nf4"): "hf-trainer-bnb",
        ("accelerate + TRL", "bnb-nf4"): "trl-sft-bnb",
    }
    assert {key: getattr(stack_for(*key), "name", None) for key in named} == named


@pytest.mark.parametrize("cell", ["fsdp_qlora", "ms-swift 3"])
def test_other_trainers_stay_unknown(cell: str) -> None:
    assert stack_for(cell) is None


@pytest.mark.parametrize("cell", ["megatron-lm", "NeMo 24.05", "nemo"])
def test_nemo_and_megatron_are_one_stack(cell: str) -> None:
    assert stack_for(cell).name == "nemo"
