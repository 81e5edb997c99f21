"""What to install in a model's MoE layers: the implementation names and the LoRA description.

No torch import here, so the CLI can list the names without paying for torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunecost.errors import unknown_name_error
from tunecost.workload.job import MOE_LORA_TARGETS, LoraConfig

# Names `install_experts` accepts (the profiler's `--experts-impl` choices).
#   stock            transformers' own fused experts (its `experts_implementation`, grouped_mm by default);
#                    with LoRA: PEFT `target_parameters` on the fused experts, i.e. the same as peft-fused.
#   peft-fused       PEFT LoRA (`lora.ParamWrapper`) on `mlp.experts.gate_up_proj`, `mlp.experts.down_proj`
#                    and `mlp.gate.weight`; needs a LoRA spec.
#   qlora-linear4bit the paper's QLoRA stack: one bitsandbytes `Linear4bit` (nf4, double quant) per expert
#                    projection w1/w3/w2, each with its own rank-r LoRA, a loop over the experts hit.
#   fast             tunecost's experts: tokens routed once, grouped GEMMs, LoRA on routed tokens only.
#   fast-4bit        `fast` with the frozen expert weights stored in nf4 (same as quantize_4bit=True).
EXPERT_IMPLS: tuple[str, ...] = ("stock", "peft-fused", "qlora-linear4bit", "fast", "fast-4bit")

# How the LoRA factors of the experts' gate and up projections are laid out.
#   fused           one rank-r adapter on the fused gate_up_proj (E, 2I, H): PEFT's `target_parameters` layout.
#   per-projection  rank r on w1 (gate) and rank r on w3 (up) separately, as PEFT <= 0.16 did on
#                   transformers 4.x per-expert `nn.Linear`s (the paper's stack).
EXPERT_LORA_LAYOUTS: tuple[str, ...] = ("fused", "per-projection")


@dataclass(frozen=True, kw_only=True)
class LoraSpec:
    """A LoRA adapter on the MoE layers (the paper: r 16, alpha 32, dropout 0, on w1, w2, w3 and gate).

    rank: the LoRA rank r of every adapted weight.
    alpha: LoRA alpha; the update is scaled by alpha / rank (PEFT's default, no rsLoRA).
    targets: which MoE weights get LoRA: "experts" (gate, up and down projections of every expert)
        and/or "router" (the router weight, shape (E, H)).
    expert_layout: "fused", "per-projection", or None for the implementation's own layout (fused for
        peft-fused and fast, per-projection for qlora-linear4bit; see `EXPERT_LORA_LAYOUTS`).
    """

    rank: int = 16
    alpha: float = 32
    targets: tuple[str, ...] = ("experts", "router")
    expert_layout: str | None = None

    def __post_init__(self) -> None:
        LoraConfig(rank=self.rank, alpha=self.alpha, targets=self.targets)  # a job's LoRA checks, then the MoE layers'
        for target in self.targets:
            if target not in MOE_LORA_TARGETS:
                raise unknown_name_error("LoRA target", target, MOE_LORA_TARGETS)
        if self.expert_layout is not None and self.expert_layout not in EXPERT_LORA_LAYOUTS:
            raise unknown_name_error("expert LoRA layout", self.expert_layout, EXPERT_LORA_LAYOUTS)

    @classmethod
    def from_config(cls, lora: LoraConfig, *, expert_layout: str | None = None) -> LoraSpec:
        """The MoE adapters of a job's LoRA (`FineTuneJob.lora`) plus the installer's own layout option; a target
        outside the MoE layers (attention, mlp) is an error naming the ones supported here."""
        return cls(rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets), expert_layout=expert_layout)

    @property
    def scaling(self) -> float:
        """The factor s in y = xW + s (xA)B."""
        return self.alpha / self.rank

    @property
    def on_experts(self) -> bool:
        return "experts" in self.targets

    @property
    def on_router(self) -> bool:
        return "router" in self.targets


def peft_lora_config(lora: LoraSpec, *, target_modules: list[str], target_parameters: list[str] | None = None) -> Any:
    """PEFT's `LoraConfig` for `lora` (its rank and alpha, no dropout) on the given modules or parameters."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft annotates int; it only divides by it
        lora_dropout=0.0,
        target_modules=target_modules,
        target_parameters=target_parameters,
    )
