"""Named software stacks: what a training stack keeps in memory, as a documented set of behaviours.

Each stack names the simulator stack that reproduces it (``hf-peft``: transformers' model code with PEFT >= 0.7
LoRA under autocast and re-entrant checkpointing; ``hf-2024``: the paper's 2024 stack, see
`tunecost.simulate.hf2024`; ``tunecost``: tunecost's own leaner LoRA) and lists what the
real stack does that the simulation does not, so a prediction on such a row can be read for what it is.
A corpus row's `stack` column is matched to a stack by `stack_for`; an unknown stack is a skipped row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class Stack:
    name: str
    simulator_stack: str | None  # None: no simulator stack reproduces it (rows are skipped)
    kept_for_backward: str
    loss: str
    adapters: str
    allocator: str
    not_modelled: tuple[str, ...] = ()
    full_finetune_modelled: bool = True
    full_skip_reason: str = ""  # why full fine-tune rows are skipped, when they are
    skip_reason: str = ""


_HF_KEPT = (
    "with gradient checkpointing, each decoder layer's input (re-entrant torch.utils.checkpoint: transformers' "
    "default when the Trainer passes no gradient_checkpointing_kwargs) and the recomputed layer's activations "
    "during its backward; "
    "FlashAttention-2 / SDPA keep the attention output and fp32 log-sum-exp, no L x L scores"
)
STACKS: dict[str, Stack] = {
    "hf-trainer": Stack(
        name="hf-trainer",
        simulator_stack="hf-peft",
        kept_for_backward=_HF_KEPT,
        loss="logits in the compute dtype, upcast to fp32 inside the cross-entropy (transformers >= 4.45)",
        adapters="PEFT LoRA A/B in fp32; the layer input cast to fp32 and back to the compute dtype by autocast "
        "(that copy kept for backward); update added out of place; frozen base in bf16",
        allocator="caching allocator: reserved above allocated by the step's short-lived buffers",
        not_modelled=(
            "fp32 logits copies of transformers < 4.45 (one or two vocab x tokens fp32 tensors)",
            "accelerate/Trainer mixed-precision fp32 master weights for a full fine-tune (tunecost keeps "
            "parameters, gradients and AdamW states in the compute dtype)",
            "DataLoader pinned memory and NCCL buffers",
            "allocator fragmentation beyond a fixed reserve fraction",
            "LoRA dropout (PEFT's default is 0; a row's dropout is not in the corpus)",
        ),
    ),
    "hf-trainer-bnb": Stack(
        name="hf-trainer-bnb",
        simulator_stack="hf-peft",
        kept_for_backward=_HF_KEPT,
        loss="as hf-trainer",
        adapters="PEFT LoRA on bitsandbytes Linear4bit (nf4, double quantization), LoRA in fp32; 4-bit weights "
        "de-quantized per matrix into a temporary freed after each matmul",
        allocator="as hf-trainer",
        not_modelled=(
            "fms-acceleration's fused LoRA/4-bit kernels (the accelerated-peft-bnb plugin) that avoid the "
            "de-quantized temporary",
            "prepare_model_for_kbit_training's fp32 cast of norms and embeddings (when used)",
        ),
    ),
    "hf-2024": Stack(
        name="hf-2024",
        simulator_stack="hf-2024",
        kept_for_backward="re-entrant checkpointing; per-expert loop; padded to a multiple of 8",
        loss="fp32 logits and a shifted fp32 copy (transformers 4.40)",
        adapters="PEFT 0.7 Linear4bit LoRA (clones the input)",
        allocator="as hf-trainer",
    ),
    "qwen-finetune": Stack(
        name="qwen-finetune",
        simulator_stack="hf-peft",
        kept_for_backward=_HF_KEPT + " (Qwen's own model code: fused c_attn, flash-attn 2)",
        loss="Qwen's model code upcasts nothing: cross-entropy on compute-dtype logits",
        adapters="PEFT LoRA in fp32 (Qwen finetune.py), cast to bf16 in forward",
        allocator="as hf-trainer; the table reports whole-device memory",
        not_modelled=(
            "full-parameter runs use DeepSpeed ZeRO with fp32 master weights, fp32 optimizer states and "
            "gradient buckets (full fine-tune rows are skipped)",
            "Qwen's fused c_attn LoRA (one A/B over q, k, v) is modelled as LoRA on each of q, k, v",
            "the loss is simulated with transformers' Qwen2 code (its fp32 upcast), not Qwen's own",
        ),
        full_finetune_modelled=False,
        full_skip_reason="DeepSpeed ZeRO with fp32 master weights and optimizer states",
    ),
    "swift-2": Stack(
        name="swift-2",
        simulator_stack="hf-peft",
        kept_for_backward=_HF_KEPT,
        loss="as hf-trainer",
        adapters="PEFT LoRA in fp32 (swift 2.x on transformers + PEFT)",
        allocator="as hf-trainer",
        not_modelled=(
            "swift's own activation and logits handling differences are not known in detail",
            "full-parameter runs: their optimizer precision and sharding are not stated (rows skipped)",
        ),
        full_finetune_modelled=False,
        full_skip_reason="optimizer precision and sharding not stated",
    ),
    "torchtune": Stack(
        name="torchtune",
        simulator_stack=None,
        kept_for_backward="torchtune's own model code; activation checkpointing and offloading as recipe options",
        loss="chunked cross-entropy (optional)",
        adapters="torchtune LoRA and its own NF4 tensor",
        allocator="torch.compile changes what is kept",
        skip_reason="stack torchtune not modelled (own model code, compile, chunked cross-entropy, activation "
        "offload, own NF4)",
    ),
}

# The same Trainer running an MoE model with transformers' own expert code (a loop over experts, or the model's
# parallel-experts matmuls) instead of fused MoE kernels: its expert compute runs at its own efficiency, so its
# throughput rows calibrate apart from the dense models of hf-trainer.
STACKS["hf-trainer-no-moe-kernels"] = replace(
    STACKS["hf-trainer"],
    name="hf-trainer-no-moe-kernels",
    not_modelled=(
        *STACKS["hf-trainer"].not_modelled,
        "the expert code of the benchmark's transformers version (e.g. GraniteMoe's ParallelExperts in 4.x) is "
        "simulated with transformers 5.23's experts module",
    ),
)

_CORPUS_STACKS: tuple[tuple[str, str], ...] = (  # (substring of the corpus `stack` cell, stack name), first match
    ("accelerated-peft-bnb", "hf-trainer-bnb"),
    ("accelerated-peft-autogptq", "hf-trainer"),
    ("qwen finetune.py", "qwen-finetune"),
    ("swift 2", "swift-2"),
    ("torchtune", "torchtune"),
    ("hf-2024", "hf-2024"),
    ("no moe kernels", "hf-trainer-no-moe-kernels"),
    ("hf-transformers", "hf-trainer"),
)


def stack_for(corpus_stack: str, quantization: str = "none") -> Stack | None:
    """The named stack of a corpus row's `stack` cell (None: unknown). 4-bit bitsandbytes rows of a plain
    transformers stack are `hf-trainer-bnb`."""
    key = corpus_stack.strip().lower()
    if key in STACKS:
        name = key
    else:
        name = next((n for sub, n in _CORPUS_STACKS if sub in key), "")
    if not name:
        return None
    if name == "hf-trainer" and quantization == "bnb-nf4":
        name = "hf-trainer-bnb"
    return STACKS[name]
