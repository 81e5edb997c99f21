"""The software stacks the step simulator reproduces, each one record of where its code differs from tunecost's own
(docs/memory-model.md describes each)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class StackSpec:
    name: str
    lora_style: str  # how its LoRA linear adds the update (`simulate.modules.SimLinear`)
    reentrant_checkpointing: bool = False  # torch.utils.checkpoint re-entrant (transformers' default), else per layer
    per_expert_loop: bool = False  # MoE experts run one by one (transformers 4.40's Mixtral code, PEFT 0.7)
    pads_lengths: bool = False  # lengths padded to `lengths.PAD_TO_MULTIPLE_OF` (LLaMA-Factory's collator)
    loss_upcast_in_model: bool = False  # the model's forward upcasts the logits (transformers 4.40's loss)
    torchtune_recipes: bool = False  # torchtune's losses, offload, optimizer in backward, fused AdamW, bf16 adapters
    hf_trainer: bool = False  # run by the HF Trainer: TRL's chunked loss and activation offload are what it names
    activation_offload: bool = False  # a recipe of it offloads activations (torchtune's, TRL's)
    trl_chunked_loss: bool = True  # TRL's chunked_nll loss can run on its model code
    liger: bool = True  # Liger's kernels (applied by the HF Trainer) can run on it
    int8_lora: bool = True  # bitsandbytes LLM.int8 base weights under LoRA
    gptq: bool = True  # auto-gptq int4 base weights
    fp32_qlora: bool = True  # QLoRA with fp32 compute
    transformers_models_only: bool = False  # models from transformers' code only (not BlackMamba's)
    # the simulator's note of what it does beyond tunecost's own stack ("": nothing): {checkpointing} is
    # `checkpointing_note` where the stack's own checkpointing applies, {moe} is `moe_note` for an MoE model
    note: str = ""
    checkpointing_note: str = ""
    moe_note: str = ""

    def describe(self, *, own_checkpointing: bool, moe: bool) -> str:
        """The note on this stack for one job ("" for tunecost's own)."""
        checkpointing = self.checkpointing_note if own_checkpointing else ""
        return self.note.format(checkpointing=checkpointing, moe=self.moe_note if moe else "")


def _no_todays_hf_extras(spec: StackSpec) -> StackSpec:
    """`spec` without what runs only on today's transformers/PEFT code: TRL's chunked loss, Liger's kernels,
    bitsandbytes' 8-bit LoRA."""
    return replace(spec, trl_chunked_loss=False, liger=False, int8_lora=False)


STACK_SPECS: dict[str, StackSpec] = {
    s.name: s
    for s in (
        StackSpec(name="tunecost", lora_style="tunecost"),  # today's transformers/PEFT with tunecost's experts
        _no_todays_hf_extras(
            StackSpec(  # the paper's 2024 LLaMA-Factory stack (transformers 4.40, PEFT 0.7)
                name="hf-2024",
                lora_style="peft-2024",
                reentrant_checkpointing=True,
                per_expert_loop=True,
                pads_lengths=True,
                loss_upcast_in_model=True,
                gptq=False,
                fp32_qlora=False,
                note="hf-2024 stack: per-expert loop, PEFT 0.7 Linear4bit LoRA (clone), fp32 logits copies in the "
                "loss, {checkpointing}lengths padded to a multiple of 8",
                checkpointing_note="re-entrant checkpointing, ",
            )
        ),
        StackSpec(  # transformers + PEFT LoRA without tunecost's experts, under the HF Trainer
            name="hf-peft",
            lora_style="peft",
            reentrant_checkpointing=True,
            hf_trainer=True,
            activation_offload=True,
            note="hf-peft stack: PEFT >= 0.7 LoRA Linear under autocast (input cast to the fp32 adapter dtype and "
            "back, update added out of place){checkpointing}",
            checkpointing_note=", re-entrant checkpointing (transformers' default)",
        ),
        _no_todays_hf_extras(
            StackSpec(  # torchtune's single-device recipes
                name="torchtune",
                lora_style="torchtune",
                torchtune_recipes=True,
                activation_offload=True,
                transformers_models_only=True,
                note="torchtune stack: its single-device recipes (LoRALinear with the update added out of place, "
                "{checkpointing}its loss); transformers' model code stands for torchtune's own{moe}",
                checkpointing_note="non-re-entrant checkpoint_wrapper per layer, ",
                moe_note="; routed experts as tunecost's grouped experts (fp32 adapters)",
            )
        ),
    )
}
