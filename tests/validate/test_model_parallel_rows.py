"""Corpus rows whose parallelism is stated in TP/PP/CP terms: the cell read, the layout checked against the GPUs
and the model, and a pipeline row's memory modelled."""

from __future__ import annotations

import pytest

from tunecost.validate.cells import Skip
from tunecost.validate.corpus import CorpusRow
from tunecost.validate.mapping import map_row
from tunecost.validate.model_parallel_cells import model_parallel_of, names_distributed_optimizer
from tunecost.workload.parallel import ModelParallel


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("TP=8, PP=4", ModelParallel(tp=8, pp=4, micro_batches=16)),
        ("tensor parallel 8 + sequence parallel", ModelParallel(tp=8, sequence_parallel=True)),
        ("tensor_model_parallel_size: 4, pipeline_model_parallel_size 2", ModelParallel(tp=4, pp=2, micro_batches=16)),
        ("tp2 sp=false", ModelParallel(tp=2)),
        (
            "tp4 pp2 cp2 vp5",
            ModelParallel(tp=4, pp=2, cp=2, micro_batches=16, pipeline_schedule="interleaved-1f1b", virtual_stages=5),
        ),
        ("tp4 sp, TP comm overlap", ModelParallel(tp=4, sequence_parallel=True, tp_comm_overlap=True)),
        ("fsdp (FULL_SHARD)", None),
        ("single", None),
    ],
)
def test_the_cell_states_the_degrees(cell, expected):
    assert model_parallel_of(cell, micro_batches=16) == expected


def test_distributed_optimizer_is_named():
    assert names_distributed_optimizer("TP=8, distributed optimizer") and not names_distributed_optimizer("TP=8")


def _row(parallelism: str, **cells) -> CorpusRow:
    base = dict(
        id="mp-1",
        source="test",
        model="meta-llama/Llama-2-7b-hf",
        method="full",
        compute_dtype="bf16",
        batch_size_per_gpu="1",
        grad_accum="8",
        seq_len="2048",
        seq_len_kind="fixed",
        grad_ckpt="off",
        attention="flash",
        optimizer="adamw",
        stack="nemo",
        gpu="H100",
        num_gpus="8",
        parallelism=parallelism,
        quantity="peak_allocated_gib",
        value="30",
        unit="GB",
        reliability="medium",
    )
    return CorpusRow(path="rows.csv", line=2, cells={**base, **cells})


def test_a_pipeline_row_is_one_rank_of_its_layout():
    mapped = map_row(_row("PP=4, distributed optimizer"))
    plan = mapped.plan()
    assert (plan.pp, plan.dp, plan.strategy, plan.num_micro_batches) == (4, 2, "zero1", 8)


@pytest.mark.parametrize(
    ("cell", "gpus", "message"),
    [
        ("TP=3, PP=2", "8", "does not divide the 8 GPUs"),
        ("PP=3", "6", "--pp 3 does not divide the model's 32 decoder layers"),
        ("TP=64", "64", "--tp 64 does not divide the model's 32 attention heads"),
    ],
)
def test_a_layout_the_row_cannot_take_is_skipped_with_why(cell, gpus, message):
    with pytest.raises(Skip, match=message):
        map_row(_row(cell, num_gpus=gpus))
