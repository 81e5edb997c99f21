"""A published run that leaves a setting to its framework gets that framework's documented default, said."""

from __future__ import annotations

import pytest

from tunecost.validate.corpus import CorpusRow
from tunecost.validate.mapping import Skip, map_row

ROW = {
    "id": "lf-1",
    "model": "meta-llama/Llama-2-7b-hf",
    "method": "lora",
    "lora_rank": "",
    "quantization": "none",
    "compute_dtype": "bf16",
    "batch_size_per_gpu": "4",
    "seq_len": "1024",
    "seq_len_kind": "fixed",
    "grad_ckpt": "",
    "attention": "sdpa",
    "gpu": "A100-SXM4-80GB",
    "num_gpus": "1",
    "parallelism": "single",
    "quantity": "peak_allocated_gib",
    "value": "20",
    "unit": "GiB",
}


def test_llamafactory_rows_take_its_defaults() -> None:
    mapped = map_row(CorpusRow(path="x.csv", line=2, cells={**ROW, "stack": "LLaMA-Factory 0.9.1"}))
    assert mapped.job.lora.rank == 8 and mapped.job.lora.alpha == 16 and mapped.job.gradient_checkpointing
    assert "LoRA rank 8: LLaMA-Factory's default" in mapped.note
    assert "gradient checkpointing on: LLaMA-Factory's default" in mapped.note


def test_axolotl_states_no_rank_and_a_plain_trainer_checkpoints_nothing() -> None:
    with pytest.raises(Skip, match="LoRA rank not stated"):  # axolotl has no default rank
        map_row(CorpusRow(path="x.csv", line=2, cells={**ROW, "stack": "axolotl 0.6"}))
    for stack in ("hf-transformers", "HF Trainer + DeepSpeed 0.14", "accelerate"):
        mapped = map_row(
            CorpusRow(path="x.csv", line=2, cells={**ROW, "stack": stack, "lora_rank": "16", "lora_targets": "q_proj"})
        )
        assert not mapped.job.gradient_checkpointing, stack
        assert "gradient checkpointing off: transformers TrainingArguments' default" in mapped.note
    # TRL's SFTConfig default changed between versions, swift and unsloth keep their own: not guessed
    for stack in ("trl SFTTrainer", "swift 2.x (hf-transformers+peft)", "trl 0.9 + transformers"):
        with pytest.raises(Skip, match="gradient checkpointing not stated"):
            map_row(
                CorpusRow(
                    path="x.csv", line=2, cells={**ROW, "stack": stack, "lora_rank": "16", "lora_targets": "q_proj"}
                )
            )


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        ({"method": "SFT", "lora_rank": "", "lora_targets": ""}, ("full", "off")),
        ({"method": "full fine-tune", "lora_rank": "", "lora_targets": ""}, ("full", "off")),
        ({"method": "LoRA", "quantization": "bnb-nf4"}, ("qlora", "off")),
        ({"grad_ckpt": "activation recompute (full)"}, ("lora", "on")),
        ({"grad_ckpt": "recompute: none"}, ("lora", "off")),
        ({"grad_ckpt": "unknown"}, ("lora", "off")),  # unknown: the framework's default
    ],
)
def test_method_and_checkpointing_as_sources_write_them(cells: dict, expected: tuple) -> None:
    row = {**ROW, "stack": "hf-transformers", "lora_rank": "16", "lora_targets": "q_proj;v_proj", **cells}
    mapped = map_row(CorpusRow(path="x.csv", line=2, cells=row))
    assert (mapped.job.method, "on" if mapped.job.gradient_checkpointing else "off") == expected


@pytest.mark.parametrize(
    ("cells", "reason"),
    [
        ({"grad_ckpt": "sometimes"}, "grad_ckpt 'sometimes' not understood"),
        ({"method": "SFT"}, "full fine-tune or LoRA"),
        ({"method": "dpo"}, "unknown method 'dpo'"),
    ],
)
def test_cells_that_cannot_be_read_are_skipped_with_why(cells: dict, reason: str) -> None:
    row = {**ROW, "stack": "hf-transformers", "lora_rank": "16", "lora_targets": "q_proj;v_proj", **cells}
    with pytest.raises(Skip, match=reason):
        map_row(CorpusRow(path="x.csv", line=2, cells=row))


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        ({"optimizer": "adamw (DeepSpeed, fused)"}, ("adamw", "on")),
        ({"optimizer": "AdamW 8-bit (bnb)"}, ("adamw-8bit", "on")),
        ({"grad_ckpt": "yes (default)"}, ("adamw", "on")),
        ({"grad_ckpt": "disabled"}, ("adamw", "off")),
        ({"attention": "sdpa (default)"}, ("adamw", "on")),
    ],
)
def test_free_text_cells_read_as_a_person_reads_them(cells: dict, expected: tuple) -> None:
    row = {**ROW, "stack": "hf-transformers", "lora_rank": "16", "lora_targets": "q_proj;v_proj", "grad_ckpt": "on"}
    mapped = map_row(CorpusRow(path="x.csv", line=2, cells={**row, **cells}))
    assert (mapped.job.optimizer, "on" if mapped.job.gradient_checkpointing else "off") == expected


def test_torchtune_lora_rows_take_its_shipped_configs_and_full_rows_none() -> None:
    mapped = map_row(CorpusRow(path="x.csv", line=2, cells={**ROW, "stack": "torchtune"}))
    assert mapped.job.lora.rank == 8 and mapped.job.gradient_checkpointing
    assert set(mapped.job.lora.targets) == {"q_proj", "v_proj", "o_proj", "mlp"}  # lora_attn_modules q, v, output
    assert "LoRA rank 8: as torchtune's shipped LoRA configs set it" in mapped.note
    with pytest.raises(Skip, match="gradient checkpointing not stated"):  # its full configs differ per GPU
        map_row(CorpusRow(path="x.csv", line=2, cells={**ROW, "stack": "torchtune", "method": "full"}))


@pytest.mark.parametrize(
    ("cell", "stack", "simulated"),
    [("litgpt 0.5.3", "litgpt", "torchtune"), ("NVIDIA NeMo Automodel", "nemo-automodel", "hf-peft")],
)
def test_litgpt_and_nemo_automodel_rows_are_modelled(cell: str, stack: str, simulated: str) -> None:
    row = {**ROW, "stack": cell, "lora_rank": "16", "lora_targets": "q_proj;v_proj", "grad_ckpt": "on"}
    mapped = map_row(CorpusRow(path="x.csv", line=2, cells=row))
    assert (mapped.stack.name, mapped.stack.simulator_stack) == (stack, simulated)
