"""Grouped matrix products over rows sorted by expert, with a per-group loop where grouped GEMM cannot run.

Sources and derivations: docs/moe-layer.md, section `tunecost.moe.grouped`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_GROUPED_MM = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, *, offs: torch.Tensor) -> torch.Tensor:
    """torch's grouped GEMM; only called once `can_use_grouped_mm` found it (so it exists)."""
    assert _GROUPED_MM is not None
    return _GROUPED_MM(a, b, offs=offs)


_PROBED: dict[tuple[str, torch.dtype], bool] = {}
_FORCE_LOOP = False


@dataclass(frozen=True)
class Groups:
    """Row groups of a tensor sorted by group: group g owns rows [ends[g-1], ends[g]).

    offsets: the group ends as an int32 tensor on the rows' device (what grouped_mm takes).
    ends: the same ends as Python ints (what the loop fallback and the dequantizer use).
    """

    offsets: torch.Tensor
    ends: tuple[int, ...]

    @property
    def num_groups(self) -> int:
        return len(self.ends)

    @property
    def num_rows(self) -> int:
        return self.ends[-1] if self.ends else 0

    def bounds(self) -> Iterator[tuple[int, int, int]]:
        """(group, start, end) for every non-empty group."""
        start = 0
        for group, end in enumerate(self.ends):
            if end > start:
                yield group, start, end
            start = end


def groups_from_counts(counts: list[int], device: torch.device) -> Groups:
    ends: list[int] = []
    total = 0
    for count in counts:
        total += int(count)
        ends.append(total)
    return Groups(offsets=torch.tensor(ends, dtype=torch.int32, device=device), ends=tuple(ends))


@contextlib.contextmanager
def force_loop() -> Iterator[None]:
    """Use the per-group loop even where grouped_mm would run (tests compare the two paths)."""
    global _FORCE_LOOP
    previous, _FORCE_LOOP = _FORCE_LOOP, True
    try:
        yield
    finally:
        _FORCE_LOOP = previous


def _probe(device: torch.device, dtype: torch.dtype) -> bool:
    key = (str(device), dtype)
    if key not in _PROBED:
        ok = _GROUPED_MM is not None and dtype in (torch.float32, torch.bfloat16, torch.float16)
        if ok and device.type == "cuda":
            ok = torch.cuda.get_device_capability(device) >= (8, 0)
        if ok:
            try:
                a = torch.ones(8, 16, device=device, dtype=dtype)
                w = torch.ones(2, 16, 8, device=device, dtype=dtype)
                offs = torch.tensor([3, 8], dtype=torch.int32, device=device)
                out = _grouped_mm(a, w, offs=offs)
                wgrad = _grouped_mm(a.t(), a, offs=offs)
                ok = bool(torch.all(out == 16)) and tuple(wgrad.shape) == (2, 16, 16)
            except (RuntimeError, NotImplementedError, TypeError):
                ok = False
        _PROBED[key] = ok
    return _PROBED[key]


def _aligned_16_bytes(t: torch.Tensor) -> bool:
    size = t.element_size()
    if t.data_ptr() % 16:
        return False
    return all(stride == 1 or dim == 1 or (stride * size) % 16 == 0 for stride, dim in zip(t.stride(), t.shape))


def can_use_grouped_mm(*tensors: torch.Tensor) -> bool:
    if _FORCE_LOOP:
        return False
    first = tensors[0]
    if any(t.dtype != first.dtype or t.device != first.device for t in tensors):
        return False
    return _probe(first.device, first.dtype) and all(_aligned_16_bytes(t) for t in tensors)


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, groups: Groups) -> torch.Tensor:
    """Per group g: rows of g in `x` (S, K) times `w[g]` (K, N); returns (S, N). Pass W^T views freely."""
    if groups.num_rows != x.shape[0]:
        raise AssertionError(f"groups cover {groups.num_rows} rows, tensor has {x.shape[0]}")
    if can_use_grouped_mm(x, w):
        return _grouped_mm(x, w, offs=groups.offsets)
    out = x.new_empty(x.shape[0], w.shape[-1])
    for group, start, end in groups.bounds():
        torch.mm(x[start:end], w[group], out=out[start:end])
    return out


def grouped_matmul_wgrad(a: torch.Tensor, b: torch.Tensor, groups: Groups) -> torch.Tensor:
    """Per group g: (rows of g in `a`)^T times (rows of g in `b`); returns (G, Ka, Kb), zeros for empty groups.

    This is the weight gradient of `grouped_matmul`: dW[g] = x_g^T dy_g."""
    if can_use_grouped_mm(a, b):
        return _grouped_mm(a.t(), b, offs=groups.offsets)
    out = a.new_zeros(groups.num_groups, a.shape[1], b.shape[1])
    for group, start, end in groups.bounds():
        torch.mm(a[start:end].t(), b[start:end], out=out[group])
    return out


def grouped_addmm_(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, groups: Groups, alpha: float) -> torch.Tensor:
    """In place: rows of g in `out` += alpha * (rows of g in `x`) @ w[g]. Used for the LoRA terms.

    On CPU a loop of `addmm_` accumulates straight into `out`: no (rows, N) temporary, which matters there
    because glibc serves allocations above 32 MiB with fresh pages, and first-touching them cost as much as the
    rank-16 product itself (measured, fp32, one thread: 8192 x 16 @ 16 x 3584 by expert into one fresh
    (8192, 3584) tensor 82.8 ms; the same eight products as separate 1024-row outputs 14.9 ms)."""
    if out.device.type != "cpu" and can_use_grouped_mm(x, w):
        return out.add_(_grouped_mm(x, w, offs=groups.offsets), alpha=alpha)
    for group, start, end in groups.bounds():
        out[start:end].addmm_(x[start:end], w[group], alpha=alpha)
    return out


@dataclass(frozen=True)
class Routing:
    """Tokens routed once: rows are (token, slot) pairs sorted by expert (stable, so ties keep token order).

    perm: row -> index into the flattened (tokens * top_k) routing tensors.
    token_of_row: row -> token index.
    groups: per-expert row ranges over all E experts.
    tokens_per_expert: (E,) counts on the device.
    """

    perm: torch.Tensor
    token_of_row: torch.Tensor
    groups: Groups
    tokens_per_expert: torch.Tensor

    @property
    def hit_experts(self) -> list[int]:
        return [expert for expert, _, _ in self.groups.bounds()]

    def hit_groups(self) -> Groups:
        """Row ranges over the experts that received tokens only (for compact de-quantized weights)."""
        counts = [end - begin for _, begin, end in self.groups.bounds()]
        return groups_from_counts(counts, self.groups.offsets.device)


def route(top_k_index: torch.Tensor, num_experts: int) -> Routing:
    num_top_k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    _, perm = torch.sort(flat, stable=True)
    tokens_per_expert = torch.bincount(flat, minlength=num_experts)[:num_experts]
    # One host sync per layer: the group bounds drive the loop fallback and which experts to de-quantize.
    groups = groups_from_counts(tokens_per_expert.tolist(), flat.device)
    return Routing(perm=perm, token_of_row=perm // num_top_k, groups=groups, tokens_per_expert=tokens_per_expert)
