"""What FP8 training (`FineTuneJob.fp8`) adds to a simulated step's memory, per framework, from the model's linear
layers: torchao float8 keeps every saved tensor in bf16 and adds only its casts' temporaries; Transformer Engine keeps
FP8 weight copies across micro-batches and saves FP8 inputs. The rules and their sources: docs/fp8.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tunecost.workload.job import TORCHAO_FP8_RECIPES as TORCHAO_RECIPES
from tunecost.workload.job import FineTuneJob

FP8_MEMORY_VERSION = "2"  # in the result cache's key of an FP8 job: bump when these rules change
FP8_BYTES = 1
BF16_BYTES = 2


@dataclass(frozen=True)
class LinearShape:
    in_features: int  # this rank's (a tensor-parallel shard's)
    out_features: int
    trains_weight: bool  # its weight gets a gradient (full fine-tune), not frozen beside LoRA
    input_token_divisor: int = 1  # tp under sequence parallelism for a column-parallel linear: it saves a shard


def granules(nbytes: int, granule_bytes: int) -> int:
    """`nbytes` rounded up to whole allocator granules (the simulator's accounting)."""
    return -(-nbytes // granule_bytes) * granule_bytes if granule_bytes > 1 else nbytes


def fp8_temporary_bytes(recipe: str, linear: LinearShape, tokens: int, granule_bytes: int = 1) -> int:
    """The FP8 temporaries alive at the end of one linear's backward (the largest of its step).
    torchao (float8_linear.py `matmul_with_hp_or_float8_args.backward`): grad-output cast twice (for grad-input and
    for grad-weight), the weight and the input cast once more, all held until the function returns; the grad-weight
    GEMM runs whether or not the weight trains, so a frozen weight adds its bf16 gradient, dropped by autograd.
    Transformer Engine: the grad-output's FP8 row- and column-wise copies."""
    n_x, n_w, n_g = tokens * linear.in_features, linear.in_features * linear.out_features, tokens * linear.out_features
    if recipe in TORCHAO_RECIPES:
        sizes = [n_g * FP8_BYTES, n_w * FP8_BYTES, n_g * FP8_BYTES, n_x * FP8_BYTES]
        if not linear.trains_weight:
            sizes.append(n_w * BF16_BYTES)
        return sum(granules(s, granule_bytes) for s in sizes)
    if recipe == "te-delayed":
        return 2 * granules(n_g * FP8_BYTES, granule_bytes)
    raise ValueError(f"unknown FP8 recipe {recipe!r}")


def fp8_saved_bytes(recipe: str, linear: LinearShape, tokens: int, granule_bytes: int = 1) -> int:
    """Tensors FP8 adds to what one linear saves for backward. torchao saves the bf16 input and weight as
    nn.Linear does: nothing added. Transformer Engine (module/linear.py) saves the input's column-wise FP8 copy
    for the grad-weight GEMM when the weight trains; the bf16 input the simulated model code saves stays counted."""
    if recipe in TORCHAO_RECIPES or not linear.trains_weight:
        return 0
    return granules(tokens // linear.input_token_divisor * linear.in_features * FP8_BYTES, granule_bytes)


def fp8_weight_cache_bytes(
    recipe: str, linear: LinearShape, granule_bytes: int = 1, *, fp8_params: bool = False
) -> int:
    """Transformer Engine's FP8 weight workspace kept across micro-batches (`is_first_microbatch` given, as
    Megatron/NeMo do): row- and column-wise copies, one byte each per weight element; with FP8 primary weights
    (`fp8_params`) the row-wise copy is the weight itself and only the column-wise one is kept. torchao keeps none."""
    if recipe in TORCHAO_RECIPES:
        return 0
    return (1 if fp8_params else 2) * granules(linear.in_features * linear.out_features * FP8_BYTES, granule_bytes)


def fp8_weight_saving_bytes(linear: LinearShape, weight_bytes_per_element: int, granule_bytes: int = 1) -> int:
    """What FP8 primary weights save on one linear's stored weight: its compute-dtype copy held as one FP8 byte
    per element."""
    n_w = linear.in_features * linear.out_features
    return granules(n_w * weight_bytes_per_element, granule_bytes) - granules(n_w * FP8_BYTES, granule_bytes)


def fp8_memory_bytes(
    recipe: str,
    linears: Sequence[LinearShape],
    tokens: int,
    granule_bytes: int = 1,
    *,
    fp8_params: bool = False,
    weight_bytes_per_element: int = BF16_BYTES,
) -> dict[str, int]:
    """Bytes FP8 adds to a step's peak by simulator category: "buffers" (TE's weight copies), "activations"
    (TE's saved FP8 inputs, every linear's held at the end of forward), "temporaries" (the largest linear's casts);
    with `fp8_params`, negative "frozen_weights"/"trainable_params": the stored weights' saving."""
    if recipe == "none" or not linears:
        return {}
    out = {
        "buffers": sum(fp8_weight_cache_bytes(recipe, lin, granule_bytes, fp8_params=fp8_params) for lin in linears),
        "activations": sum(fp8_saved_bytes(recipe, lin, tokens, granule_bytes) for lin in linears),
        "temporaries": max(fp8_temporary_bytes(recipe, lin, tokens, granule_bytes) for lin in linears),
    }
    if fp8_params:
        for category, trains in (("frozen_weights", False), ("trainable_params", True)):
            saved = (fp8_weight_saving_bytes(x, weight_bytes_per_element, granule_bytes) for x in linears)
            out[category] = -sum(n for n, x in zip(saved, linears, strict=True) if x.trains_weight == trains)
    return {k: v for k, v in out.items() if v}


def fp8_depth_bytes(
    job: FineTuneJob, linears: Sequence[Sequence[LinearShape]], tokens: int, granule_bytes: int, t: float
) -> dict[str, int]:
    """`fp8_memory_bytes` of `job`'s recipe and weights at full depth, from the linears of the shallower and the
    deeper traced depth (`t`: their interpolation; the stored weights' savings stay negative); {} without FP8."""
    if job.fp8 == "none" or not linears:
        return {}
    a, b = (
        fp8_memory_bytes(
            job.fp8,
            lin,
            tokens,
            granule_bytes,
            fp8_params=job.fp8_params,
            weight_bytes_per_element=job.compute_bytes_per_element,
        )
        for lin in (linears[0], linears[-1])
    )
    return {c: round(a.get(c, 0) + (b.get(c, 0) - a.get(c, 0)) * t) for c in sorted(set(a) | set(b))}


def fp8_linears(
    named_modules: Iterable[tuple[str, object]], *, full: bool, sequence_parallel_tp: int = 1
) -> list[LinearShape]:
    """The linear layers FP8 converts: modules with in/out features (nn.Linear, PEFT's and tunecost's LoRA-wrapped
    linears), not the output head (`lm_head`: torchtitan's TOMLs and NeMo leave it in bf16), not LoRA factors and
    not a wrapper's inner base layer."""
    out = []
    for name, module in named_modules:
        parts = name.split(".")
        if not hasattr(module, "in_features") or not hasattr(module, "out_features"):
            continue
        if parts[-1] == "lm_head" or "base_layer" in parts or any(p.startswith("lora_") for p in parts):
            continue
        in_features, out_features, column_parallel = _local_features(module)
        divisor = sequence_parallel_tp if column_parallel else 1
        out.append(LinearShape(in_features, out_features, trains_weight=full, input_token_divisor=divisor))
    return out


def _local_features(module) -> tuple[int, int, bool]:
    """(in, out) features of a linear's weight on this rank (a tensor-parallel DTensor's local shard), and whether
    its output features are sharded (column-parallel)."""
    weight = getattr(getattr(module, "base_layer", module), "weight", None)
    local = getattr(weight, "_local_tensor", None)
    if local is None or local.dim() != 2:
        return int(module.in_features), int(module.out_features), False
    out_features, in_features = (int(n) for n in local.shape)
    return in_features, out_features, out_features < int(module.out_features)
