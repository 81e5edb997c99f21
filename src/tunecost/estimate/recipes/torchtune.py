"""The torchtune recipe: a `tune run` line with its key=value overrides, also as YAML."""

from __future__ import annotations

import re
from typing import Any

from tunecost.estimate.recipes.common import (
    MASTER_PORT,
    LaunchJob,
    _cannot,
    _cmd,
    _env,
    _nodes_note,
    _Raw,
    _script,
    _summary,
    _yaml,
)
from tunecost.models.projections import PROJECTIONS
from tunecost.workload.job import LOW_BIT_ADAMW

# torchtune 0.6.1 (its last release): the configs of _recipe_registry.py for the lora/full recipes
TORCHTUNE_CONFIGS = frozenset(
    """
    llama2/7B_full_low_memory llama2/7B_full llama2/13B_full llama2/7B_lora_single_device llama2/7B_qlora_single_device
    llama2/13B_qlora_single_device llama2/7B_lora llama2/13B_lora llama2/70B_lora llama2/7B_qlora llama2/70B_qlora
    llama3/8B_full_single_device llama3/8B_full llama3/70B_full llama3/8B_lora_single_device
    llama3/8B_qlora_single_device llama3/8B_lora llama3/70B_lora llama3_1/8B_full_single_device llama3_1/8B_full
    llama3_1/70B_full llama3_1/8B_lora_single_device llama3_1/8B_qlora_single_device llama3_1/8B_lora
    llama3_1/70B_lora llama3_1/405B_qlora llama3_2/1B_full_single_device llama3_2/3B_full_single_device
    llama3_2/1B_full llama3_2/3B_full llama3_2/1B_lora_single_device llama3_2/3B_lora_single_device
    llama3_2/1B_qlora_single_device llama3_2/3B_qlora_single_device llama3_2/1B_lora llama3_2/3B_lora
    llama3_3/70B_full llama3_3/70B_lora llama3_3/70B_qlora mistral/7B_full_low_memory mistral/7B_full
    mistral/7B_lora_single_device mistral/7B_qlora_single_device mistral/7B_lora gemma/2B_full gemma/7B_full
    gemma/2B_lora_single_device gemma/2B_qlora_single_device gemma/7B_lora_single_device gemma/7B_qlora_single_device
    gemma/2B_lora gemma/7B_lora gemma2/2B_full gemma2/9B_full gemma2/27B_full gemma2/2B_lora_single_device
    gemma2/2B_qlora_single_device gemma2/9B_lora_single_device gemma2/9B_qlora_single_device
    gemma2/27B_lora_single_device gemma2/27B_qlora_single_device gemma2/2B_lora gemma2/9B_lora gemma2/27B_lora
    phi3/mini_full_low_memory phi3/mini_full phi3/mini_lora_single_device phi3/mini_qlora_single_device phi3/mini_lora
    phi4/14B_full_low_memory phi4/14B_full phi4/14B_lora_single_device phi4/14B_qlora_single_device phi4/14B_lora
    qwen2/0.5B_full_single_device qwen2/1.5B_full_single_device qwen2/7B_full_single_device qwen2/0.5B_full
    qwen2/1.5B_full qwen2/7B_full qwen2/0.5B_lora_single_device qwen2/1.5B_lora_single_device
    qwen2/7B_lora_single_device qwen2/0.5B_lora qwen2/1.5B_lora qwen2/7B_lora qwen2_5/0.5B_full_single_device
    qwen2_5/1.5B_full_single_device qwen2_5/3B_full_single_device qwen2_5/7B_full_single_device qwen2_5/0.5B_full
    qwen2_5/1.5B_full qwen2_5/3B_full qwen2_5/7B_full qwen2_5/0.5B_lora_single_device qwen2_5/1.5B_lora_single_device
    qwen2_5/3B_lora_single_device qwen2_5/7B_lora_single_device qwen2_5/14B_lora_single_device qwen2_5/0.5B_lora
    qwen2_5/1.5B_lora qwen2_5/3B_lora qwen2_5/7B_lora qwen2_5/32B_lora qwen2_5/72B_lora
    """.split()  # noqa: SIM905 (a word list reads and diffs better than 105 quoted strings)
)
# hub id (lower case) -> torchtune config prefix; the first match wins
TORCHTUNE_MODELS = (
    (r"llama-2-(\d+)b", "llama2/{}B"),
    (r"llama-3\.3-(\d+)b", "llama3_3/{}B"),
    (r"llama-3\.2-(\d+)b", "llama3_2/{}B"),
    (r"llama-3\.1-(\d+)b", "llama3_1/{}B"),
    (r"llama-3-(\d+)b", "llama3/{}B"),
    (r"mistral-(\d+)b", "mistral/{}B"),
    (r"gemma-2-(\d+)b", "gemma2/{}B"),
    (r"gemma-(\d+)b", "gemma/{}B"),
    (r"phi-3-(mini)", "phi3/{}"),
    (r"phi-4", "phi4/14B"),
    (r"qwen2\.5-([\d.]+)b", "qwen2_5/{}B"),
    (r"qwen2-([\d.]+)b", "qwen2/{}B"),
)
TORCHTUNE_PLACEHOLDER = "YOUR_CONFIG.yaml"
TORCHTUNE_OPTIMIZERS = {
    "adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
    "adamw-4bit": "torchao.optim.AdamW4bit",
    "sgd": "torch.optim.SGD",
}
TORCHTUNE_ATTENTION = ["q_proj", "k_proj", "v_proj", "output_proj"]  # torchtune's LORA_ATTN_MODULES


TORCHTUNE_SUFFIXES = {  # (method, distributed) -> config name endings, in order of preference
    ("full", False): ("_full_single_device", "_full_low_memory"),
    ("full", True): ("_full",),
    ("lora", False): ("_lora_single_device",),
    ("lora", True): ("_lora",),
    ("qlora", False): ("_qlora_single_device",),
    ("qlora", True): ("_qlora",),
}


def torchtune_config(model: str, method: str, *, distributed: bool) -> str | None:
    """The torchtune config for a hub id, method and recipe (None: torchtune ships none)."""
    prefix = next((p.format(*m.groups()) for pat, p in TORCHTUNE_MODELS if (m := re.search(pat, model.lower()))), None)
    names = [f"{prefix}{end}" for end in TORCHTUNE_SUFFIXES[method, distributed]] if prefix else []
    return next((n for n in names if n in TORCHTUNE_CONFIGS), None)


def _torchtune_fused(config: str) -> bool:
    """Whether a 0.6.1 config sets optimizer.fused: every torch AdamW config does; the single-device full configs
    (bitsandbytes' paged AdamW) do not, except qwen2's and qwen2.5's 0.5B."""
    return not config.endswith(("_low_memory", "_full_single_device")) or "/0.5B_" in config


def _check_torchtune(job: LaunchJob) -> None:
    why = None
    if job.strategy not in ("single", "fsdp2", "fsdp2-shard-grad-op"):
        why = (
            f"its distributed recipes shard with FSDP2 only (HSDP is newer than release 0.6.1), not {job.strategy} "
            "(--target accelerate launches it)"
        )
    elif job.dtype == "fp16":
        why = "its recipes refuse fp16; use bf16 or fp32"
    elif job.method == "qlora" and (job.quant_type != "nf4" or not job.double_quant):
        why = "its QLoRA is torchao's NF4 with double-quantized scales only"
    elif job.method != "full" and set(job.targets) & {"experts", "router"}:
        why = "its LoRA builders adapt attention and MLP projections, not MoE experts or routers"
    elif job.method != "full" and set(job.targets) & set(PROJECTIONS["mlp"]):
        why = "its LoRA builders adapt the MLP whole (apply_lora_to_mlp), not one of its projections"
    elif job.epochs != int(job.epochs):
        why = f"it counts whole epochs, not {job.epochs:g}"
    elif job.packing == "cross-document":
        why = "its packed datasets mask attention per sample (dataset.packed): no cross-document packing"
    if why:
        raise _cannot("torchtune", why)


def _flat(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """`key.sub=value` words as `tune run` takes them (OmegaConf dotlist: lists as [a,b], booleans as True/False)."""
    words = []
    for key, value in tree.items():
        if isinstance(value, dict):
            words += _flat(value, f"{prefix}{key}.")
        else:
            text = f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value)
            words.append(f"{prefix}{key}={text}")
    return words


def _torchtune(job: LaunchJob) -> dict[str, str]:
    _check_torchtune(job)
    distributed = job.strategy != "single"
    recipe = f"{'full' if job.method == 'full' else 'lora'}_finetune_" + (
        "distributed" if distributed else "single_device"
    )
    config = torchtune_config(job.model, job.method, distributed=distributed)
    over: dict[str, Any] = {"batch_size": job.micro_batch, "gradient_accumulation_steps": job.grad_accum}
    over |= {"epochs": int(job.epochs), "tokenizer": {"max_seq_len": job.seq_len}, "dtype": job.dtype}
    over |= {"max_steps_per_epoch": -(-job.max_steps // int(job.epochs))} if job.max_steps else {}
    over["enable_activation_checkpointing"] = job.gradient_checkpointing
    if job.packing == "per-document":
        over["dataset"] = {"packed": True}
    if job.torch_compile:
        over["compile"] = True
    if job.method != "full":
        attention = [
            t for t, p in zip(TORCHTUNE_ATTENTION, PROJECTIONS["attention"]) if {p, "attention"} & set(job.targets)
        ]
        over["model"] = {"lora_rank": job.rank, "lora_alpha": job.alpha, "lora_attn_modules": attention}
        over["model"]["lora_dropout"] = job.lora_dropout
        over["model"]["apply_lora_to_mlp"] = "mlp" in job.targets
    if job.offload == "params":
        over["fsdp_cpu_offload"] = True
    if job.strategy == "fsdp2-shard-grad-op":
        over["fsdp_reshard_after_forward"] = False
    removals = []
    if job.optimizer in TORCHTUNE_OPTIMIZERS:
        over["optimizer"] = {"_component_": TORCHTUNE_OPTIMIZERS[job.optimizer]}
        if job.optimizer in LOW_BIT_ADAMW and config is not None and _torchtune_fused(config):
            removals.append("~optimizer.fused")  # bitsandbytes' and torchao's optimizers take no `fused`
    notes = [_summary(job), f"first: tune download {job.model} --output-dir <the config's checkpointer.checkpoint_dir>"]
    if config is None:
        notes.append(f"torchtune 0.6.1 has no {recipe} config for {job.model}: `tune cp` the nearest (tune ls)")
        notes.append(f"to {TORCHTUNE_PLACEHOLDER} and set its model, tokenizer and checkpointer")
        notes += ["(and drop its optimizer.fused: bitsandbytes' and torchao's optimizers take none)"] * (
            job.optimizer in LOW_BIT_ADAMW
        )
    if job.dataset:
        notes.append(f"dataset {job.dataset}: set the config's dataset component (torchtune builds datasets by format)")
    nodes = [["--nproc_per_node", str(job.gpus_on_node)]] if distributed else []
    if job.num_nodes > 1:
        endpoint = _Raw(f'"${{MASTER_ADDR:-127.0.0.1}}:${{MASTER_PORT:-{MASTER_PORT}}}"')
        nodes = [["--nnodes", str(job.num_nodes), *nodes[0], "--node_rank", _env("NODE_RANK", 0)]]
        nodes += [["--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint]]
    config = config or TORCHTUNE_PLACEHOLDER
    overrides = [[w] for w in _flat(over) + removals]  # one per line
    command = _cmd(["tune", "run"], *nodes, [recipe, "--config", config], *overrides)
    yaml_notes = [f"overrides of torchtune's {recipe} --config {config} (launch.sh gives them as key=value words)"]
    yaml_notes += [f"and remove {r[1:]} from the config" for r in removals]
    return {
        "launch.sh": _script(notes + _nodes_note(job), command),
        "torchtune_overrides.yaml": _yaml(over, [_summary(job), *yaml_notes]),
    }
