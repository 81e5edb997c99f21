"""The LLaMA-Factory recipe: its training YAML, a DeepSpeed JSON for ZeRO, launch.sh."""

from __future__ import annotations

from typing import Any

from tunecost.estimate.recipes.accelerate import _accelerate_config, _accelerate_launch, _ds_config
from tunecost.estimate.recipes.common import (
    FSDP_STRATEGIES,
    HF_OPTIM,
    MASTER_PORT,
    MAX_GRAD_NORM,
    PEFT_MODULES,
    ZERO_STAGES,
    LaunchJob,
    _cannot,
    _cmd,
    _json,
    _nodes_note,
    _Raw,
    _script,
    _summary,
    _yaml,
)
from tunecost.workload.job import fp32_strategies

LLAMAFACTORY_ATTENTION = {"flash": "fa2", "sdpa": "sdpa", "eager": "disabled"}  # extras/constants.py AttentionFunction
# the keys the plan decides: a user's own YAML (`LaunchJob.base`) keeps every other key (data, template, schedule)
PLANNED_KEYS = frozenset(
    (
        "model_name_or_path",
        "stage",
        "do_train",
        "finetuning_type",
        "lora_rank",
        "lora_alpha",
        "lora_dropout",
        "lora_target",
        "quantization_bit",
        "quantization_method",
        "quantization_type",
        "double_quantization",
        "cutoff_len",
        "packing",
        "neat_packing",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "num_train_epochs",
        "max_steps",
        "bf16",
        "fp16",
        "pure_bf16",
        "flash_attn",
        "optim",
        "disable_gradient_checkpointing",
        "torch_compile",
        "enable_liger_kernel",
        "use_unsloth",
        "fp8",
        "fp8_backend",
        "deepspeed",
    )
)


def _pure_bf16(job: LaunchJob) -> dict[str, Any]:
    """model/adapter.py upcasts a full fine-tune's parameters to fp32 off DeepSpeed: `pure_bf16` (bf16 off, no
    autocast) keeps the bf16 parameters priced; fp32 parameters are its default."""
    if job.method != "full" or job.fp32_params or job.dtype == "fp32" or job.strategy not in fp32_strategies("full"):
        return {}
    if job.dtype == "fp16":
        raise _cannot("llamafactory", "fp16 parameters of a full fine-tune: it upcasts them to fp32 off DeepSpeed "
                      "(pure_bf16 is bf16 only); plan with --fp32-params or --dtype bf16")  # fmt: skip
    return {"bf16": False, "pure_bf16": True}


def _llamafactory(job: LaunchJob) -> dict[str, str]:
    """LLaMA-Factory's training YAML (hparams/*_args.py); FSDP through accelerate (examples/accelerate/)."""
    if job.method != "full" and set(job.targets) - set(PEFT_MODULES):
        raise _cannot(
            "llamafactory", "lora_target names Linear modules; transformers 5's MoE experts and routers are not"
        )
    if job.method != "full" and job.alpha != int(job.alpha):
        raise _cannot("llamafactory", f"lora_alpha is an integer there, not {job.alpha:g}")
    kept = {k: v for k, v in job.base.items() if k not in PLANNED_KEYS}
    lf: dict[str, Any] = {"model_name_or_path": job.model, "stage": "sft", "do_train": True}
    lf["finetuning_type"] = "full" if job.method == "full" else "lora"
    if job.method != "full":
        names = [m for t in job.targets for m in PEFT_MODULES[t]]
        lf |= {"lora_rank": job.rank, "lora_alpha": int(job.alpha), "lora_dropout": job.lora_dropout}
        lf["lora_target"] = "all" if set(job.targets) == {"attention", "mlp"} else ",".join(names)
    if job.method == "qlora" and job.quant_type == "int8":
        lf |= {"quantization_bit": 8, "quantization_method": "bnb"}
    elif job.method == "qlora":
        lf |= {"quantization_bit": 4, "quantization_method": "bnb", "quantization_type": job.quant_type}
        lf["double_quantization"] = job.double_quant
    lf |= {"dataset": job.dataset or kept.pop("dataset", "CHANGE_ME"), "cutoff_len": job.seq_len}
    lf["output_dir"] = kept.pop("output_dir", "output")
    if job.packing != "none":  # neat_packing keeps each example's attention to itself (and implies packing)
        lf["neat_packing" if job.packing == "per-document" else "packing"] = True
    lf |= {"per_device_train_batch_size": job.micro_batch, "gradient_accumulation_steps": job.grad_accum}
    lf |= {"num_train_epochs": job.epochs, "bf16": job.dtype == "bf16", "fp16": job.dtype == "fp16"}
    lf |= _pure_bf16(job)
    lf |= {"max_steps": job.max_steps} if job.max_steps else {}  # the Trainer's max_steps ends the run first
    optim = "adamw_torch_fused" if job.optimizer == "adamw" and job.fused_adamw else HF_OPTIM[job.optimizer]
    lf |= {"flash_attn": LLAMAFACTORY_ATTENTION[job.attention], "optim": optim}
    lf |= {"disable_gradient_checkpointing": not job.gradient_checkpointing, "max_grad_norm": MAX_GRAD_NORM}
    lf |= {"logging_steps": 10, "report_to": "none"} | ({"torch_compile": True} if job.torch_compile else {})
    lf |= kept  # the user's own keys: data, template, learning rate, logging (over the defaults written here)
    lf |= {"enable_liger_kernel": True} if job.liger_kernel else {}
    if job.fp8 == "tensorwise":  # train/fp8_utils.py builds torchao's rowwise recipe, or Transformer Engine's
        raise _cannot("llamafactory", "FP8 tensorwise; LLaMA-Factory's torchao recipe is rowwise")
    if job.fp8 != "none":
        lf |= {"fp8": True, "fp8_backend": "torchao" if job.fp8 == "rowwise" else "te"}
    files: dict[str, str] = {}
    if job.strategy in ZERO_STAGES:
        lf["deepspeed"] = "ds_config.json"
        files["ds_config.json"] = _json(_ds_config(job, "llamafactory"))
    notes = [_summary(job), "dataset: a name in dataset_dir/dataset_info.json (LLaMA-Factory's data/ folder)"]
    if job.base:
        replaced = ", ".join(sorted(PLANNED_KEYS & job.base.keys())) or "none"
        notes.append(f"from {job.base_path}: its keys, the plan's in place of {replaced}")
    files["llamafactory.yaml"] = _yaml(lf, notes)
    if job.strategy in FSDP_STRATEGIES:  # LLaMA-Factory checkpoints activations itself (disable_gradient_checkpointing)
        files["accelerate_config.yaml"] = _yaml(_accelerate_config(job, fsdp_checkpointing=False), [_summary(job)])
        command = _accelerate_launch(job, "-m", "llamafactory.launcher", "llamafactory.yaml")
    elif job.num_gpus == 1:
        one_gpu = _Raw('CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"')  # else it runs torchrun on every GPU
        command = _cmd([one_gpu, "llamafactory-cli", "train", "llamafactory.yaml"])
    else:  # llamafactory-cli runs torchrun with these (launcher.py)
        env = [_Raw("FORCE_TORCHRUN=1"), _Raw(f"NNODES={job.num_nodes}"), _Raw(f"NPROC_PER_NODE={job.gpus_on_node}")]
        env += [_Raw('NODE_RANK="${NODE_RANK:-0}"'), _Raw('MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"')]
        env += [_Raw(f'MASTER_PORT="${{MASTER_PORT:-{MASTER_PORT}}}"')]
        command = _cmd(env, ["llamafactory-cli", "train", "llamafactory.yaml"])
    files["launch.sh"] = _script([_summary(job), *_nodes_note(job)], command)
    return files
