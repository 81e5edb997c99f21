"""The SkyPilot recipe: a task that runs the accelerate recipe on whichever provider is cheapest at launch."""

from __future__ import annotations

import re
import shlex
from typing import Any

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.estimate.recipes.accelerate import _accelerate
from tunecost.estimate.recipes.common import (
    MASTER_PORT,
    SKYPILOT_DEFAULT_DISK_GB,
    ZERO_STAGES,
    LaunchJob,
    _cannot,
    _summary,
    _yaml,
)

# tunecost GPU catalog name -> SkyPilot accelerator (skypilot-catalog catalogs/v8/common/accelerators.csv)
SKYPILOT_GPUS = {
    "A40-48GB": "A40", "A100-40GB": "A100", "A100-80GB-SXM": "A100-80GB", "A100-80GB-PCIE": "A100-80GB",
    "H100-80GB-SXM": "H100", "H100-80GB-PCIE": "H100", "H100-94GB-NVL": "H100-NVL", "H200-141GB": "H200",
    "GH200-96GB": "GH200", "B200-180GB": "B200", "B300-288GB": "B300", "MI300X-192GB": "MI300X",
    "L40S-48GB": "L40S", "L40-48GB": "L40", "L4-24GB": "L4", "A10G-24GB": "A10G", "A10-24GB": "A10", "A30-24GB": "A30",
    "A800-80GB-SXM": "A800", "A800-80GB-PCIE": "A800", "T4-16GB": "T4", "V100-16GB-SXM2": "V100",
    "V100-16GB-PCIE": "V100", "V100-32GB-SXM2": "V100-32GB", "V100-32GB-PCIE": "V100-32GB",
    "RTX3060-12GB": "RTX3060", "RTX3090-24GB": "RTX3090", "RTX4060-8GB": "RTX4060", "RTX4070-12GB": "RTX4070",
    "RTX4090-24GB": "RTX4090", "RTX5090-32GB": "RTX5090", "RTXA4000-16GB": "RTXA4000", "RTXA4500-20GB": "RTXA4500",
    "RTXA5000-24GB": "RTXA5000", "RTXA6000-48GB": "RTXA6000", "RTX6000ADA-48GB": "RTX6000-Ada",
    "RTXPRO6000-96GB": "RTXPRO6000",
}  # fmt: skip
# SkyPilot's clouds (sky/skylet/constants.py ALL_CLOUDS) and names tunecost's providers may use for them
SKYPILOT_CLOUDS = (
    "aws", "azure", "gcp", "ibm", "lambda", "scp", "oci", "kubernetes", "runpod", "vast", "vsphere", "cudo",
    "fluidstack", "paperspace", "primeintellect", "do", "nebius", "ssh", "slurm", "hyperbolic", "seeweb", "shadeform",
    "yotta", "mithril", "verda",
)  # fmt: skip
SKYPILOT_ALIASES = {"digitalocean": "do", "k8s": "kubernetes", "lambdalabs": "lambda", "datacrunch": "verda"}


def skypilot_cloud(provider: str) -> str | None:
    """SkyPilot's name for a provider ("runpod-secure" -> "runpod"), None where SkyPilot has no such cloud."""
    name = SKYPILOT_ALIASES.get(provider.lower(), provider.lower())
    head = re.split(r"[-_.]", name)[0]
    return name if name in SKYPILOT_CLOUDS else (head if head in SKYPILOT_CLOUDS else None)


def _skypilot(job: LaunchJob) -> dict[str, str]:
    """A SkyPilot task (sky/utils/schemas.py) whose run: starts the accelerate recipe written beside it."""
    gpu = resolve_gpu_name(job.gpu).gpu.name
    if gpu not in SKYPILOT_GPUS:
        raise _cannot("skypilot", f"SkyPilot's catalog has no accelerator for {gpu}")
    files = _accelerate(job)
    infra = {f"{c}/{region}" if region else c: None for p, region in job.clouds if (c := skypilot_cloud(p))}
    left_out = sorted({p for p, _ in job.clouds if skypilot_cloud(p) is None})
    resources: dict[str, Any] = {"accelerators": f"{SKYPILOT_GPUS[gpu]}:{job.gpus_on_node}"}
    resources["disk_size"] = job.disk_gb or SKYPILOT_DEFAULT_DISK_GB
    if infra:
        resources["any_of"] = [{"infra": i} for i in infra]
    packages = ["accelerate>=1.0", "transformers>=5.0,<6", "datasets>=3.0"]
    packages += ["peft>=0.17"] if job.method != "full" else []
    packages += ["bitsandbytes>=0.48"] if job.method == "qlora" or job.optimizer == "adamw-8bit" else []
    packages += ["torchao"] if job.optimizer == "adamw-4bit" else []
    packages += ["deepspeed>=0.19"] if job.strategy in ZERO_STAGES else []
    run = ["set -e"]
    if job.num_nodes > 1:
        run += ['export NODE_RANK="$SKYPILOT_NODE_RANK"', f"export MASTER_PORT={MASTER_PORT}"]
        run += ['export MASTER_ADDR="$(echo "$SKYPILOT_NODE_IPS" | head -n1)"']
        run += ['export NUM_PROCESSES="$((SKYPILOT_NUM_NODES * SKYPILOT_NUM_GPUS_PER_NODE))"']
    task: dict[str, Any] = {
        "name": "tunecost-" + re.sub(r"[^a-z0-9]+", "-", job.model.lower()).strip("-"),
        "workdir": ".",
    }
    task |= {"num_nodes": job.num_nodes, "resources": resources}
    task["setup"] = f"pip install {' '.join(shlex.quote(p) for p in packages)}\n"
    task["run"] = "\n".join([*run, "bash launch.sh"]) + "\n"
    notes = [_summary(job), "workdir . (this folder and your train.py) goes to every node; run: starts launch.sh"]
    notes += [f"left out (no SkyPilot cloud): {', '.join(left_out)}"] if left_out else []
    files["sky.yaml"] = _yaml(task, notes)
    return files
