"""`--config FILE` on the job commands: the options a framework's config sets fill those the command line left
out; the defaults the framework filled and the keys tunecost does not model are printed on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from tunecost.cli.common import err_console
from tunecost.cli.options import ParameterSource, opt
from tunecost.errors import TunecostError

CONFIG_HELP = (
    "Your framework's training config: LLaMA-Factory or axolotl YAML, a torchtune recipe, HF TrainingArguments / "
    "SFTConfig, PEFT adapter_config.json, BitsAndBytesConfig, accelerate YAML, DeepSpeed JSON, litgpt YAML or "
    "torchtitan TOML; repeat for files read together. Flags override it."
)
ConfigFiles = Annotated[list[Path] | None, opt("--config", CONFIG_HELP)]


FLOAT_OPTIONS = ("lora_alpha", "epochs")  # the command line gives floats: 16 is 16.0 from a file too


def with_config(
    ctx: Any, paths: list[Path] | None, values: dict[str, Any], *, as_text: tuple[str, ...] = (), quiet: bool = False
) -> dict[str, Any]:
    """`values` (the command's job options by name) with each option the config sets and the command line did not
    given the config's value, as the option takes it (`as_text`: options the command reads as text, "4")."""
    if not paths:
        return values
    from tunecost.workload.frameworks.registry import read_configs

    job = read_configs(paths)
    out = dict(values)
    for name, value in job.options.items():
        if name not in out or ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            continue
        if name in as_text:
            value = str(value)
        elif name in FLOAT_OPTIONS:
            value = float(value)
        out[name] = value
    if not quiet:
        for line in job.assumptions:
            err_console.print(f"assumed: {line}")
        if job.not_modelled:
            err_console.print(f"warning: not modelled from {job.path}: {', '.join(job.not_modelled)}")
    return out


def required(name: str, value: Any) -> Any:
    """A job option the command needs, from the flags or the config."""
    if value is None:
        raise TunecostError(f"give --{name.replace('_', '-')} (or a --config that sets it)")
    return value
