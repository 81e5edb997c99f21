"""Write src/tunecost/catalog/data/peft_targets.csv from the installed PEFT: the LoRA targets PEFT takes for a model
type when a LoraConfig leaves target_modules unset (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`), for the
model types whose module names tunecost reads (`workload.frameworks.hf_common.ADAPTED_NAMES`).

    .venv/bin/python benchmarks/peft_targets.py [--check]    # --check: exit 1 if the file would change
"""

from __future__ import annotations

import argparse
import datetime
import sys
from importlib.metadata import version

from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as MAPPING

from tunecost.catalog.peft_targets import PEFT_TARGETS_PATH
from tunecost.io import atomic_write_text
from tunecost.workload.frameworks.hf_common import ADAPTED_NAMES


def rows(as_of: str) -> list[str]:
    source = f"peft {version('peft')} utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"
    out = []
    for model_type, names in sorted(MAPPING.items()):
        if isinstance(names, list) and all(n in ADAPTED_NAMES for n in names):
            out.append(f"{model_type},{';'.join(names)},{source},{as_of}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    old = PEFT_TARGETS_PATH.read_text(encoding="utf-8") if PEFT_TARGETS_PATH.exists() else ""
    as_of = old.rsplit(",", 1)[-1].strip() if args.check and old else datetime.date.today().isoformat()
    header = (
        "# LoRA targets PEFT takes when target_modules is unset, per model type (generated: benchmarks/peft_targets.py)"
    )
    text = "\n".join([header, "model_type,target_modules,source,as_of", *rows(as_of)]) + "\n"
    if args.check:
        print(f"{PEFT_TARGETS_PATH}: {'current' if text == old else 'out of date'}")
        sys.exit(text != old)
    atomic_write_text(PEFT_TARGETS_PATH, text)
    print(f"wrote {PEFT_TARGETS_PATH}: {len(text.splitlines()) - 2} model types")


if __name__ == "__main__":
    main()
