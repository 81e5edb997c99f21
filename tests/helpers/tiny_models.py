"""Shapes shared by the tiny random models the tests build (importable from any test: see pyproject's pythonpath)."""

from __future__ import annotations


def gqa_attention(hidden_size: int, num_attention_heads: int) -> dict[str, int]:
    """The attention keys of a tiny model's config, derived from its width: heads of hidden_size /
    num_attention_heads dimensions and two query heads per key-value head (grouped-query attention)."""
    return {
        "hidden_size": hidden_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_attention_heads // 2,
        "head_dim": hidden_size // num_attention_heads,
    }


def write_llama_config(path, **sizes: int | bool | str):
    """Write a tiny Llama config.json (untied head unless `tie_word_embeddings` says otherwise) with `sizes`
    (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size) at
    `path` and return `path`."""
    import json

    config = {"model_type": "llama", "tie_word_embeddings": False, **sizes}
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def dense_lora_job(config_path):
    """A LoRA job (rank 4 on attention and MLP, batch 2 x 32 tokens) on a tiny dense model's config.json."""
    from tunecost.workload.job import FineTuneJob, LoraConfig

    return FineTuneJob(
        model=str(config_path),
        method="lora",
        lora=LoraConfig(rank=4, alpha=8, targets=("attention", "mlp")),
        batch_size=2,
        seq_len=32,
    )
