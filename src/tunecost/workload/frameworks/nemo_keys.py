"""Where NeMo 1.x's training YAML and Megatron-LM's `--yaml-cfg` YAML keep each setting the `nemo` reader reads,
and the defaults they fall back on."""

from __future__ import annotations

from dataclasses import dataclass, field

# Defaults, NVIDIA/NeMo @ 8cfedd72 (2025-09-20), examples/nlp/language_modeling/conf/megatron_gpt_config.yaml
# (pre-training) and tuning/conf/megatron_gpt_finetuning_config.yaml (a model.peft section):
#   trainer.devices 1, num_nodes 1; precision bf16 (fine-tuning: 16); micro_batch_size 4; global_batch_size 8
#   (fine-tuning: 128); tensor/pipeline_model_parallel_size 1, virtual_pipeline_model_parallel_size null,
#   sequence_parallel False (turned off when tp is 1: megatron_base_model.py), context_parallel_size 1
#   (megatron_base_model.py cfg.get); encoder_seq_length 512 (fine-tuning: data.train_ds.max_seq_length 2048);
#   activations_checkpoint_granularity null; optim.name fused_adam; fp8 False; peft.peft_scheme "adapter",
#   lora_tuning.adapter_dim 32, alpha = adapter_dim, target_modules ['attention_qkv']
# Megatron-LM @ d98e8a64 (2026-08-22): megatron/core/model_parallel_config.py (degrees 1, sequence_parallel False,
#   bf16/fp16 False: fp32), megatron/training/arguments.py (optimizer adam, global_batch_size micro x dp,
#   micro_batch_size and seq_length required); YAML sections from megatron/training/yaml_arguments.py
TITLE = "NeMo"
MEGATRON = "Megatron-LM"


@dataclass(frozen=True, kw_only=True)
class Dialect:
    """Where one format keeps each setting."""

    title: str = field(kw_only=False)
    tp: str
    pp: str
    vp: str
    cp: str
    sp: str
    micro: str
    global_batch: str
    seq_len: str
    layers: str
    heads: str
    hidden: str
    ffn: str
    experts: str
    tokenizer: tuple[str, str, str]  # (the tokenizer kind's key, the Hugging Face kind, the key naming its hub id)
    groups: str
    fp8: str
    fp8_params: str
    optimizer: str
    recompute: str
    tp_overlap: str
    ep: str  # expert_model_parallel_size, expert_tensor_parallel_size (default: TP's)
    etp: str
    split_embedding: str  # Megatron Core's account_for_embedding/loss_in_pipeline_split
    split_loss: str
    first_layers: str  # Megatron Core's num_layers_in_first/last_pipeline_stage
    last_layers: str


NEMO = Dialect(
    TITLE,
    tp="model.tensor_model_parallel_size",
    pp="model.pipeline_model_parallel_size",
    vp="model.virtual_pipeline_model_parallel_size",
    cp="model.context_parallel_size",
    sp="model.sequence_parallel",
    micro="model.micro_batch_size",
    global_batch="model.global_batch_size",
    seq_len="model.encoder_seq_length",
    layers="model.num_layers",
    heads="model.num_attention_heads",
    hidden="model.hidden_size",
    ffn="model.ffn_hidden_size",
    experts="model.num_moe_experts",
    tokenizer=("model.tokenizer.library", "huggingface", "model.tokenizer.type"),
    groups="model.num_query_groups",
    fp8="model.fp8",
    fp8_params="model.fp8_params",
    optimizer="model.optim.name",
    recompute="model.activations_checkpoint_granularity",
    tp_overlap="model.ub_tp_comm_overlap",
    ep="model.expert_model_parallel_size",
    etp="model.expert_tensor_parallel_size",
    split_embedding="model.account_for_embedding_in_pipeline_split",  # TransformerConfig fields, as NeMo passes them
    split_loss="model.account_for_loss_in_pipeline_split",
    first_layers="model.num_layers_in_first_pipeline_stage",
    last_layers="model.num_layers_in_last_pipeline_stage",
)
MEGATRON_LM = Dialect(
    MEGATRON,
    tp="model_parallel.tensor_model_parallel_size",
    pp="model_parallel.pipeline_model_parallel_size",
    vp="model_parallel.virtual_pipeline_model_parallel_size",
    cp="model_parallel.context_parallel_size",
    sp="model_parallel.sequence_parallel",
    micro="micro_batch_size",
    global_batch="global_batch_size",
    seq_len="seq_length",
    layers="language_model.num_layers",
    heads="language_model.num_attention_heads",
    groups="language_model.num_query_groups",
    fp8="language_model.fp8",
    fp8_params="language_model.fp8_param_gather",  # --fp8-param-gather: the model built under fp8_model_init
    optimizer="optimizer",
    recompute="language_model.recompute_granularity",
    tp_overlap="model_parallel.tp_comm_overlap",
    ep="model_parallel.expert_model_parallel_size",
    etp="model_parallel.expert_tensor_parallel_size",
    split_embedding="language_model.account_for_embedding_in_pipeline_split",
    split_loss="language_model.account_for_loss_in_pipeline_split",
    first_layers="language_model.num_layers_in_first_pipeline_stage",  # argparse: --decoder-first-pipeline-num-layers
    last_layers="language_model.num_layers_in_last_pipeline_stage",
    tokenizer=("tokenizer_type", "HuggingFaceTokenizer", "tokenizer_model"),  # the model a HF tokenizer names
    hidden="language_model.hidden_size",
    ffn="language_model.ffn_hidden_size",
    experts="language_model.num_moe_experts",
)
MEGATRON_FIXED_FLAGS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
