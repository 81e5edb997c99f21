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
