"""Bounds on the sizes a user can give (on the command line or in a file), checked where they enter.

The bounds are what a single GPU could hold, with a wide margin: a value past them is a typo (an extra digit, a
number in scientific notation), and accepting it would overflow int64 inside torch or allocate without limit.
"""

from __future__ import annotations

import math

from tunecost.errors import TunecostError

MAX_BATCH_SIZE = 65536  # sequences per step; the paper's largest is 44 (Table III)
MAX_SEQ_LEN = 1 << 20  # tokens per sequence
MAX_TOKENS = 1 << 26  # tokens in one step or benchmark call (MAX_BATCH_SIZE x 1024)
MAX_QUERIES = 10**12  # queries in one fine-tune
MAX_EPOCHS = 10**6
MAX_GRAD_ACCUM = 1 << 16  # micro-batches accumulated per optimizer step
MAX_STEPS = 10**5  # timed or warm-up steps of one profile point
MAX_QUERIES_PER_S = 1e6  # measured throughput of one fine-tune, queries/s
MIN_QUERIES_PER_S = 1e-6
MAX_USD_PER_HOUR = 1e4  # price of one GPU-hour
MAX_GPU_MEMORY_BYTES = 10**13  # memory of one GPU (10 TB); the largest today hold 141-192 GB
MAX_LEARNING_RATE = 10.0  # fine-tuning rates are 1e-5 to 1e-2; past 10 any optimizer diverges
MAX_LORA_ALPHA = 1e6  # LoRA scaling numerator; common values are 8 to 2 x rank
MAX_STAGE_LAYERS = 100_000  # decoder layers of one pipeline stage; the deepest models have a few hundred
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds are 32-bit
MAX_EXPERTS = 1024  # experts of one MoE layer; today's largest models have 256
MAX_LAYERS = 10_000  # decoder layers of one model; today's largest have about 130
MAX_LORA_RANK = 1 << 16  # a LoRA rank is at most the hidden size; today's largest are about 16k
MAX_GPUS_PER_NODE = 1024  # GPUs of one node; servers hold 8 to 72
MAX_DEGREE = 1024  # a tensor, pipeline or context parallel degree
MAX_OWNED_GPUS = 1024  # GPUs of one kind a planner's user owns
MAX_BUDGET_USD = 1e9  # one fine-tune's budget
MAX_HIDDEN = 1 << 20  # hidden, expert and LoRA sizes; Mixtral-8x7B's largest is 14336
MAX_THREADS = 4096  # CPU threads of one benchmark
MAX_BINS = 10_000  # histogram bins; a figure shows a few dozen
MAX_INT_OPTION = 2**31 - 1  # no count or size on the command line comes near it; past int64 torch overflows
MAX_NPROC_PER_NODE = 64  # ranks torchrun starts on one machine
MAX_SEARCH_GPUS = 100_000  # GPUs a multi-GPU search weighs (every count up to it: arithmetic only)
MAX_DEADLINE_HOURS = 1e6  # a planner's deadline
MAX_PROFILED_KERNELS = 10**7  # kernels of one profile; a training step of Mixtral-8x7B launches about 10^4
MAX_GPTQ_GROUP_SIZE = 2**20  # inputs per GPTQ group: more than any layer has
MAX_LENGTHS_FILE_BYTES = 64 * 2**20  # a file of one length per line: millions of queries
MAX_CORPUS_FILE_BYTES = 64 * 2**20  # a table of published measurements
MAX_PROFILE_BYTES = 4 * 2**20  # a GPU profile is a few kB; refuse to parse anything this large


def check_count(option: str, value: int | float | None, maximum: int, *, minimum: int = 1) -> int | None:
    """`value` as an int when it is a whole number in [minimum, maximum] (or None); else an error naming `option`."""
    if value is None:
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise TunecostError(f"{option} must be a whole number, got {value!r}")
    number = int(value)
    if not minimum <= number <= maximum:
        raise TunecostError(f"{option} must be between {minimum} and {maximum}, got {number}")
    return number


def check_positive(option: str, value: float | None, maximum: float = math.inf) -> float | None:
    """`value` when it is None or a finite number in (0, maximum]; else an error naming `option`."""
    if value is None:
        return None
    if not (math.isfinite(value) and 0 < value <= maximum):
        bound = "" if math.isinf(maximum) else f" at most {maximum:g}"
        raise TunecostError(f"{option} must be a positive number{bound}, got {value!r}")
    return value


def check_finite_at_most(option: str, value: float | None, maximum: float) -> float | None:
    """`value` when it is None or a finite number at most `maximum` (sign checks are the caller's); else an error
    naming `option`."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise TunecostError(f"{option} must be a finite number, got {value!r}")
    if value > maximum:
        raise TunecostError(f"{option} must be at most {maximum:g}, got {value:g}")
    return value
