"""Launch recipes of a planned setup: the files a framework needs to run it (`tunecost plan --emit DIR`).

`write_recipe(job, target, out_dir)` writes for "accelerate" an accelerate config, a DeepSpeed JSON (ZeRO), the
TrainingArguments / LoRA / BitsAndBytes fields and a launch.sh; for "torchtune" a `tune run` line and its
overrides; for "llamafactory" a LLaMA-Factory YAML; for "skypilot" a SkyPilot task that runs the accelerate recipe.
docs/plan-recipes.md names the source of every key. A setup a target cannot express is one `TunecostError`,
raised before anything is written; an existing file is replaced only with `force`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tunecost.errors import TunecostError
from tunecost.estimate.recipes.accelerate import _accelerate
from tunecost.estimate.recipes.common import LAUNCH_QUANT_TYPES, TARGETS, LaunchJob, _cannot
from tunecost.estimate.recipes.llamafactory import _llamafactory
from tunecost.estimate.recipes.skypilot import _skypilot, skypilot_cloud
from tunecost.estimate.recipes.torchtune import _torchtune, torchtune_config
from tunecost.io import atomic_write_text
from tunecost.outputs import check_output_path

__all__ = ["LAUNCH_QUANT_TYPES", "TARGETS", "LaunchJob", "skypilot_cloud", "torchtune_config", "write_recipe"]

RENDERERS: dict[str, Callable[[LaunchJob], dict[str, str]]] = {
    "accelerate": _accelerate,
    "torchtune": _torchtune,
    "llamafactory": _llamafactory,
    "skypilot": _skypilot,
}


def write_recipe(
    job: LaunchJob, target: str, out_dir: Path, *, force: bool = False, inputs: Sequence[Path] = ()
) -> list[Path]:
    """Write `target`'s files for `job` into `out_dir` (created if missing) and return their paths. Every file is
    rendered and checked before any is written; an existing file is replaced only with `force`, one of the
    command's `inputs` (its --config files) never."""
    if target not in RENDERERS:
        raise TunecostError(f"unknown recipe target {target!r}; targets: {', '.join(TARGETS)}")
    if job.liger_kernel and target == "torchtune":
        raise TunecostError("torchtune has no Liger kernels; plan --emit with --target llamafactory or accelerate")
    if job.fp8 != "none" and target != "llamafactory":  # the Trainer's bf16 wins over accelerate's fp8
        raise _cannot(target, "FP8; plan --emit with --target llamafactory")
    # torchtune builds its model in one dtype; LLaMA-Factory loads it in the compute dtype (upcasting trained ones)
    if job.fp32_params and (target == "torchtune" or (target == "llamafactory" and job.method != "full")):
        raise _cannot(target, "fp32 frozen weights under autocast; plan --emit with --target accelerate")
    files = RENDERERS[target](job)
    paths = [check_output_path(Path(out_dir) / name, force=True, inputs=inputs, option="--emit") for name in files]
    taken = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if taken and not force:
        raise TunecostError(f"{', '.join(taken)}: already there; pass --force to replace")
    for path, text in zip(paths, files.values()):
        atomic_write_text(path, text)
        if path.suffix == ".sh":
            path.chmod(path.stat().st_mode | 0o111)
    return paths
