"""tunecost.validate: run tunecost's estimators on published fine-tuning measurements and report how far they are.

- `corpus`: read measurement files (the shipped corpus by default), checking their columns.
- `stacks`: the named software stacks the corpus rows ran on, as documented behaviours.
- `mapping`: one corpus row -> a `FineTuneJob` tunecost can simulate, or the reason it cannot.
- `throughput`: analytic FLOPs and bytes per step, a roofline step time with one efficiency per (stack, GPU).
- `run`: predictions per row and the accuracy summary per quantity and per stack.
"""

from tunecost.validate.corpus import DEFAULT_CORPUS_PATH, REQUIRED_COLUMNS, read_corpus
from tunecost.validate.run import OUTPUT_COLUMNS, ValidationRow, validate_rows
from tunecost.validate.summary import summarize

__all__ = [
    "DEFAULT_CORPUS_PATH",
    "OUTPUT_COLUMNS",
    "REQUIRED_COLUMNS",
    "ValidationRow",
    "read_corpus",
    "summarize",
    "validate_rows",
]
