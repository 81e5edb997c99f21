"""The accelerate recipe: accelerate config, DeepSpeed JSON, the Trainer's LoRA and 4-bit fields, launch.sh."""

from __future__ import annotations

from typing import Any

from tunecost.estimate.recipes.common import (
    FSDP_STRATEGIES,
    HF_ATTENTION,
    HF_OPTIM,
    MASTER_PORT,
    MAX_GRAD_NORM,
    PEFT_MODULES,
    PEFT_PARAMETERS,
    TORCH_DTYPES,
    ZERO_STAGES,
    LaunchJob,
    _cannot,
    _cmd,
    _env,
    _json,
    _nodes_note,
    _script,
    _summary,
    _yaml,
)
from tunecost.workload.job import LOW_BIT_ADAMW


def _peft_targets(job: LaunchJob) -> dict[str, Any]:
    """LoraConfig's target_modules / target_parameters: "all-linear" (every Linear but the output) for attention+MLP."""
    if set(job.targets) == {"attention", "mlp"}:
        return {"target_modules": "all-linear"}
    out: dict[str, Any] = {"target_modules": [m for t in job.targets for m in PEFT_MODULES.get(t, ())]}
    parameters = [p for t in job.targets for p in PEFT_PARAMETERS.get(t, ())]
    return out | ({"target_parameters": parameters} if parameters else {})


def _ds_config(job: LaunchJob, target: str) -> dict[str, Any]:
    """DeepSpeed's JSON: concrete batch sizes (DeepSpeed checks train_batch_size = micro x accum x world size; the HF
    Trainer checks them against its arguments) and ZeRO-Offload to the CPU as tunecost models it."""
    stage = ZERO_STAGES[job.strategy]
    zero: dict[str, Any] = {"stage": stage}
    if job.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if job.offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": job.micro_batch,
        "gradient_accumulation_steps": job.grad_accum,
        "gradient_clipping": MAX_GRAD_NORM,
        "bf16": {"enabled": job.dtype == "bf16"},
        "fp16": {"enabled": job.dtype == "fp16"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # the client's optimizer (bitsandbytes 8-bit, SGD) under ZeRO
    }
    if job.offload != "none" and job.optimizer in LOW_BIT_ADAMW:
        raise _cannot(target, "ZeRO-Offload steps the optimizer on the CPU; the low-bit AdamWs run on the GPU")
    if job.offload != "none" and job.optimizer == "adamw":  # DeepSpeed's CPU Adam; "auto": from the Trainer's args
        config["optimizer"] = {"type": "AdamW", "params": dict.fromkeys(("lr", "betas", "eps", "weight_decay"), "auto")}
    elif job.offload != "none":
        config["zero_force_ds_cpu_optimizer"] = False  # torch's SGD steps on the offloaded CPU tensors
    return config


def _accelerate_config(job: LaunchJob, *, fsdp_checkpointing: bool) -> dict[str, Any]:
    """accelerate's config file (commands/config/config_args.py ClusterConfig; fsdp_config as `accelerate config`
    writes it, commands/config/cluster.py)."""
    kind = "FSDP" if job.strategy in FSDP_STRATEGIES else "DEEPSPEED" if job.strategy in ZERO_STAGES else "MULTI_GPU"
    config: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    config["distributed_type"] = "NO" if kind == "MULTI_GPU" and job.num_gpus == 1 else kind  # single, 1-GPU ddp
    if kind != "DEEPSPEED":  # with deepspeed_config_file accelerate refuses a mixed_precision of its own
        config["mixed_precision"] = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[job.dtype]
    config |= {"num_machines": job.num_nodes, "num_processes": job.num_gpus, "machine_rank": 0}
    config |= {"main_training_function": "main", "rdzv_backend": "static", "same_network": False, "use_cpu": False}
    if job.num_nodes > 1:
        config["main_process_port"] = MASTER_PORT  # main_process_ip and machine_rank: given per node by launch.sh
    if kind == "DEEPSPEED":
        ds = {"deepspeed_config_file": "ds_config.json", "zero3_init_flag": job.strategy == "zero3"}
        config["deepspeed_config"] = ds | ({"deepspeed_multinode_launcher": "standard"} if job.num_nodes > 1 else {})
    if kind != "FSDP":
        return config
    version = 1 if job.strategy == "fsdp1" else 2
    fsdp: dict[str, Any] = {"fsdp_version": version, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}
    # FSDP1: the sharding strategy (`accelerate config` writes it as reshard_after_forward, `accelerate launch` reads
    # fsdp_sharding_strategy: both given); FSDP2: whether to reshard after forward (False: SHARD_GRAD_OP)
    fsdp["fsdp_reshard_after_forward"] = "FULL_SHARD" if version == 1 else job.strategy != "fsdp2-shard-grad-op"
    fsdp |= {"fsdp_offload_params": job.offload == "params", "fsdp_cpu_ram_efficient_loading": True}
    fsdp |= {"fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_activation_checkpointing": fsdp_checkpointing}
    if version == 1:  # use_orig_params: frozen base weights and trainable adapters share a wrapped layer
        fsdp |= {"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_sync_module_states": True, "fsdp_use_orig_params": True}
        fsdp |= {"fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": False}
    config["fsdp_config"] = fsdp
    if job.strategy == "hsdp":  # FSDP2 shards within a node and replicates across nodes
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": job.num_nodes,
            "parallelism_config_dp_shard_size": job.gpus_on_node,
        }
    return config


def _accelerate_launch(job: LaunchJob, *script: str) -> str:
    """`accelerate launch` of `script`; on several nodes each node gives its rank and the first node's address."""
    ranks = ["--num_processes", _env("NUM_PROCESSES", job.num_gpus), "--machine_rank", _env("NODE_RANK", 0)]
    main = [
        "--main_process_ip",
        _env("MASTER_ADDR", "127.0.0.1"),
        "--main_process_port",
        _env("MASTER_PORT", MASTER_PORT),
    ]
    nodes = [ranks, main] if job.num_nodes > 1 else []
    return _cmd(["accelerate", "launch", "--config_file", "accelerate_config.yaml"], *nodes, list(script))


def _train_args(job: LaunchJob) -> dict[str, Any]:
    """What the user's train.py builds: from_pretrained kwargs, TrainingArguments, LoraConfig, BitsAndBytesConfig."""
    fsdp = job.strategy in FSDP_STRATEGIES  # FSDP checkpoints itself; the HF Trainer refuses both at once
    training = {"output_dir": "output", "per_device_train_batch_size": job.micro_batch}
    training |= {"gradient_accumulation_steps": job.grad_accum, "num_train_epochs": job.epochs}
    training |= {"max_steps": job.max_steps} if job.max_steps else {}
    training |= {"bf16": job.dtype == "bf16", "fp16": job.dtype == "fp16", "optim": HF_OPTIM[job.optimizer]}
    training |= {"gradient_checkpointing": job.gradient_checkpointing and not fsdp, "max_grad_norm": MAX_GRAD_NORM}
    training |= {"logging_steps": 10, "report_to": "none"} | ({"torch_compile": True} if job.torch_compile else {})
    training |= {"use_liger_kernel": True} if job.liger_kernel else {}
    if job.strategy == "ddp":
        training["ddp_find_unused_parameters"] = False
    load = "float32" if job.fp32_params else TORCH_DTYPES[job.dtype]  # fp32 parameters: bf16 is the autocast's
    out: dict[str, Any] = {"model": {"pretrained_model_name_or_path": job.model, "dtype": load}}
    out["model"]["attn_implementation"] = HF_ATTENTION[job.attention]
    out |= {"max_seq_length": job.seq_len, "dataset": job.dataset or "CHANGE_ME", "training_args": training}
    if job.packing != "none":  # TRL SFTConfig(packing=True, packing_strategy=...): bfd keeps examples apart
        out["packing"] = {"packing": True, "packing_strategy": "bfd" if job.packing == "per-document" else "wrapped"}
    if job.method != "full":
        lora = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": job.rank, "lora_alpha": job.alpha}
        lora["lora_dropout"] = job.lora_dropout
        out["lora_config"] = lora | _peft_targets(job)
    if job.method == "qlora" and job.quant_type == "int8":
        out["quantization_config"] = {"load_in_8bit": True}  # llm_int8_threshold 6.0: transformers' default
    elif job.method == "qlora":
        bnb = {"load_in_4bit": True, "bnb_4bit_quant_type": job.quant_type}
        bnb |= {"bnb_4bit_use_double_quant": job.double_quant, "bnb_4bit_compute_dtype": TORCH_DTYPES[job.dtype]}
        if fsdp or job.strategy == "zero3":  # sharded 4-bit weights need a float storage dtype (FSDP/ZeRO-3 QLoRA)
            bnb["bnb_4bit_quant_storage"] = TORCH_DTYPES[job.dtype]
        out["quantization_config"] = bnb
    return out


def _accelerate(job: LaunchJob) -> dict[str, str]:
    config = _accelerate_config(job, fsdp_checkpointing=job.gradient_checkpointing)
    files = {"accelerate_config.yaml": _yaml(config, [_summary(job)])}
    if job.strategy in ZERO_STAGES:
        files["ds_config.json"] = _json(_ds_config(job, "accelerate"))
    files["train_args.json"] = _json(_train_args(job))
    note = [
        _summary(job),
        "train.py is your own training script (tunecost does not write it): it reads train_args.json:",
        "from_pretrained(**model), TrainingArguments(**training_args), LoraConfig(**lora_config),",
        "BitsAndBytesConfig(**quantization_config), max_seq_length and dataset (and packing: TRL SFTConfig's).",
        *_nodes_note(job),
    ]
    files["launch.sh"] = _script(note, _accelerate_launch(job, "train.py", "train_args.json"))
    return files
