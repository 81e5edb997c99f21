"""NeMo 1.x YAML and Megatron-LM YAML read as a tunecost job: the model-parallel layout, each default named, each
error one line naming the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigJob
from tunecost.workload.frameworks.model_parallel import catalog_shape
from tunecost.workload.frameworks.nemo import FRAMEWORKS
from tunecost.workload.frameworks.registry import frameworks, read_config
from tunecost.workload.parallel import ParallelPlan

MLPERF = Path(__file__).parents[2] / "fixtures" / "configs" / "mlperf_llama2_70b_lora_nemo.yaml"

# megatron_gpt_config.yaml's shape: pre-training with the architecture in the file
PRETRAIN = """\
trainer:
  devices: 8
  num_nodes: 4
  precision: bf16
model:
  mcore_gpt: true
  micro_batch_size: 1
  global_batch_size: 64
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 4
  virtual_pipeline_model_parallel_size: 2
  context_parallel_size: 1
  sequence_parallel: true
  encoder_seq_length: 4096
  num_layers: 32
  num_attention_heads: 32
  num_query_groups: 8
  activations_checkpoint_granularity: full
  optim:
    name: distributed_fused_adam
    lr: 3.0e-4
"""

# megatron/training/yaml_arguments.py's sections (examples/gpt3/gpt_config.yaml before c59c4ea3)
MEGATRON_YAML = """\
language_model:
  num_layers: 24
  num_attention_heads: 16
  num_query_groups: null
  recompute_granularity: selective
model_parallel:
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
  context_parallel_size: 1
  sequence_parallel: true
  bf16: true
micro_batch_size: 2
global_batch_size: 128
seq_length: 4096
optimizer: adam
"""


def _read(tmp_path: Path, text: str) -> ConfigJob:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return read_config(path)


def _plan(job: ConfigJob) -> ParallelPlan:
    names: tuple[str, ...] = ("num_gpus", "gpus_per_node", "strategy", "tp", "pp", "cp", "sequence_parallel", "tp_impl")
    names += ("tp_comm_overlap",)
    names += ("micro_batches", "pipeline_schedule", "virtual_stages")
    return ParallelPlan(**{k: job.options[k] for k in names if k in job.options})


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(TunecostError) as err:
        _read(tmp_path, text)
    message = str(err.value)
    assert message.startswith(str(tmp_path / "config.yaml")) and "\n" not in message
    return message


def test_mlperf_llama2_70b_lora(tmp_path: Path) -> None:
    job = read_config(MLPERF)
    assert job.framework == "nemo"
    o = job.options
    assert (o["method"], o["lora_rank"], o["lora_alpha"], o["lora_targets"]) == ("lora", 16, 32, "attention")
    assert (o["dtype"], o["optimizer"], o["batch_size"], o["seq_len"]) == ("bf16", "adamw", 1, 8192)
    assert o["gradient_checkpointing"] is False and "model" not in o
    plan = _plan(job)
    assert (plan.num_gpus, plan.tp, plan.dp, plan.sequence_parallel, plan.strategy) == (8, 4, 2, True, "ddp")
    assert plan.tp_impl == "megatron"  # Megatron Core's layers: SP keeps the projections' inputs sharded
    shape = catalog_shape("meta-llama/Llama-2-70b-hf")  # the model it restores (/ckpt)
    plan.check_model(
        num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, num_layers=shape.num_layers, seq_len=8192
    )
    # global 8 / (micro 1 x data-parallel 2): 4 micro-batches accumulated (no pipeline)
    assert o["grad_accum"] == 4 and any(
        a.startswith("grad_accum 4: model.global_batch_size 8") for a in job.assumptions
    )
    assert any(a.startswith("model.fp8 True (fp8_hybrid True)") for a in job.assumptions)
    assert o["fp8"] == "te-delayed" and o["fp8_params"] is True  # model.fp8_params: TE's FP8 primary weights
    assert plan.tp_comm_overlap  # model.ub_tp_comm_overlap: TE's userbuffers
    assert "model.megatron_amp_O2" in job.not_modelled and "model.fp8_params" not in job.not_modelled


def test_pretraining_pipeline(tmp_path: Path) -> None:
    job = _read(tmp_path, PRETRAIN)
    plan = _plan(job)
    assert (plan.num_gpus, plan.tp, plan.pp, plan.cp, plan.dp) == (32, 2, 4, 1, 4)
    assert (plan.pipeline_schedule, plan.virtual_stages, plan.num_micro_batches) == ("interleaved-1f1b", 2, 16)
    assert (job.options["strategy"], job.options["gradient_checkpointing"]) == ("zero1", True)  # distributed optimizer
    assert job.options["method"] == "full" and job.options["gpus_per_node"] == 8
    assert any(a.startswith("dtype bf16: NeMo's fp32 main parameters") for a in job.assumptions)


def test_a_single_node_file_leaves_the_node_size_unsaid(tmp_path: Path) -> None:
    """trainer.devices of one node is the GPUs the run uses, not the node's size: `--gpus auto` on that file
    searches TP and CP within whole nodes (NeMo's Qwen2 config, devices 1, was searched as 1-GPU nodes: no TP, its
    CP groups over InfiniBand); several nodes or more than a default node state it."""
    one = _read(tmp_path, PRETRAIN.replace("num_nodes: 4", "num_nodes: 1"))
    assert one.options["num_gpus"] == 8 and "gpus_per_node" not in one.options
    big = _read(tmp_path, PRETRAIN.replace("num_nodes: 4", "num_nodes: 1").replace("devices: 8", "devices: 16"))
    assert (big.options["num_gpus"], big.options["gpus_per_node"]) == (16, 16)


def test_pretraining_defaults(tmp_path: Path) -> None:
    job = _read(tmp_path, "trainer:\n  accelerator: gpu\nmodel:\n  mcore_gpt: true\n")
    o = job.options
    assert (o["num_gpus"], o["dtype"], o["batch_size"], o["seq_len"], o["strategy"]) == (1, "bf16", 4, 512, "ddp")
    # Megatron Core's DDP at one rank too: the file's one device, or --gpus 8 in its place, each a valid layout
    assert _plan(job).dp == 1 and _plan(dataclasses.replace(job, options={**o, "num_gpus": 8})).dp == 8
    for start in (
        "trainer.devices 1",
        "trainer.precision bf16",
        "model.micro_batch_size 4",
        "model.global_batch_size 8",
    ):
        assert any(a.startswith(start) and "NeMo's default" in a for a in job.assumptions), start
    assert any(a.startswith("model.encoder_seq_length 512") for a in job.assumptions)
    assert any(a.startswith("model.optim.name fused_adam") for a in job.assumptions)


def test_finetuning_defaults(tmp_path: Path) -> None:
    job = _read(tmp_path, "trainer:\n  devices: '2'\nmodel:\n  micro_batch_size: 4\n  peft:\n    peft_scheme: lora\n")
    o = job.options
    # target_modules [attention_qkv]: the fused q, k, v projection, not the output projection
    assert (o["method"], o["lora_rank"], o["lora_alpha"], o["lora_targets"]) == ("lora", 32, 32, "q_proj,k_proj,v_proj")
    assert (o["dtype"], o["seq_len"], o["strategy"]) == ("fp16", 2048, "ddp")  # precision 16, max_seq_length 2048
    assert any("fused linear_qkv and linear_fc1 take one adapter each" in a for a in job.assumptions)
    assert any(a.startswith("model.global_batch_size 128: NeMo's fine-tuning default") for a in job.assumptions)


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        (
            "num_query_groups: 8",
            "num_query_groups: 3",
            "model.tensor_model_parallel_size 2 does not divide the model's 3",
        ),
        ("num_layers: 32", "num_layers: 28", "model.pipeline_model_parallel_size 4 x 2 virtual stages"),
        ("devices: 8", "devices: 5", "= 8 does not divide the 20 GPUs"),
        ("global_batch_size: 64", "global_batch_size: 62", "model.global_batch_size: 62 is not a multiple"),
        ("global_batch_size: 64", "global_batch_size: 8", "(2) a multiple of model.pipeline_model_parallel_size 4"),
        ("encoder_seq_length: 4096", "encoder_seq_length: 4095", "(model.tensor_model_parallel_size) 2 does not"),
        ("precision: bf16", "precision: 64", "trainer.precision: '64'"),
        ("name: distributed_fused_adam", "name: lamb", "model.optim.name: 'lamb'"),
        ("granularity: full", "granularity: some", "model.activations_checkpoint_granularity: 'some'"),
        ("micro_batch_size: 1", "micro_batch_size: ${oc.env:MBS,1}", "model.micro_batch_size: ${oc.env:MBS,1}"),
        ("context_parallel_size: 1", "context_parallel_size: 0", "model.context_parallel_size: must be at least 1"),
        # megatron_llama_distill.yaml leaves the teacher's path null, for its command line to give
        ("mcore_gpt: true", "mcore_gpt: true\n  kd_teacher_restore_from_path: null", "knowledge distillation"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, old: str, new: str, named: str) -> None:
    assert old in PRETRAIN
    assert named in _error(tmp_path, PRETRAIN.replace(old, new))


def test_peft_schemes(tmp_path: Path) -> None:
    text = "trainer:\n  devices: 1\nmodel:\n  peft:\n    peft_scheme: {}\n"
    assert _read(tmp_path, text.format("none")).options["method"] == "full"
    assert "model.peft.peft_scheme: 'ia3'" in _error(tmp_path, text.format("ia3"))
    assert "model.peft.peft_scheme: 'adapter'" in _error(tmp_path, text.format("null"))  # NeMo's default: adapter
    bad = text.format("lora") + "    lora_tuning:\n      target_modules: [lm_head]\n"
    assert "model.peft.lora_tuning.target_modules: " in _error(tmp_path, bad)


def test_an_interpolation_of_another_key_is_that_keys_value(tmp_path: Path) -> None:
    """NeMo's shipped fine-tuning config writes alpha: ${model.peft.lora_tuning.adapter_dim}: read as 32 here, the
    key it names counted as read; a chain resolves, a cycle and a resolver stay errors naming the key."""
    text = "trainer:\n  devices: 1\nmodel:\n  encoder_seq_length: 2048\n  peft:\n    peft_scheme: lora\n"
    text += "    lora_tuning:\n      adapter_dim: 32\n      alpha: ${model.peft.lora_tuning.adapter_dim}\n"
    job = _read(tmp_path, text)
    assert (job.options["lora_rank"], job.options["lora_alpha"]) == (32, 32)
    chain = text.replace("adapter_dim: 32", "adapter_dim: ${model.width}") + "  width: 32\n"
    assert _read(tmp_path, chain).options["lora_alpha"] == 32
    cycle = text.replace("adapter_dim: 32", "adapter_dim: ${model.peft.lora_tuning.alpha}")
    assert "an OmegaConf interpolation" in _error(tmp_path, cycle)
    assert "model.peft.lora_tuning.alpha: ${oc.env:A,8}" in _error(
        tmp_path, text.replace("${model.peft.lora_tuning.adapter_dim}", "${oc.env:A,8}")
    )


def test_megatron_lm_yaml(tmp_path: Path) -> None:
    job = _read(tmp_path, MEGATRON_YAML)
    o = job.options
    assert (o["tp"], o["pp"], o["sequence_parallel"], o["dtype"], o["batch_size"], o["seq_len"]) == (
        2,
        2,
        True,
        "bf16",
        2,
        4096,
    )
    assert o["gradient_checkpointing"] is False and "num_gpus" not in o and o["method"] == "full"
    assert o["strategy"] == "ddp"  # no distributed optimizer: Megatron Core's DDP, whatever the GPU count
    assert o["selective_recompute"] is True  # recompute_granularity: selective (the core attention)
    assert any("world size comes from the launcher" in a for a in job.assumptions)
    flags = "tensor_model_parallel_size: 4\nmicro_batch_size: 1\nseq_length: 2048\nbf16: true\n"
    flags += "use_distributed_optimizer: true\n"  # Megatron-LM's argparse flags as top-level keys
    job = _read(tmp_path, flags)
    assert (job.options["tp"], job.options["dtype"], job.options["strategy"]) == (4, "bf16", "zero1")
    assert job.options["sequence_parallel"] is False  # Megatron-LM's default, stated: the CLI's default is on
    job = _read(tmp_path, flags + "fp8: hybrid\nfp8_param_gather: true\n")  # --fp8-param-gather: fp8_model_init
    assert (job.options["fp8"], job.options["fp8_params"]) == ("te-delayed", True)
    assert "fp8_param_gather" not in job.not_modelled
    assert "micro_batch_size: missing" in _error(tmp_path, MEGATRON_YAML.replace("micro_batch_size: 2\n", ""))


def test_detect_is_false_for_other_frameworks() -> None:
    others: list[dict[str, Any]] = [
        {"model_name_or_path": "meta-llama/Llama-3.1-8B", "stage": "sft", "finetuning_type": "full"},  # LLaMA-Factory
        {"base_model": "NousResearch/Llama-3.2-1B", "adapter": "qlora", "micro_batch_size": 2},  # axolotl
        {"model": {"_component_": "torchtune.models.llama3_1.llama3_1_8b"}, "batch_size": 2},  # torchtune
        {"checkpoint_dir": "checkpoints/meta-llama/Llama-2-7b-hf", "train": {"micro_batch_size": 2}},  # litgpt
        {"model": {"name": "llama3", "flavor": "8B"}, "parallelism": {"tensor_parallel_degree": 2}},  # torchtitan
    ]
    assert not any(f.detect(d) for f in FRAMEWORKS for d in others)
    nemo = {"trainer": {"devices": 8}, "model": {"tensor_model_parallel_size": 2}}
    assert [f.name for f in frameworks() if f.detect(nemo)] == ["nemo"]
    megatron = {"model_parallel": {"tensor_model_parallel_size": 2}, "micro_batch_size": 1}
    assert [f.name for f in frameworks() if f.detect(megatron)] == ["megatron-lm"]


def test_mlperf_reference_is_accelerate_deepspeed() -> None:
    """The mlcommons reference of the same benchmark: accelerate + DeepSpeed ZeRO-3 on one node of 8 GPUs."""
    job = read_config(MLPERF.with_name("mlperf_llama2_70b_lora_accelerate.yaml"))
    assert job.framework == "accelerate"
    assert job.options == {"num_gpus": 8, "dtype": "bf16", "strategy": "zero3"}  # one node: its size unsaid


def test_block_recomputation_counts_the_layers_of_each_model_chunk(tmp_path: Path) -> None:
    """activations_checkpoint_method block, num_layers N: the first N layers of each pipeline stage's model chunk
    recompute (Megatron Core's TransformerBlock); uniform recomputes every layer."""
    block = PRETRAIN.replace(
        "activations_checkpoint_granularity: full",
        "activations_checkpoint_granularity: full\n  activations_checkpoint_method: block\n"
        "  activations_checkpoint_num_layers: 2",
    )
    job = _read(tmp_path, block)  # pp 4 x 2 virtual stages: 8 model chunks of 4 layers
    assert job.options["gradient_checkpointing"] and job.options["recompute_layers"] == 16
    assert any("block" in a and "8 model chunks" in a for a in job.assumptions)
    uniform = _read(tmp_path, block.replace("method: block", "method: uniform"))
    assert "recompute_layers" not in uniform.options
    assert any("modelled as each layer recomputed alone" in a for a in uniform.assumptions)
    assert "model.activations_checkpoint_num_layers" not in job.not_modelled
    assert "model.activations_checkpoint_method: 'blocks': uniform or block" in _error(
        tmp_path, block.replace("method: block", "method: blocks")
    )
    megatron = MEGATRON_YAML.replace(
        "recompute_granularity: selective",
        "recompute_granularity: full\n  recompute_method: block\n  recompute_num_layers: 3",
    )
    assert _read(tmp_path, megatron).options["recompute_layers"] == 6  # pp 2, no virtual stages


@pytest.mark.parametrize(
    "keys", [(), ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")]
)
def test_the_embedding_and_loss_in_the_pipeline_split(tmp_path: Path, keys: tuple[str, ...]) -> None:
    """Llama-3.1-405B's 126 layers over 4 x 2 stages: Megatron Core deals them only where the config counts the
    embedding and the loss as layers of the split (NeMo's 405B recipe); otherwise the stages must divide them."""
    text = PRETRAIN.replace("num_layers: 32", "num_layers: 126")
    text = text.replace("  mcore_gpt: true\n", "  mcore_gpt: true\n" + "".join(f"  {k}: true\n" for k in keys))
    if not keys:
        assert "model.pipeline_model_parallel_size 4 x 2 virtual stages" in _error(tmp_path, text)
        return
    job = _read(tmp_path, text)
    assert _plan(job).pp == 4
    assert any(
        a.startswith("model.account_for_embedding_in_pipeline_split and model.account_for_loss")
        for a in job.assumptions
    )
    assert "model.account_for_loss_in_pipeline_split" not in job.not_modelled


def test_megatron_lm_reads_the_split_among_its_transformer_keys(tmp_path: Path) -> None:
    text = MEGATRON_YAML.replace("num_layers: 24", "num_layers: 23\n  account_for_loss_in_pipeline_split: true")
    job = _read(tmp_path, text)
    said = "language_model.account_for_loss_in_pipeline_split: the decoder layers"
    assert any(a.startswith(said) for a in job.assumptions)
    assert (job.options["first_stage_less_layers"], job.options["last_stage_less_layers"]) == (0, 1)
    assert "does not divide the model's 23" in _error(
        tmp_path, MEGATRON_YAML.replace("num_layers: 24", "num_layers: 23")
    )


def test_megatrons_first_and_last_stage_layers(tmp_path: Path) -> None:
    """num_layers_in_first/last_pipeline_stage: the given stages hold their layers, the others divide the rest
    (Megatron Core), read from NeMo's model section and Megatron-LM's argparse names; refused beside the
    account_for keys and with a virtual pipeline, and where the other stages cannot divide the rest."""
    text = PRETRAIN.replace("  virtual_pipeline_model_parallel_size: 2\n", "")
    nemo = text.replace("  mcore_gpt: true\n", "  mcore_gpt: true\n  num_layers_in_first_pipeline_stage: 5\n")
    nemo = nemo.replace("  mcore_gpt: true\n", "  mcore_gpt: true\n  num_layers_in_last_pipeline_stage: 9\n")
    job = _read(tmp_path, nemo)
    assert (job.options["first_stage_layers"], job.options["last_stage_layers"]) == (5, 9)
    assert any("5 layers on the first stage and 9 layers on the last stage" in a for a in job.assumptions)
    assert "model.num_layers_in_first_pipeline_stage" not in job.not_modelled
    uneven = nemo.replace("num_layers_in_last_pipeline_stage: 9", "num_layers_in_last_pipeline_stage: 8")
    assert "model.num_layers_in_first_pipeline_stage 5 and model.num_layers_in_last_pipeline_stage 8 leave 19" in (
        _error(tmp_path, uneven)
    )
    both = nemo.replace("  mcore_gpt: true\n", "  mcore_gpt: true\n  account_for_loss_in_pipeline_split: true\n")
    assert "Megatron refuses it beside model.account_for_loss_in_pipeline_split" in _error(tmp_path, both)
    assert "no virtual stages" in _error(tmp_path, nemo.replace("mcore_gpt: true", "mcore_gpt: true\n  "
                                                                "virtual_pipeline_model_parallel_size: 2"))  # fmt: skip
    megatron = MEGATRON_YAML + "decoder_first_pipeline_num_layers: 10\n"
    assert _read(tmp_path, megatron).options["first_stage_layers"] == 10


def test_expert_parallelism_over_the_data_parallel_ranks(tmp_path: Path) -> None:
    """model.expert_model_parallel_size: the experts split over the data-parallel ranks (32 GPUs / tp 2 x pp 4 =
    4), each expert split as TP (expert_tensor_parallel_size: TP's by default); other splits are one error."""
    text = PRETRAIN.replace("  mcore_gpt: true\n", "  mcore_gpt: true\n  expert_model_parallel_size: 4\n")
    assert _read(tmp_path, text).options["expert_parallel"] == 4
    assert "expert_model_parallel_size: 8 does not divide the 4 data-parallel ranks" in _error(
        tmp_path, text.replace("expert_model_parallel_size: 4", "expert_model_parallel_size: 8")
    )
    etp = text.replace(
        "expert_model_parallel_size: 4", "expert_model_parallel_size: 4\n  expert_tensor_parallel_size: 1"
    )
    assert "model.expert_tensor_parallel_size: expert tensor parallelism 1 beside tensor parallelism 2" in _error(
        tmp_path, etp
    )


def test_the_model_is_the_hugging_face_tokenizers_else_the_one_catalog_model_of_the_architecture(
    tmp_path: Path,
) -> None:
    """Megatron-LM's HuggingFaceTokenizer names the model where its architecture is the file's; else the catalog's
    one model of the architecture keys is the job's; several or none are named, the model left to --model."""
    llama = MEGATRON_YAML.replace("  num_layers: 24\n  num_attention_heads: 16\n  num_query_groups: null\n", "")
    llama = llama.replace(
        "language_model:\n",
        "language_model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n  num_query_groups: 8\n"
        "  ffn_hidden_size: 14336\n",
    )
    hf = "tokenizer_type: HuggingFaceTokenizer\ntokenizer_model: meta-llama/Meta-Llama-3-8B\n"
    job = _read(tmp_path, llama + hf)
    assert job.options["model"] == "meta-llama/Meta-Llama-3-8B" and "tokenizer_model" not in job.not_modelled
    assert "model meta-llama/Meta-Llama-3-8B: the file's tokenizer_model meta-llama/Meta-Llama-3-8B" in job.assumptions
    several = _read(tmp_path, llama)  # Llama-3-8B and Mistral-7B differ in their vocabulary only
    assert "model" not in several.options
    (note,) = [a for a in several.assumptions if a.startswith("model: the file's architecture")]
    assert "meta-llama/Llama-3.1-8B" in note and "mistralai/Mistral-7B-v0.1" in note and "(give --model)" in note
    mixtral = _read(
        tmp_path, llama.replace("  ffn_hidden_size: 14336\n", "  ffn_hidden_size: 14336\n  num_moe_experts: 8\n") + hf
    )
    assert mixtral.options["model"] == "mistralai/Mixtral-8x7B-v0.1"  # the tokenizer's model is dense: not this one
    assert any(
        a.startswith("model mistralai/Mixtral-8x7B-v0.1: the catalog's one model of") for a in mixtral.assumptions
    )
    flag = _read(tmp_path, llama + hf + "num_experts: 8\n")  # Megatron-LM's argparse name (--num-experts)
    assert flag.options["model"] == "mistralai/Mixtral-8x7B-v0.1"
    tiny = _read(
        tmp_path, MEGATRON_YAML.replace("  num_attention_heads: 16\n", "  num_attention_heads: 16\n  hidden_size: 64\n")
    )
    assert "model" not in tiny.options and any("is no catalog model's (give --model)" in a for a in tiny.assumptions)
    # no ffn_hidden_size: Megatron-LM's own, 4 x hidden or 2/3 of it (to 64) under SwiGLU; not Qwen1.5-0.5B's 2816
    qwen = MEGATRON_YAML.replace("  num_attention_heads: 16\n", "  num_attention_heads: 16\n  hidden_size: 1024\n")
    for extra, ffn in (("", 4096), ("swiglu: true\n", 2688)):
        job = _read(tmp_path, qwen + extra)
        assert "model" not in job.options and any(f"FFN {ffn}) is no catalog" in a for a in job.assumptions)


def test_megatron_cores_local_spec_keeps_the_attention_scores(tmp_path: Path) -> None:
    """Megatron-LM's transformer_impl local and NeMo's transformer_engine false build Megatron Core's local layer
    spec, whose DotProductAttention keeps the scores (eager); the default, Transformer Engine, is fused (flash)."""
    assert _read(tmp_path, MEGATRON_YAML).options["attention"] == "flash"
    local = _read(tmp_path, MEGATRON_YAML + "transformer_impl: local\n")
    assert local.options["attention"] == "eager" and "transformer_impl" not in local.not_modelled
    line = "attention eager: transformer_impl local: Megatron Core's DotProductAttention keeps the attention scores"
    assert line in local.assumptions
    te = PRETRAIN.replace("  mcore_gpt: true\n", "  mcore_gpt: true\n  transformer_engine: true\n")
    assert _read(tmp_path, te).options["attention"] == "flash"
    unset = _read(tmp_path, PRETRAIN)  # NeMo's cfg.get('transformer_engine', False): the local spec
    assert (
        unset.options["attention"] == "eager" and "model.transformer_engine False: NeMo's default" in unset.assumptions
    )
    # a fine-tuning run builds the model its checkpoint's config describes: unset, Transformer Engine assumed
    lora = PRETRAIN.replace("  mcore_gpt: true\n", "  mcore_gpt: true\n  peft:\n    peft_scheme: lora\n")
    assert _read(tmp_path, lora).options["attention"] == "flash"


def test_omegaconfs_mandatory_value_is_unset_and_said(tmp_path: Path) -> None:
    """NeMo's shipped fine-tuning config leaves `file_names: ???` to its command line: read as unset, said."""
    job = _read(tmp_path, PRETRAIN.replace("  micro_batch_size: 1\n", "  micro_batch_size: ???\n"))
    assert job.options["batch_size"] == 4  # NeMo's default, as if the key were absent
    assert "model.micro_batch_size ???: given on NeMo's command line, not in the file" in job.assumptions
