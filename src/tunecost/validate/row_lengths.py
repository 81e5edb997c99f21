"""A corpus row's sequence lengths: which kinds tunecost models, and the lengths of a row whose sequences run up
to seq_len of a catalog dataset."""

from __future__ import annotations

import re

from tunecost.estimate.throughput.lengths import SeqLengths, dataset_lengths, has_length_statistic
from tunecost.validate.cells import Skip
from tunecost.validate.corpus import CorpusRow

# padded to seq_len (transformers' padding="max_length"): every sequence seq_len tokens; cut at it, unpadded: max
_KINDS = {"padded": "fixed", "max_length": "fixed", "padding=max_length": "fixed", "truncated": "max"}


def seq_len_kind_of(row: CorpusRow) -> str:
    """The row's seq_len_kind in any case, with an aside ("Packed", "packed (ConstantLengthDataset)"), or as a
    packing switch ("packing=True")."""
    cell = re.sub(r"\s*\(.*?\)", "", row.get("seq_len_kind")).strip().lower()
    if re.fullmatch(r"packing\s*[=:]\s*(?:true|yes|on|1)", cell):
        return "packed"
    return _KINDS.get(cell, cell) or "fixed"


def check_lengths(row: CorpusRow, throughput: bool) -> None:
    """Raise `Skip` where the row's sequence lengths do not say the work or the worst batch."""
    kind = seq_len_kind_of(row)
    if kind not in ("fixed", "packed", "max"):
        raise Skip(f"sequence lengths {kind!r} (a dataset's lengths are not in the row)")
    if throughput and kind == "max":
        if not has_length_statistic(row.get("dataset")):
            raise Skip(
                "throughput with sequences up to seq_len (the dataset's lengths, which set the work, are not in the "
                "row)"
            )
        if row.get("quantity") in ("tokens_per_s_per_gpu", "tokens_per_s"):
            raise Skip("tokens per second of sequences up to seq_len (whether padding counts is not stated)")
    if kind == "max" and not row.get("dataset"):
        raise Skip(
            "peak memory with sequences up to seq_len of a dataset the row does not name (whether a batch reaches "
            "seq_len, the worst case tunecost sizes, is not known)"
        )


def max_lengths(row: CorpusRow, batch_size: int, seq_len: int) -> SeqLengths | None:
    """Lengths of a micro-batch of a throughput row whose queries run up to `seq_len` of a catalog dataset, each
    batch padded to its longest (as `estimate --dataset D --seq-len L` prices them); None for other kinds (every
    query `seq_len` tokens). Call after `check_lengths` passed the row."""
    if seq_len_kind_of(row) != "max":
        return None
    return dataset_lengths(row.get("dataset"), batch_size, cutoff_tokens=seq_len)
