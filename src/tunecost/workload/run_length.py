"""A run's length in queries when its config counts optimizer steps: steps x global batch (micro-batch per rank x
gradient accumulation x data-parallel ranks), and the frameworks' rules when steps and epochs are both set."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tunecost.errors import TunecostError


def queries_for_steps(max_steps: int, global_batch: int) -> int:
    """Queries processed by `max_steps` optimizer steps of `global_batch` queries each."""
    if max_steps < 1 or global_batch < 1:
        raise TunecostError(f"steps and global batch must be >= 1, got {max_steps} and {global_batch}")
    return max_steps * global_batch


def sliced_queries(split: str, split_queries: int, counted_split: str = "train") -> int | None:
    """The queries `split`, a Hugging Face split spec ("train[:95%]", "train[:10%]+train[-80%:]"), takes of the
    split `counted_split` of `split_queries` rows (datasets' ReadInstruction: percentages rounded to the closest
    row); None where it names another split. ValueError: not a split spec."""
    from datasets import ReadInstruction

    try:
        parts = ReadInstruction.from_spec(split).to_absolute({counted_split: split_queries})
    except ValueError as e:
        if str(e).startswith("Unknown split"):
            return None
        raise
    return sum(max(0, p.to - p.from_) for p in parts)


def interleaved_queries(rows: Sequence[int], probabilities: Sequence[float] | None, *, over: bool) -> int:
    """The examples `datasets.interleave_datasets` takes from datasets of `rows` examples until the first is
    exhausted, or every one (`over`): taken in turn, the shortest's (longest's) rows from each; drawn with
    `probabilities`, about the draws that take each of source i's rows (rows_i / p_i) at the soonest (latest)."""
    if probabilities is None:
        return len(rows) * (max(rows) if over else min(rows))
    draws = [n / p for n, p in zip(rows, probabilities, strict=True) if p > 0]
    return round(max(draws) if over else min(draws))


def training_queries(dataset_queries: int, eval_split: float) -> int:
    """The queries left to train on once `eval_split` is set aside for evaluation: a fraction below 1 (rounded up,
    as `datasets`' train_test_split rounds its test size) or a count."""
    held = math.ceil(eval_split * dataset_queries) if eval_split < 1 else int(eval_split)
    if held >= dataset_queries:
        raise TunecostError(
            f"the config's evaluation split {eval_split:g} leaves none of the {dataset_queries} queries to train"
        )
    return dataset_queries - held


def data_parallel_ranks(options: Mapping[str, Any], num_gpus: int) -> int:
    """The data-parallel ranks of `num_gpus` GPUs under the options' TP, PP and CP degrees (at least 1)."""
    return max(1, num_gpus // (options.get("tp", 1) * options.get("pp", 1) * options.get("cp", 1)))


def global_batch_of(options: Mapping[str, Any]) -> tuple[int, str] | None:
    """(queries per optimizer step, how it was counted) from a config's job options: its stated global batch, else
    micro-batch x gradient accumulation (1 unless stated) x data-parallel ranks (its GPUs, 1 unless stated, over
    the model-parallel degrees; the count said to be the launcher's where unstated). None: the config gives no
    batch."""
    if options.get("queries_per_step") is not None:
        return options["queries_per_step"], f"global batch {options['queries_per_step']}"
    micro = options.get("batch_size")
    if micro is None:
        return None
    if options.get("micro_batches") is not None and options.get("pp", 1) > 1:
        micro *= options["micro_batches"]  # a pipeline's micro-batches are its accumulation
    accumulation = options.get("grad_accum") or 1
    ranks = data_parallel_ranks(options, options.get("num_gpus") or 1)
    how = f"global batch {micro * accumulation * ranks} (micro-batch {micro} x accumulation {accumulation} x {ranks} "
    how += f"data-parallel rank{'s' if ranks > 1 else ''}"
    unstated = "; the config leaves the GPU count to its launcher" if options.get("num_gpus") is None else ""
    return micro * accumulation * ranks, how + unstated + ")"


@dataclass(frozen=True)
class RunLength:
    """What the cost multiplies: queries x epochs, and the line that says how steps gave them (None: epochs)."""

    num_queries: int | None
    epochs: float
    note: str | None = None


def run_length(
    *,
    dataset_queries: int | None,
    epochs: float | None,
    max_steps: int | None,
    max_steps_per_epoch: int | None = None,
    global_batch: tuple[int, str] | None = None,
    queries_per_row: float = 1.0,
) -> RunLength:
    """The run's queries x epochs. `max_steps` alone: steps x global batch. With `epochs` too (NeMo's
    trainer.max_steps beside max_epochs): whichever ends first (the steps when the dataset's size is unknown).
    `max_steps_per_epoch` (torchtune) caps each epoch. Without steps: the dataset's queries x `epochs`.
    `queries_per_row`: a packed job's batch counts rows, each holding this many queries."""
    steps = max_steps if max_steps is not None else max_steps_per_epoch
    if steps is None:
        if epochs is None:
            raise TunecostError("give --epochs or --max-steps (or a --config that sets either)")
        return RunLength(dataset_queries, epochs)
    if global_batch is None:
        raise TunecostError(
            "--max-steps needs the global batch (queries per optimizer step): give a --config that states the "
            "per-device batch, or --queries (steps x global batch) instead"
        )
    batch, how = global_batch
    queries = queries_for_steps(steps, batch)
    if queries_per_row != 1.0:
        queries = max(1, round(queries * queries_per_row))
        how += f" x {queries_per_row:.2f} queries per packed row"
    if max_steps is None:  # a cap on each epoch
        per_epoch = queries if dataset_queries is None else min(queries, dataset_queries)
        capped = f"max_steps_per_epoch {steps} x {how} = {queries} queries per epoch"
        if dataset_queries is not None and dataset_queries <= queries:
            capped += f" (the dataset's {dataset_queries} end each epoch first)"
        return RunLength(per_epoch, epochs if epochs is not None else 1.0, capped)
    note = f"max_steps {steps} x {how} = {queries} queries"
    if epochs is None:
        return RunLength(queries, 1.0, note)
    if dataset_queries is None:
        return RunLength(queries, 1.0, f"{note} (the dataset's size unknown: its {epochs:g} epochs not compared)")
    if dataset_queries * epochs < queries:
        ended = f"{epochs:g} epochs of {dataset_queries} queries end before max_steps {steps} ({queries} queries)"
        return RunLength(dataset_queries, epochs, ended)
    return RunLength(queries, 1.0, f"{note}, before {epochs:g} epochs of {dataset_queries} queries")
