"""Helpers of the readers of nested configs (torchtitan, torchtune, litgpt, NeMo / Megatron-LM): dotted keys, the
job with the keys not read, optimizer classes and FSDP2's data-parallel degrees."""

from __future__ import annotations

from typing import Any

from tunecost.workload.frameworks import ConfigFile, ConfigJob

# optimizer class (torch.optim, bitsandbytes.optim, torchao.optim) -> tunecost's optimizer
OPTIMIZER_CLASSES = {"AdamW": "adamw", "PagedAdamW": "adamw", "AdamW8bit": "adamw-8bit", "PagedAdamW8bit": "adamw-8bit"}
OPTIMIZER_CLASSES["SGD"] = "sgd"


def nested_config(cfg: ConfigFile) -> ConfigFile:
    """The config with nested sections as dotted keys ("model.lora_rank"), so errors name the full key."""

    def flat(data: Any, prefix: str) -> dict[str, Any]:
        if not isinstance(data, dict) or not data:
            return {prefix: data}
        return {k: v for key, value in data.items() for k, v in flat(value, f"{prefix}{key}.").items()}

    return ConfigFile(path=cfg.path, data={k.rstrip("."): v for k, v in flat(dict(cfg.data), "").items()})


def unmodelled_keys(flat: ConfigFile) -> tuple[str, ...]:
    """Keys not read and not null; a section none of whose keys was read is named once ("profiler")."""
    read_sections = {key.split(".")[0] for key in flat.used}
    unread = (k for k in flat.unused_keys() if flat.data[k] is not None)
    names = (k if k.split(".")[0] in read_sections else k.split(".")[0] for k in unread)
    return tuple(dict.fromkeys(names))


def config_job(framework: str, flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> ConfigJob:
    """The job: the options set (None: not set), the assumptions, the keys not read."""
    options = {k: v for k, v in options.items() if v is not None}
    unread = unmodelled_keys(flat)
    return ConfigJob(
        framework=framework, path=flat.path, options=options, assumptions=tuple(notes), not_modelled=unread
    )


def optimizer_name(flat: ConfigFile, key: str, path: str) -> str:
    """tunecost's optimizer for an optimizer class path ("torch.optim.AdamW")."""
    name = OPTIMIZER_CLASSES.get(path.rsplit(".", 1)[-1])
    if name is None:
        raise flat.error(key, f"{path}: supported: {', '.join(OPTIMIZER_CLASSES)} (torch.optim, bitsandbytes.optim)")
    return name


def data_parallel_layout(
    flat: ConfigFile, keys: tuple[str, str, str], *, reshard: bool, title: str, inner: int = 1, pp: int = 1
) -> tuple[dict[str, Any], list[str]]:
    """strategy, num_gpus, gpus_per_node and offload from FSDP2 data-parallel degrees (-1 shard: the GPUs left
    after the model-parallel ones); `keys`: the shard degree's, the replicate degree's and the CPU offload's.
    `inner`: tensor x context degree (next to the shard dimension in the device mesh), `pp`: pipeline degree."""
    shard_key, replicate_key, offload_key = keys
    notes: list[str] = []
    shard = flat.or_default(shard_key, int, -1, notes, f"{shard_key} -1: {title}'s default")
    replicate = flat.or_default(replicate_key, int, 1, notes, f"{replicate_key} 1: {title}'s default")
    if shard == 0 or shard < -1:
        raise flat.error(shard_key, f"must be -1 (all the GPUs) or at least 1, got {shard}")
    if replicate < 1:
        raise flat.error(replicate_key, f"must be at least 1, got {replicate}")
    options: dict[str, Any] = {}
    if replicate > 1:
        options["strategy"] = "ddp" if shard == 1 else "hsdp"
    elif shard != 1:
        options["strategy"] = "fsdp2" if reshard else "fsdp2-shard-grad-op"
    elif inner * pp > 1:
        options["strategy"] = "single"  # a data-parallel group of one: nothing to replicate or shard
    if shard > 0:
        options["num_gpus"] = shard * replicate * inner * pp
    else:
        left = " left after the model-parallel degrees" if inner * pp > 1 else ""
        notes.append(f"GPUs: {title}'s {shard_key} -1 takes every GPU the launcher starts{left} (give --gpus)")
    if options.get("strategy") == "hsdp" and shard > 0:
        options["gpus_per_node"] = shard * inner
        within = f" x tensor x context {inner}" if inner > 1 else ""
        notes.append(
            f"gpus_per_node {shard * inner}: tunecost's HSDP shards within a node, so {shard_key}{within} is one node"
        )
    if flat.typed(offload_key, bool):
        if options.get("strategy") != "fsdp2":
            raise flat.error(offload_key, "CPU offload is modelled under FSDP2 full sharding only")
        options["offload"] = "params"
    return options, notes
