"""The work FP8 training adds to a step: the casts of each linear's input, weight and grad-output to FP8 around its
GEMMs, per recipe (tunecost.workload.job.FP8_RECIPES). Sources and derivations: docs/fp8.md."""

from __future__ import annotations

from tunecost.errors import TunecostError

FP8_AMAX_READ_BYTES = 2  # torchao dynamic scaling: abs-max over the bf16 tensor before the cast
FP8_CAST_READ_BYTES, FP8_CAST_WRITE_BYTES = 2, 1  # bf16 in, FP8 out
TORCHAO_KERNELS_PER_CAST = 3  # amax reduction, scale, cast (eager)


def fp8_cast_bytes(
    recipe: str,
    *,
    weight_elems: float,
    input_elems: float,
    grad_out_elems: float,
    fwd_passes: float,
    trains_weight: bool,
) -> float:
    """Bytes the FP8 casts of one step move (docs/fp8.md): each cast of a bf16 tensor to FP8 reads it and writes one
    byte per element; torchao's dynamic scaling reads it once more for its amax first (FP8_AMAX_READ_BYTES) and
    casts the input, weight and grad-output once per GEMM that uses them; Transformer Engine takes the scale from
    the amax history, fusing the amax into a cast that also writes the transposed copy its backward GEMMs use, and
    casts a weight once per micro-batch (its FP8 weight cache, reused by the recompute)."""
    if recipe in ("tensorwise", "rowwise"):
        per_elem = FP8_AMAX_READ_BYTES + FP8_CAST_READ_BYTES + FP8_CAST_WRITE_BYTES
        fwd = input_elems + weight_elems  # output GEMM
        bwd = grad_out_elems + weight_elems  # grad-input GEMM
        if trains_weight:
            bwd += grad_out_elems + input_elems  # grad-weight GEMM
        return per_elem * (fwd_passes * fwd + bwd)
    if recipe == "te-delayed":
        per_elem = FP8_CAST_READ_BYTES + 2 * FP8_CAST_WRITE_BYTES  # cast + transpose, amax fused
        return per_elem * (fwd_passes * input_elems + weight_elems + grad_out_elems)
    raise TunecostError(f"unknown FP8 recipe {recipe!r}")


def fp8_cast_kernels(recipe: str, *, num_linears: float, fwd_passes: float, trains_weight: bool) -> float:
    """Kernel launches of the casts: torchao (eager) amax, scale and cast per cast; TE one fused cast per tensor."""
    if recipe == "te-delayed":
        return num_linears * (fwd_passes + 2)
    casts = 2 * fwd_passes + (4 if trains_weight else 2)
    return num_linears * casts * TORCHAO_KERNELS_PER_CAST
