"""The throughput prior of a software stack nobody calibrated: the GEMM efficiency of its family's calibrated
(stack, GPU) groups in the shipped corpus (`catalog.held_out_errors`), and the interval its held-out errors give.

`validate` predicts a corpus row alone in its (stack, GPU) with it; `estimate` scales the calibrated model by it.
Sources and derivations: docs/validation.md ("A stack nobody calibrated"), docs/throughput-model.md ("The interval").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tunecost.catalog.held_out_errors import (
    PRIOR_KIND,
    HeldOutError,
    StackEfficiency,
    held_out_errors,
    quantity_class,
    stack_efficiencies,
)
from tunecost.errors import TunecostError
from tunecost.estimate.conformal import INTERVAL_LEVEL, MIN_STACK_ERRORS, conformal_halfwidth
from tunecost.models.catalog import resolve_model

FITTED_PARAMETER = "gemm_efficiency"  # the one stack parameter a (stack, GPU) group calibrates
CALIBRATED_FAMILY = "hf-eager"  # the family of the paper's stack (hf-2024), the throughput model's calibration
INTERVAL_KIND = "stack not calibrated"  # the kind its half-width is listed under (`Prediction.interval_kinds`)
TE_LAYERS_FAMILY = "nemo-te"  # Megatron Core's Transformer Engine layers: fused element-wise work (`counts`)
LORA_COMPUTE_DTYPE_FAMILIES = ("torchtune", TE_LAYERS_FAMILY)  # LoRA adapters in the compute dtype (`counts`)

# The family a stack's efficiency is borrowed from when no row of it calibrates (docs/validation.md).
STACK_FAMILIES = {
    "hf-trainer": "hf-eager",
    "hf-trainer-bnb": "hf-eager",
    "hf-trainer-no-moe-kernels": "hf-eager",
    "trl-sft-bnb": "hf-eager",
    "hf-2024": "hf-eager",
    "qwen-finetune": "hf-eager",
    "swift-2": "hf-eager",
    "nemo-automodel": "hf-eager",
    "unsloth": "fused-kernels",
    "torchtune": "torchtune",
    "litgpt": "torchtune",
    "nemo": "nemo-te",
}
# The family of the stack that runs a framework's config (the `workload.frameworks` readers' names)
FRAMEWORK_FAMILIES = {
    "llamafactory": "hf-eager",
    "llamafactory-v1": "hf-eager",  # transformers modules and PEFT in its own loop
    "llamafactory-megatron": "nemo-te",  # its USE_MCA / USE_MEGATRON_BRIDGE backends: Megatron Core on TE
    "axolotl": "hf-eager",
    "hf-training-args": "hf-eager",
    "peft-lora": "hf-eager",
    "bitsandbytes": "hf-eager",
    "accelerate": "hf-eager",
    "deepspeed": "hf-eager",
    "torchtune": "torchtune",
    "litgpt": "torchtune",
    "torchtitan": "torchtune",  # plain PyTorch modules and optimizer, as torchtune's
    "nemo": "nemo-te",
    "megatron-lm": "nemo-te",
}


def stack_family(stack: str, stack_cell: str = "") -> str:
    """A named stack's family; a cell naming fused kernels (e.g. a plugin of them) makes its own family."""
    if "fused" in stack_cell.lower() or "liger" in stack_cell.lower():
        return "fused-kernels"
    return STACK_FAMILIES.get(stack, "hf-eager")


def framework_family(framework: str) -> str:
    """The family of the stack a config's framework runs; of frameworks read together ("hf-training-args+deepspeed"),
    the first one outside the calibrated family. An unknown framework is an error."""
    families = []
    for name in framework.split("+"):
        if name not in FRAMEWORK_FAMILIES:
            raise TunecostError(f"framework {name!r} is not one of {', '.join(FRAMEWORK_FAMILIES)}")
        families.append(FRAMEWORK_FAMILIES[name])
    return next((f for f in families if f != CALIBRATED_FAMILY), CALIBRATED_FAMILY)


def job_family(stack: str, framework: str | None = None) -> str:
    """The family of a job's software: its framework's where that is not the calibrated one, else its stack's."""
    family = framework_family(framework) if framework else CALIBRATED_FAMILY
    return family if family != CALIBRATED_FAMILY else stack_family(stack)


@dataclass(frozen=True)
class FamilyEfficiency:
    value: float  # the median GEMM efficiency of the groups
    family: str  # whose groups: the family asked for, or "every family" when it has none
    groups: int


def family_efficiency(
    efficiencies: Sequence[StackEfficiency], family: str, exclude_stack: str = ""
) -> FamilyEfficiency | None:
    """The median GEMM efficiency of the groups of `family` (of every group when the family has none; a median,
    so that one stack the counts miss does not move it), leaving out `exclude_stack`'s; None without any."""
    others = [e for e in efficiencies if e.stack != exclude_stack]
    pool = [e for e in others if e.family == family] or others
    if not pool:
        return None
    effs = sorted(e.gemm_efficiency for e in pool)
    eff = math.sqrt(effs[(len(effs) - 1) // 2] * effs[len(effs) // 2])
    return FamilyEfficiency(eff, family if pool[0].family == family else "every family", len(pool))


def prior_efficiency(
    efficiencies: Sequence[StackEfficiency], stack: str, stack_cell: str = ""
) -> tuple[float, str] | None:
    """The GEMM efficiency of a corpus stack's family learned from the other stacks' groups
    (`family_efficiency`), with what it was learned from; None without any."""
    prior = family_efficiency(efficiencies, stack_family(stack, stack_cell), exclude_stack=stack)
    if prior is None:
        return None
    return prior.value, (
        f"{PRIOR_KIND} {FITTED_PARAMETER} {prior.value:.3f}: {prior.family}, {prior.groups} (stack, GPU) groups "
        "of other stacks"
    )


@dataclass(frozen=True)
class StackPrior:
    """How a job of a family nobody calibrated departs from the calibrated model's prediction."""

    family: str
    factor: float  # on throughput: the family's prior efficiency over the calibrated family's
    log_halfwidth: float  # added in quadrature to the interval's, on log throughput
    basis: str
    note: str


def model_kind(model: str) -> str:
    """dense or moe: the held-out errors of a prior are pooled per kind of model (`prior_errors`)."""
    return "moe" if resolve_model(model).is_moe else "dense"


def prior_errors(
    errors: Sequence[HeldOutError], kind: str, leave_out: tuple[str, str] | None = None
) -> tuple[list[float], str]:
    """The held-out throughput errors of rows predicted from their family's prior, of models of `kind` where
    the corpus has `MIN_STACK_ERRORS` of them (Mondrian split-conformal: a kind known before the prediction), else
    of every row; `leave_out` (source, id) is the row being predicted. With what they are, in words."""
    pool = [
        e
        for e in errors
        if e.kind == PRIOR_KIND and quantity_class(e.quantity) == "throughput" and (e.source, e.id) != leave_out
    ]
    same = [e.log_error for e in pool if e.model_kind == kind]
    if len(same) >= MIN_STACK_ERRORS:
        return same, f"{len(same)} held-out rows of {kind} models predicted from their family's prior"
    return [e.log_error for e in pool], f"{len(pool)} held-out rows predicted from their family's prior"


def stack_prior(
    stack: str,
    framework: str | None = None,
    efficiencies: Sequence[StackEfficiency] | None = None,
    errors: Sequence[HeldOutError] | None = None,
    level: float = INTERVAL_LEVEL,
    kind: str = "dense",
) -> StackPrior | None:
    """The prior of the job's family from `efficiencies` and the held-out throughput `errors` of that kind
    (default: the shipped ones) for a model of `kind` (dense or moe); None for the calibrated family."""
    family = job_family(stack, framework)
    if family == CALIBRATED_FAMILY:
        return None
    effs = stack_efficiencies() if efficiencies is None else efficiencies
    prior, base = family_efficiency(effs, family), family_efficiency(effs, CALIBRATED_FAMILY)
    factor = prior.value / base.value if prior and base else 1.0
    held = held_out_errors() if errors is None else errors
    pool, what = prior_errors(held, kind)
    h = conformal_halfwidth(pool, what, level) if pool else None
    runs = f"stack {stack}" + (f" from a {framework} config" if framework else "")
    widened = f"±{100 * math.expm1(h.value):.0f} % ({what})" if h else "not at all (no held-out errors of its kind)"
    layers = (
        "; its step counts the element-wise work of Megatron Core's Transformer Engine layers (fused norms and "
        "rotary, packed attention)"
        if family == TE_LAYERS_FAMILY
        else ""
    )
    note = (
        f"throughput: {runs} (family {family}) is not calibrated: {_prior_words(family, prior, base, factor)}; "
        f"95 % interval widened by {widened}{layers}"
    )
    return StackPrior(family, factor, h.value if h else 0.0, h.basis if h else "no held-out errors", note)


def _prior_words(family: str, prior: FamilyEfficiency | None, base: FamilyEfficiency | None, factor: float) -> str:
    if prior is None or base is None:
        return "no calibrated group to learn a prior from, throughput as calibrated"
    whose = (
        f"its family's prior ({FITTED_PARAMETER} {prior.value:.3f}, {prior.groups} (stack, GPU) groups)"
        if prior.family == family
        else f"no group of its family: the prior is every family's median ({FITTED_PARAMETER} {prior.value:.3f}, "
        f"{prior.groups} groups)"
    )
    return f"{whose} over the calibrated family's ({CALIBRATED_FAMILY}, {base.value:.3f}): throughput x {factor:.2f}"
