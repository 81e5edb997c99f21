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
        ("TP8PP2", ModelParallel(tp=8, pp=2, micro_batches=16)),  # a degree right after another's digit
        ("TP4xPP2xCP2", ModelParallel(tp=4, pp=2, cp=2, micro_batches=16)),  # or after an "x"
        ("TPx4 CPx2", ModelParallel(tp=4, cp=2)),
        (  # Megatron's argument names: the virtual pipeline's is not the pipeline's
            "virtual_pipeline_model_parallel_size=5, tensor_model_parallel_size=4, pipeline_model_parallel_size=2",
            ModelParallel(tp=4, pp=2, micro_batches=16, pipeline_schedule="interleaved-1f1b", virtual_stages=5),
        ),
        (
            "TP4 PP2 VP-5",
            ModelParallel(tp=4, pp=2, micro_batches=16, pipeline_schedule="interleaved-1f1b", virtual_stages=5),
        ),
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


@pytest.mark.parametrize(("cell", "strategy"), [("TP1 PP1 CP1 VP1", "zero1"), ("tensor parallel 1", "zero1")])
def test_a_megatron_layout_of_degree_one_is_its_data_parallelism(cell, strategy):
    plan = map_row(_row(cell)).plan()
    assert (plan.tp, plan.pp, plan.cp, plan.dp, plan.strategy) == (1, 1, 1, 8, strategy)


@pytest.mark.parametrize(
    ("cell", "gpus", "message"),
    [
        ("TP=3, PP=2", "8", "does not divide the 8 GPUs"),
        ("TP=64", "64", "--tp 64 does not divide the model's 32 attention heads"),
    ],
)
def test_a_layout_the_row_cannot_take_is_skipped_with_why(cell, gpus, message):
    with pytest.raises(Skip, match=message):
        map_row(_row(cell, num_gpus=gpus))


def test_layers_the_pipeline_does_not_divide_are_split_unevenly_and_said():
    """32 layers over 3 stages ran (Megatron with its embedding and loss counted, or torchtitan's split): the
    stages hold 11, 11 and 10 layers, said in the row's reason."""
    mapped = map_row(_row("PP=3", num_gpus="6"))
    assert mapped.plan().pp == 3
    assert "32 layers over 3 pipeline stages as 11, 11, 10" in mapped.note
    with pytest.raises(Skip, match="64 pipeline stages leave a stage without layers"):
        map_row(_row("PP=32 VP=2", num_gpus="32", grad_accum="32"))


def test_a_blank_grad_accum_is_the_global_batch_over_the_data_parallel_micro_batches():
    """64 GPUs at TP 4 x PP 4: 4 data-parallel ranks; global batch 128 of micro-batch 1 is 32 micro-batches each,
    said in the row's reason; a global batch they do not divide is skipped with why."""
    mapped = map_row(_row("TP=4, PP=4, distributed optimizer", num_gpus="64", grad_accum="", global_batch="128"))
    assert (mapped.grad_accum, mapped.plan().dp, mapped.plan().num_micro_batches) == (32, 4, 32)
    assert "grad_accum 32: global_batch 128 / (1 x 4 data-parallel ranks)" in mapped.note
    with pytest.raises(Skip, match="global_batch 126 is not a multiple"):
        map_row(_row("TP=4, PP=4", num_gpus="64", grad_accum="", global_batch="126"))


def test_a_blank_micro_batch_is_the_global_batch_over_the_accumulated_data_parallel_ranks():
    """MLPerf states the global batch: 8 GPUs at TP 4 are 2 data-parallel ranks; global batch 8 with 2 micro-batches
    each is a micro-batch of 2, said; one they do not divide, or no global batch, is skipped with why."""
    mapped = map_row(_row("TP=4", batch_size_per_gpu="", grad_accum="2", global_batch="8"))
    assert (mapped.job.batch_size, mapped.grad_accum, mapped.plan().dp) == (2, 2, 2)
    assert "batch_size_per_gpu 2: global_batch / (2 x 2 ranks)" in mapped.note
    with pytest.raises(Skip, match="global_batch 6 is not a multiple of grad_accum 4"):
        map_row(_row("TP=4", batch_size_per_gpu="", grad_accum="4", global_batch="6"))
    with pytest.raises(Skip, match="batch_size_per_gpu '' is not a number"):
        map_row(_row("TP=4", batch_size_per_gpu=""))


def test_nemo_rows_run_sequence_parallelism_with_tp_unless_the_cell_says_otherwise():
    """NeMo's performance scripts turn sequence parallelism on whenever TP > 1: a NeMo row that does not say runs it
    (said in the row's reason); one that says no, or whose sequence TP does not divide, does not; nor a row of a
    stack without that default."""
    mapped = map_row(_row("TP=4"))
    assert mapped.plan().sequence_parallel and "sequence parallelism on with TP 4" in mapped.note
    for cell in ("TP=4 sp=false", "TP=4, no sequence parallelism", "TP4 sequence_parallel: False"):
        assert not map_row(_row(cell)).plan().sequence_parallel, cell
    assert not map_row(_row("TP=4", seq_len="2046")).plan().sequence_parallel
    assert not map_row(_row("TP=4", stack="hf-transformers")).plan().sequence_parallel


def test_a_global_batch_that_disagrees_with_the_stated_micro_batch_and_accumulation_is_skipped():
    """8 GPUs at TP 4 x CP 2 are one data-parallel rank: global batch 8 needs 8 accumulated micro-batches of 1;
    a row that also states grad_accum 1 says two different steps, and is skipped naming both."""
    assert map_row(_row("TP4 CP2", grad_accum="8", global_batch="8")).grad_accum == 8
    with pytest.raises(Skip, match=r"global_batch 8 is not batch_size_per_gpu 1 x grad_accum 1 x 1 data-parallel"):
        map_row(_row("TP4 CP2", grad_accum="1", global_batch="8"))


def test_tokens_per_gpu_share_a_data_parallel_ranks_tokens_over_its_model_parallel_gpus():
    """TP 4 on 8 GPUs: two data-parallel ranks, each of 4 GPUs; a step's tokens per GPU are a quarter of a rank's,
    so the same step reads the same from samples per second and from tokens per second per GPU."""
    from tunecost.validate import throughput as tp

    mapped = map_row(_row("TP=4", quantity="samples_per_s", value="10", unit="samples/s"))
    shape = tp.shape_of(mapped)
    assert (shape.num_gpus, shape.model_parallel) == (2, 4)
    step_s = tp.to_step_seconds("samples_per_s", 10.0, shape)  # 1 x 8 x 2 samples per step
    tokens_per_gpu = tp.from_step_seconds("tokens_per_s_per_gpu", step_s, shape)
    assert tokens_per_gpu == pytest.approx(10.0 / 2 * 2048 / 4)  # a rank's samples/s x tokens, over its 4 GPUs


def test_expert_parallelism_over_the_data_parallel_ranks_is_modelled():
    """64 GPUs at PP 4 leave 16 data-parallel ranks: EP 8 splits the experts over them (memory and throughput).
    At TP 2 x PP 8 only 4 are left: EP 8 would span TP ranks (Megatron-Core's MoE parallel folding), not
    modelled: a throughput row is priced without its all-to-all (said), a memory row skipped with why."""
    row = dict(model="mistralai/Mixtral-8x7B-v0.1", num_gpus="64", grad_accum="", global_batch="256")
    for quantity in (dict(), dict(quantity="samples_per_s", value="5", unit="samples/s")):
        mapped = map_row(_row("TP=1, PP=4, EP=8", **row, **quantity))
        assert mapped.plan().expert_parallel == 8 and "expert parallelism" not in mapped.note
    mapped = map_row(_row("TP=2, PP=8, EP=8", quantity="samples_per_s", value="5", unit="samples/s", **row))
    assert mapped.plan().expert_parallel == 1
    assert "expert parallelism 8 not modelled (it does not divide the 4 data-parallel ranks)" in mapped.note
    with pytest.raises(Skip, match="expert parallelism 8: it does not divide the 4 data-parallel ranks"):
        map_row(_row("TP=2, PP=8, EP=8", **row))


def test_experts_split_otherwise_than_tp_are_said_or_skipped():
    """Megatron's expert tensor parallelism (ETP) other than TP: tunecost splits the experts as TP does, so a
    throughput row says so and a memory row is skipped; ETP equal to TP is what it models."""
    row = dict(model="mistralai/Mixtral-8x7B-v0.1", num_gpus="64", grad_accum="", global_batch="256")
    throughput = dict(quantity="samples_per_s", value="5", unit="samples/s")
    mapped = map_row(_row("TP=2, PP=4, EP=8, ETP=1", **row, **throughput))
    assert "expert tensor parallelism 1 beside TP 2 not modelled" in mapped.note
    with pytest.raises(Skip, match="expert tensor parallelism 1 beside TP 2"):
        map_row(_row("TP=2, PP=4, EP=8, ETP=1", **row))
    assert "expert tensor" not in map_row(_row("TP=2, PP=4, EP=8, ETP=2", **row)).note


@pytest.mark.parametrize(
    ("cells", "read"),
    [
        (dict(gpu="8xH100"), lambda m: m.gpu_name.startswith("H100")),
        (dict(compute_dtype="bfloat16"), lambda m: m.job.compute_dtype == "bf16"),
        (dict(compute_dtype="bf16-mixed"), lambda m: m.job.compute_dtype == "bf16"),
        (dict(method="Full"), lambda m: m.job.method == "full"),
        (dict(attention="cudnn fused attention"), lambda m: m.job.attention == "flash"),
        (dict(attention="TE"), lambda m: m.job.attention == "flash"),
        (dict(optimizer="distributed_fused_adam"), lambda m: m.job.optimizer == "adamw"),
        (dict(stack="deepspeed"), lambda m: m.stack.name == "hf-trainer"),
        (dict(grad_ckpt=""), lambda m: not m.job.gradient_checkpointing and "NeMo" in m.note),
        (dict(compute_dtype="torch.bfloat16"), lambda m: m.job.compute_dtype == "bf16"),
        (dict(compute_dtype="AMP (bf16)"), lambda m: m.job.compute_dtype == "bf16"),
        (dict(num_gpus="8 GPUs"), lambda m: m.num_gpus == 8),
        (dict(num_gpus="2x8"), lambda m: m.num_gpus == 16),  # nodes x GPUs
        (dict(seq_len="2k"), lambda m: m.job.seq_len == 2048),
        (dict(seq_len="2,048 tokens"), lambda m: m.job.seq_len == 2048),
        (dict(seq_len_kind="Packed (ConstantLengthDataset)"), lambda m: m.job.seq_len == 2048),
        (dict(seq_len_kind="packing=True"), lambda m: m.job.seq_len == 2048),
        (dict(method="SFT (LoRA)", lora_rank="16", lora_targets="all linear"), lambda m: m.job.method == "lora"),
        (
            dict(method="LoRA (r=16)", lora_rank="16", lora_targets="q,k,v,o"),
            lambda m: m.job.lora.targets == ("attention",),
        ),
        (dict(gpu="NVIDIA A100-SXM4-80GB (x8)"), lambda m: m.gpu_name == "A100-80GB-SXM"),
        (dict(gpu="A100 80G"), lambda m: m.gpu_name == "A100-80GB-SXM"),
        (dict(num_gpus="8x H100"), lambda m: m.num_gpus == 8),
        (dict(num_gpus="2 nodes x 8 GPUs"), lambda m: m.num_gpus == 16),
        (dict(num_gpus="1,024", global_batch="1,024", grad_accum=""), lambda m: m.num_gpus == 1024),
        (dict(gpu="DGX H100"), lambda m: m.gpu_name == "H100-80GB-SXM"),
        (dict(gpu="DGX-GB200"), lambda m: m.gpu_name == "GB200-186GB"),
        (dict(method="pre-training"), lambda m: m.job.method == "full"),  # the step of a full fine-tune
        (dict(method="Supervised fine-tuning"), lambda m: m.job.method == "full"),
        (dict(compute_dtype="float8 (e4m3)"), lambda m: m.job.fp8 == "te-delayed"),
        (dict(optimizer="Distributed Adam"), lambda m: m.job.optimizer == "adamw"),
        (dict(gpu="GB200 NVL72"), lambda m: m.gpu_name == "GB200-186GB"),
        (dict(method="Low-Rank Adaptation", lora_rank="16", lora_targets="QKV;Proj"), lambda m: m.job.method == "lora"),
        (
            dict(method="lora", lora_rank="16", lora_targets="attention (qkv, proj)"),
            lambda m: m.job.lora.targets == ("attention",),
        ),
        (dict(seq_len_kind="padded"), lambda m: m.job.seq_len == 2048),
        (dict(method="Full-parameter fine-tuning"), lambda m: m.job.method == "full"),
        (dict(quantization="bf16"), lambda m: m.job.method == "full"),  # the weights' own dtype: not quantized
        (dict(grad_ckpt="gradient checkpointing, no CPU offload"), lambda m: m.job.gradient_checkpointing),
        (dict(grad_ckpt="on, no offload"), lambda m: m.job.gradient_checkpointing),
    ],
)
def test_how_sources_spell_a_row(cells: dict, read) -> None:
    """Spellings of published rows: a GPU with its count, framework dtype names, capitals, Transformer Engine's
    fused attention, NeMo's optimizer, DeepSpeed named alone, and NeMo's default (no recomputation) where the row
    leaves checkpointing blank."""
    assert read(map_row(_row("TP=4", **cells)))


def test_fp8_weights_are_transformer_engines_fp8_params_and_skipped_elsewhere():
    """quantization fp8 (MLPerf's LoRA keeps its frozen weights in FP8 under NeMo): FP8 compute with the weights
    kept in FP8 only; outside Transformer Engine it is skipped with why, not read as bf16 weights."""
    lora = dict(method="lora", lora_rank="16", lora_targets="q_proj;v_proj", quantization="FP8")
    mapped = map_row(_row("TP=4", **lora))
    assert (mapped.job.fp8, mapped.job.fp8_params, mapped.job.compute_dtype) == ("te-delayed", True, "bf16")
    for cell in ("FP8 params", "fp8 (TE)", "float8", "E4M3"):
        assert map_row(_row("TP=4", **{**lora, "quantization": cell})).job.fp8_params, cell
    with pytest.raises(Skip, match="fp8 weights outside Transformer Engine"):
        map_row(_row("TP=4", **lora, stack="transformers"))


def test_memory_units_as_sources_write_them():
    from tunecost.validate.run import unit_bytes

    for unit in ("GiB", "GB", "GiB per GPU", "GB/GPU", "GB (per device)", "gigabytes", "Gi"):
        assert unit_bytes(unit) == 2**30, unit
    assert unit_bytes("MiB") == 2**20 and unit_bytes("B") == 1
    assert unit_bytes("tokens/s") is None and unit_bytes("GBs") is None


@pytest.mark.parametrize(
    ("value", "unit", "read"),
    [
        ("30", "GB", 30.0),
        ("1,234.5", "tokens/s", 1234.5),
        ("~30", "GiB", 30.0),
        ("≈ 30", "GiB", 30.0),
        ("about 12.5", "s/it", 12.5),
        ("30 GB", "GB", 30.0),
        ("30 GiB", "GB", None),  # another unit than the row's: not guessed
        ("1,23", "GB", None),
        ("abc", "GB", None),
    ],
)
def test_measured_values_in_the_spellings_sources_use(value, unit, read):
    from tunecost.validate.cells import measured_value

    row = CorpusRow(path="rows.csv", line=2, cells={"value": value, "unit": unit})
    if read is None:
        with pytest.raises(ValueError):
            measured_value(row)
    else:
        assert measured_value(row) == read


def test_a_megatron_row_whose_stages_divide_the_layers_deals_them_evenly():
    """NeMo runs Megatron Core's split: 32 layers over 4 stages are 8 each, not torchtitan's 8, 9, 8, 7."""
    plan = map_row(_row("PP=4", num_gpus="8")).plan()
    assert (plan.pp, plan.stage_weights(32)) == (4, (0, 0))
    assert map_row(_row("PP=3", num_gpus="6")).plan().stage_weights(32) == (1, 1)
