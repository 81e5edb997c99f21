"""Regenerate the key lists in src/tunecost/workload/frameworks/keys/ that come from installed libraries.

    .venv/bin/python benchmarks/framework_keys.py [--check]    # --check: exit 1 if a file would change
    .venv/bin/python benchmarks/framework_keys.py --older-wheel transformers-4.55.0-py3-none-any.whl ...

Writes hf_training_args, hf_seq2seq_args, bnb (transformers), peft_lora (peft), accelerate (with fsdp_config and
deepspeed_config); with --older-wheel (`pip download transformers==X --no-deps`), hf_training_args_older.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import zipfile
from collections.abc import Iterable
from datetime import date
from pathlib import Path

KEYS_DIR = Path(__file__).resolve().parents[1] / "src" / "tunecost" / "workload" / "frameworks" / "keys"


def _init_fields(cls: type) -> list[str]:
    """A dataclass's constructor arguments (what HfArgumentParser and asdict-based dumps use)."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _transformers() -> dict[str, tuple[list[str], list[str]]]:
    import transformers
    from transformers import BitsAndBytesConfig, Seq2SeqTrainingArguments, TrainingArguments

    version = f"transformers {transformers.__version__} (installed)"
    args = _init_fields(TrainingArguments)
    seq2seq = [k for k in _init_fields(Seq2SeqTrainingArguments) if k not in args]
    bnb_init = [p for p in inspect.signature(BitsAndBytesConfig.__init__).parameters if p not in ("self", "kwargs")]
    bnb = [*bnb_init, *BitsAndBytesConfig(load_in_4bit=True).to_dict()]
    return {
        "hf_training_args": (
            [f"transformers TrainingArguments' fields: {version}, training_args.py (dataclasses.fields, init)"],
            args,
        ),
        "hf_seq2seq_args": (
            [f"the fields Seq2SeqTrainingArguments adds to TrainingArguments: {version}, training_args_seq2seq.py"],
            seq2seq,
        ),
        "bnb": (
            [
                f"BitsAndBytesConfig: {version}, utils/quantization_config.py",
                "__init__ parameters and the keys to_dict() writes (quant_method, _load_in_4bit, _load_in_8bit)",
            ],
            bnb,
        ),
    }


def _peft() -> dict[str, tuple[list[str], list[str]]]:
    import peft

    header = (
        f"PEFT LoraConfig's fields with PeftConfigMixin's: peft {peft.__version__} (installed), tuners/lora/config.py"
    )
    return {"peft_lora": ([header, "and config.py (dataclasses.fields, init)"], _init_fields(peft.LoraConfig))}


def _accelerate() -> dict[str, tuple[list[str], list[str]]]:
    import accelerate
    import accelerate.utils.launch
    from accelerate.commands.config.config_args import ClusterConfig, SageMakerConfig
    from accelerate.commands.launch import launch_command_parser

    groups = {g.title: [a.dest for a in g._group_actions] for g in launch_command_parser()._action_groups}
    source = inspect.getsource(accelerate.utils.launch)  # prepare_multi_gpu_env reads fsdp_ignored_modules too
    groups["FSDP Arguments"] += re.findall(r"""(?:args\.|getattr\(args, ")(fsdp_\w+)""", source)
    top = [*_init_fields(ClusterConfig), *_init_fields(SageMakerConfig), "fp16", "dynamo_backend"]
    keys = [k for k in top if k not in ("fsdp_config", "deepspeed_config", "parallelism_config")]
    keys += [f"fsdp_config.{k}" for k in groups["FSDP Arguments"]]
    keys += [f"deepspeed_config.{k}" for k in groups["DeepSpeed Arguments"]]
    keys += [f"parallelism_config.{k}" for k in groups["ParallelismConfig Arguments"]]
    header = [
        f"accelerate's config file: accelerate {accelerate.__version__} (installed)",
        "commands/config/config_args.py ClusterConfig and SageMakerConfig fields (from_yaml_file refuses others),",
        "fp16 and dynamo_backend (older keys BaseConfig.process_config converts);",
        "fsdp_config.*, deepspeed_config.* and parallelism_config.*: commands/launch.py's FSDP, DeepSpeed and",
        "ParallelismConfig argument groups, which",
        "`accelerate launch` fills from those sections (an fsdp_config key without the fsdp_ prefix gets it),",
        "and the args.fsdp_* utils/launch.py reads (prepare_multi_gpu_env)",
    ]
    return {"accelerate": (header, keys)}


def _older(wheels: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """TrainingArguments fields of older transformers wheels (read from the source, not imported) gone since."""
    import transformers

    current = set(_init_fields(transformers.TrainingArguments))
    names, keys = [], []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            tree = ast.parse(archive.read("transformers/training_args.py"))
        names.append(metadata.split(".dist-info")[0].split("-")[1])  # transformers-4.55.0.dist-info/METADATA
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingArguments")
        fields = [s for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        keys += [f.target.id for f in fields if not _no_init(f.value)]
    header = [
        f"TrainingArguments fields of transformers {', '.join(names)} (training_args.py, read from the wheels)",
        f"that transformers {transformers.__version__} dropped: configs written for those versions still use them",
    ]
    return {"hf_training_args_older": (header, [k for k in keys if k not in current])}


def _no_init(value: ast.expr | None) -> bool:
    """field(init=False, ...): not a constructor argument."""
    keywords = value.keywords if isinstance(value, ast.Call) else []
    return any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in keywords)


def render(header: Iterable[str], keys: Iterable[str], today: str) -> str:
    lines = [f"# {line}" for line in header]
    lines += [f"# generated by benchmarks/framework_keys.py on {today}; one key per line"]
    return "\n".join([*lines, *sorted(dict.fromkeys(keys)), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report files that would change; write nothing")
    parser.add_argument("--date", default=date.today().isoformat(), help="the date written in the headers")
    parser.add_argument("--older-wheel", action="append", default=[], help="an older transformers wheel")
    args = parser.parse_args(argv)
    changed = []
    lists = {**_transformers(), **_peft(), **_accelerate(), **(_older(args.older_wheel) if args.older_wheel else {})}
    for name, (header, keys) in lists.items():
        path = KEYS_DIR / f"{name}.txt"
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        new = render(header, keys, args.date)
        if _body(old) != _body(new):
            changed.append(path.name)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    print(("would change: " if args.check else "changed: ") + (", ".join(changed) or "nothing"))
    return 1 if args.check and changed else 0


def _body(text: str) -> list[str]:
    """The file without its date line: a rerun on another day with the same keys and versions changes nothing."""
    return [line for line in text.splitlines() if not line.startswith("# generated by")]


if __name__ == "__main__":
    sys.exit(main())
