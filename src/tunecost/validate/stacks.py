"""Named software stacks: what a training stack keeps in memory, as a documented set of behaviours.

Sources and derivations: docs/validation.md, section `tunecost.validate.stacks`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tunecost.simulate.behaviour import (
    ADAMW_FUSED,
    ADAMW_TORCH_20,
    DeepSpeedZero2,
)
from tunecost.workload.job import DEFAULT_STACK
from tunecost.workload.stacks import STACK_SPECS, StackSpec


@dataclass(frozen=True, kw_only=True)
class Stack:
    name: str
    simulator_stack: str | None  # None: no simulator stack reproduces it (rows are skipped)
    kept_for_backward: str
    loss: str
    adapters: str
    allocator: str
    not_modelled: tuple[str, ...] = ()
    kbit_fp32_norms: bool = False  # prepare_model_for_kbit_training + TRL's bf16 recast on one GPU
    full_finetune_modelled: bool = True
    full_skip_reason: str = ""  # why full fine-tune rows are skipped, when they are
    skip_reason: str = ""
    qlora_deepspeed_zero2: DeepSpeedZero2 | None = None  # single-GPU QLoRA rows run DeepSpeed ZeRO-2 in fp16
    # single-GPU full fine-tune rows run DeepSpeed ZeRO-2 (bf16): their memory is one rank of the zero2 strategy
    full_deepspeed_zero2: DeepSpeedZero2 | None = None
    adamw_impl: str = ""  # the AdamW of the stack's torch (`behaviour.ADAMW_IMPLS`; "": the installed torch's)
    tp_impl: str = "torchtitan"  # whose tensor parallelism its TP rows run (`workload.parallel.TP_IMPLS`)
    sp_with_tp: str = ""  # why its TP rows run sequence parallelism where the row does not say ("": they do not)
    # the layers its PP rows' stages count the embedding and the head as (`ModelParallel.stage_weights`)
    stage_weights: tuple[int, int] = (1, 1)
    # the training loop runs each micro-batch but an optimizer step's last under DDP / FSDP `no_sync` (transformers'
    # Trainer through accelerate's `no_sync`, DeepSpeed excepted): one gradient reduction per optimizer step
    no_sync_accumulation: bool = False
    fsdp: str = "fsdp1"  # the FSDP its rows run where they say "FSDP" without a version (torchtune: FSDP2)

    @property
    def simulator_spec(self) -> StackSpec:
        """The record of the simulator stack its rows run on (tunecost's where it names none)."""
        return STACK_SPECS[self.simulator_stack or DEFAULT_STACK]

    def deepspeed_for(self, method: str, num_gpus: int) -> DeepSpeedZero2 | None:
        """The DeepSpeed ZeRO-2 engine a single-GPU row of `method` runs under this stack (None: no DeepSpeed)."""
        if num_gpus != 1:
            return None
        return {"qlora": self.qlora_deepspeed_zero2, "full": self.full_deepspeed_zero2}.get(method)


# Qwen (1.0)'s finetune/ds_config_zero2.json: reduce_bucket_size 2e8, overlap_comm true, contiguous_gradients true
_QWEN_DS_ZERO2 = DeepSpeedZero2(reduce_bucket_elements=200_000_000, overlap_comm=True)


_HF_KEPT = (
    "with gradient checkpointing, each decoder layer's input (re-entrant torch.utils.checkpoint: transformers' "
    "default when the Trainer passes no gradient_checkpointing_kwargs) and the recomputed layer's activations "
    "during its backward; "
    "FlashAttention-2 / SDPA keep the attention output and fp32 log-sum-exp, no L x L scores"
)
_FSDP1_KEPT = (
    "; under accelerate FSDP (torch FSDP1) with LoRA / QLoRA, every recomputed layer's input and its gradient stay "
    "allocated until the end of backward (FSDP1's reshard-only post-backward hook on the checkpoint's detached layer "
    "input: rows on several GPUs are ranks of the fsdp1 strategy, `distributed.fsdp1`)"
)
_HF_LOSS = (
    "as the row's transformers version: >= 4.49 one fp32 copy of the logits inside the cross-entropy's input (labels "
    "padded, no shifted copy); 4.46-4.48 (loss_utils.ForCausalLMLoss) an fp32 copy and a contiguous shifted fp32 "
    "copy; 4.40-4.45 the model's forward upcasts the logits, then a shifted fp32 copy. Qwen (1.0) models run "
    "their own remote code: a shifted copy in the compute dtype, cast to fp32 by autocast in the cross-entropy"
)
_BNB_ADAPTERS = (
    "PEFT LoRA on bitsandbytes Linear4bit (nf4, double quantization), LoRA in fp32; 4-bit weights de-quantized per "
    "matrix into a temporary freed after each matmul; Linear4bit casts its input to the compute dtype and its output "
    "back to the input's dtype"
)
_BNB_NOT_MODELLED = (
    "PEFT 0.13's Linear4bit LoRA forward under autocast (a defensive clone of the 4-bit output, no fp32 copy of the "
    "input) is simulated as PEFT's Linear LoRA (fp32 then compute-dtype copy of the input)",
)
STACKS: dict[str, Stack] = {
    "hf-trainer": Stack(
        name="hf-trainer",
        no_sync_accumulation=True,
        simulator_stack="hf-peft",
        kept_for_backward=_HF_KEPT + _FSDP1_KEPT,
        loss=_HF_LOSS,
        adapters="PEFT LoRA A/B in fp32; the layer input cast to fp32 and back to the compute dtype by autocast "
        "(that copy kept for backward); update added out of place; frozen base in bf16",
        allocator="PyTorch's caching allocator, default settings (replayed over the step: tunecost.simulate.allocator)",
        not_modelled=(
            "the loss code of transformers < 4.40 (the row's version is read from stack_versions; an unstated "
            "version is simulated as >= 4.49)",
            "accelerate/Trainer mixed-precision fp32 master weights for a full fine-tune (tunecost keeps "
            "parameters, gradients and AdamW states in the compute dtype)",
            "DataLoader pinned memory and NCCL buffers",
            "allocations the trace does not see (inside ops, library workspaces, loading the weights)",
            "LoRA dropout (PEFT's default is 0; a row's dropout is not in the corpus)",
            "FSDP1's host work per wrapped unit on several GPUs (PEFT's auto-wrap policy makes every LoRA Linear a "
            "unit: its hooks, small collectives and the all-gather rate limiter's waits); the step's communication "
            "is timed per decoder layer",
        ),
    ),
    "hf-trainer-bnb": Stack(
        name="hf-trainer-bnb",
        no_sync_accumulation=True,
        simulator_stack="hf-peft",
        kept_for_backward=_HF_KEPT + _FSDP1_KEPT,
        loss="as hf-trainer",
        adapters=_BNB_ADAPTERS + "; norms, embeddings and lm_head stay in the compute dtype (fms-acceleration's "
        "accelerated-peft-bnb plugin prepares the model with its own copy of prepare_model_for_kbit_training "
        "without the fp32 cast)",
        allocator="as hf-trainer",
        not_modelled=(
            *_BNB_NOT_MODELLED,
            "prepare_model_for_kbit_training's fp32 cast where a script calls it outside TRL (see trl-sft-bnb)",
        ),
    ),
    "trl-sft-bnb": Stack(
        name="trl-sft-bnb",
        no_sync_accumulation=True,
        simulator_stack="hf-peft",
        kept_for_backward=_HF_KEPT + "; with fp32 norms the residual stream, and so every checkpointed layer "
        "input from the second layer on, is fp32" + _FSDP1_KEPT,
        loss="as hf-trainer",
        adapters=_BNB_ADAPTERS + "; TRL's SFTTrainer (0.13, bf16, one GPU) runs PEFT's "
        "prepare_model_for_kbit_training (peft 0.13: every non-4-bit fp16/bf16 parameter to fp32) and then "
        "peft_module_casting_to_bf16 (embeddings and lm_head back to bf16, norms kept fp32): norm outputs and "
        "4-bit layer outputs are fp32, attention runs on bf16 copies (fms-acceleration's baseline-peft-bnb)",
        allocator="as hf-trainer",
        not_modelled=(
            *_BNB_NOT_MODELLED,
            "under FSDP TRL skips the preparation (sharded 4-bit weights): multi-GPU rows are simulated without it",
            "inside routed experts the fp32 activations are simulated in the compute dtype (the block's output is "
            "fp32, as per-expert Linear4bit gives)",
        ),
        kbit_fp32_norms=True,
    ),
    "hf-2024": Stack(
        name="hf-2024",
        no_sync_accumulation=True,
        simulator_stack="hf-2024",
        kept_for_backward="re-entrant checkpointing; per-expert loop; padded to a multiple of 8",
        loss="fp32 logits and a shifted fp32 copy (transformers 4.40)",
        adapters="PEFT 0.7 Linear4bit LoRA (clones the input)",
        allocator="as hf-trainer",
    ),
    "qwen-finetune": Stack(
        name="qwen-finetune",
        no_sync_accumulation=True,
        simulator_stack="hf-peft",
        kept_for_backward=_HF_KEPT + " (Qwen's own model code: fused c_attn, flash-attn 2; its re-entrant "
        "torch.utils.checkpoint call per block)",
        loss="Qwen's own model code (modeling_qwen.py): a contiguous shifted copy of the compute-dtype logits, "
        "cast to fp32 by autocast inside CrossEntropyLoss for bf16 LoRA (Trainer autocast); for Q-LoRA, run under "
        "DeepSpeed fp16 (no autocast), the shifted copy, log-softmax and its gradient stay in fp16",
        adapters="full parameters (finetune/finetune_ds.sh: --bf16 True --deepspeed finetune/ds_config_zero2.json, "
        "torchrun on each GPU, one here): DeepSpeed ZeRO-2 in bf16 without autocast, one rank of the zero2 strategy "
        "(fp32 master weights and AdamW states, gradient buckets through each backward, the step's flat gradient "
        "copies: `distributed.rank_memory`); "
        "PEFT 0.5.0 LoRA (pinned in Qwen's docker/Dockerfile; its layers are moved to the device, not "
        "cast: fp32) on bf16 weights under the Trainer's autocast, updated by the Trainer's torch AdamW on PyTorch "
        "2.0 (multi-tensor: sqrt(v) and denom, two temporaries the size of the trainable tensors); Q-LoRA "
        "(finetune/finetune_qlora_single_gpu.sh: --fp16 --deepspeed finetune/ds_config_zero2.json, which "
        "finetune.py forces on one GPU) on auto-gptq's "
        "cuda-old QuantLinear under DeepSpeed ZeRO-2 in fp16: the whole model and the LoRA factors cast to fp16, "
        "fp32 master copy and AdamW states of the factors updated by DeepSpeed's FusedAdam (no temporaries), fp16 "
        "gradient buckets (reduce_bucket_size 2e8, overlap_comm: two) alive through each backward",
        allocator="as hf-trainer; the table reports whole-device memory",
        not_modelled=(
            "the throughput of full-parameter runs (DeepSpeed's own optimizer step on fp32 master weights; those rows "
            "are skipped)",
            "Qwen's fused c_attn LoRA (one A/B over q, k, v) is modelled as LoRA on each of q, k, v",
            "the rest of Qwen's own model code (fused c_attn, its RMSNorm and rotary kernels) is simulated with "
            "transformers' Qwen2 code",
            "LoRA dropout 0.05 (finetune.py's default: a mask and a dropped copy of each adapter input inside the "
            "recomputed layer, three kernels per adapter a step; with those kernels the counts exceed the measured "
            "step of a row at full GEMM efficiency, so the rows are run without it)",
            "PEFT 0.5.0's GPTQ LoRA forward clones the QuantLinear output before adding the update (inside the "
            "recomputed layer only)",
            "DeepSpeed's step-time fp32 copy of the gradient partition and its fp16 gradient copy during the "
            "backward epilogue (4 + 2 bytes per trainable parameter, transient)",
            "device memory outside the step: CUDA context and kernels of the stack (flash-attn, auto-gptq) beyond the "
            "assumed context, memory the caching allocator kept from loading the model",
        ),
        full_finetune_modelled=False,
        full_skip_reason="DeepSpeed ZeRO with fp32 master weights and optimizer states",
        # finetune/finetune_qlora_single_gpu.sh and finetune_ds.sh (full parameters) both pass ds_config_zero2.json
        qlora_deepspeed_zero2=_QWEN_DS_ZERO2,
        full_deepspeed_zero2=_QWEN_DS_ZERO2,
        adamw_impl=ADAMW_TORCH_20,  # the Trainer's adamw_torch on PyTorch 2.0 (README; docker/Dockerfile 2.0.1)
    ),
    "swift-2": Stack(
        name="swift-2",
        no_sync_accumulation=True,
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
    "unsloth": Stack(
        name="unsloth",
        simulator_stack=None,
        kept_for_backward="unsloth's gradient checkpointing, which offloads each layer's input to host memory",
        loss="unsloth's fused (chunked) cross-entropy kernel",
        adapters="unsloth's own Triton LoRA, RoPE and RMSNorm kernels on transformers' models",
        allocator="as hf-trainer",
        skip_reason="stack unsloth not modelled (own Triton LoRA, RoPE, RMSNorm and cross-entropy kernels; "
        "checkpointed layer inputs offloaded to host memory)",
    ),
    "torchtune": Stack(
        name="torchtune",
        simulator_stack="torchtune",
        fsdp="fsdp2",  # its distributed recipes shard with FSDP2's fully_shard, not accelerate's FSDP1
        kept_for_backward="with activation checkpointing (`enable_activation_checkpointing`), each layer's input "
        "through torch's non-re-entrant checkpoint_wrapper and the recomputed layer's activations during its "
        "backward; SDPA keeps the attention output and its log-sum-exp; with activation offload "
        "(`enable_activation_offloading`, named in the row), every saved tensor of 1024 bytes or more copied to "
        "host memory, the last five kept on the device while their copies run, the output projection's kept; with "
        "optimizer in backward (`optimizer_in_bwd`, named in the row) each parameter stepped as soon as its "
        "gradient is complete and the gradient freed; on several GPUs, one rank of the fsdp2 strategy (torchtune's "
        "distributed recipes shard with FSDP2's fully_shard)",
        loss="the output projection upcast to fp32 in the model (`self.output(h).float()`), labels shifted by the "
        "recipe, cross-entropy on the fp32 logits; with chunked cross-entropy (CEWithChunkedOutputLoss, named in the "
        "row) the compute-dtype logits of 8 chunks along the sequence, each upcast inside its own cross-entropy",
        adapters="torchtune's LoRALinear built in the compute dtype (bf16 adapters, no autocast), update added out "
        "of place; QLoRA on torchao's NF4Tensor (block 64, scales double-quantized per 256: bitsandbytes' nf4 with "
        "double quantization, de-quantized per matmul); full fine-tune in bf16 (parameters, gradients, AdamW states); "
        "torch AdamW with fused=True (the recipes' configs)",
        allocator="as hf-trainer; torchtune logs the peak of active bytes, which the allocated peak stands for",
        not_modelled=(
            "torch.compile's memory (rows skipped: Inductor's partitioner chooses what the forward keeps; its "
            "throughput counts the fused element-wise kernels)",
            "torchtune's own model code is simulated with transformers' (same tensors for Llama-style models, "
            "not checked op for op)",
            "LinearCrossEntropyLoss (the newer chunked loss with the output projection inside it)",
            "packing's document masks: a packed batch is simulated as full sequences under one causal mask",
            "activation offload's backward stream stash (a brought-back tensor kept until the next autograd node)",
        ),
        adamw_impl=ADAMW_FUSED,
    ),
}

# litgpt (Lightning Fabric, `precision: bf16-true`) builds its LoRA layers in the compute dtype with no autocast and
# checkpoints layers non-re-entrantly (FSDP's activation_checkpointing_policy): the torchtune simulator stack.
STACKS["litgpt"] = replace(
    STACKS["torchtune"],
    name="litgpt",
    loss="simulated as torchtune's: fp32 logits and cross-entropy (litgpt computes the bf16 logits in chunks of 128 "
    "tokens, `lm_head_chunk_size`, and its chunked_cross_entropy on them)",
    adapters="litgpt's LoRA (lora.py) in bf16 under bf16-true, update added out of place; QLoRA through "
    "bitsandbytes' Linear4bit (`--quantize bnb.nf4`), simulated as torchtune's NF4",
    not_modelled=(
        "litgpt's own model code is simulated with transformers' (same tensors for Llama-style models)",
        "the bf16 (not fp32) log-softmax of its chunked cross-entropy",
        "bf16-mixed precision (fp32 weights with autocast) when a row sets it",
    ),
    adamw_impl="",
)
# NeMo Automodel fine-tunes transformers' models with its own loop (FSDP2 on several GPUs) and its own LoRA layers.
STACKS["nemo-automodel"] = replace(
    STACKS["hf-trainer"],
    name="nemo-automodel",
    no_sync_accumulation=False,  # its own loop, not the Trainer's
    not_modelled=(
        "NeMo Automodel's own training loop, LoRA layers and loss are simulated as transformers + PEFT under the "
        "Trainer (re-entrant checkpointing, fp32 adapters under autocast)",
        *STACKS["hf-trainer"].not_modelled[2:],
    ),
)

# NeMo / Megatron-LM (Megatron Core with Transformer Engine): bf16 weights and gradients, fp32 main weights and Adam
# states (sharded over the data-parallel ranks by its distributed optimizer: tunecost's zero1), non-re-entrant
# recomputation; simulated on transformers' model code under the torchtune stack's behaviours.
STACKS["nemo"] = replace(
    STACKS["torchtune"],
    name="nemo",
    kept_for_backward="with recomputation (`recompute_granularity`), each layer's input and the recomputed layer's "
    "activations during its backward; FlashAttention keeps the attention output and its log-sum-exp; with selective "
    "recomputation, everything but the core attention's own (recomputed from its query, key and value)",
    loss="the vocabulary-parallel cross-entropy on fp32 logits",
    adapters="NeMo's LoRA adapters (`peft_scheme: lora`) in the compute dtype",
    not_modelled=(
        "Megatron Core's and Transformer Engine's own layers (fused norms, fused attention, fused bias and "
        "activation) are simulated with transformers' model code (their element-wise traffic is counted as "
        "fused in the step time)",
        "Transformer Engine's FP8 weight caches unless the job's FP8 is modelled",
    ),
    adamw_impl=ADAMW_FUSED,
    tp_impl="megatron",
    stage_weights=(0, 0),  # Megatron Core's default (account_for_embedding/loss_in_pipeline_split off)
    # NVIDIA/NeMo@e8509a92 scripts/performance/helpers.py, set_primary_perf_configs: sequence_parallel = tp_size > 1
    sp_with_tp="as NeMo's performance scripts set it (the row does not say)",
)

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

_FRAMEWORK_STACKS = {"baseline-peft-bnb": "trl-sft-bnb"}  # fms-acceleration framework (row notes) -> stack
# Frameworks that fine-tune with transformers' Trainer and PEFT are the HF Trainer stacks, read in their code:
# LLaMA-Factory (model_utils/checkpointing.py `prepare_model_for_training`: re-entrant checkpointing by default,
# layer norms upcast only with `upcast_layernorm`, off by default; trainable adapters cast to fp32) and axolotl
# (utils/models.py: QLoRA runs prepare_model_for_kbit_training, then casts the norms, embeddings and lm_head back to
# the compute dtype "for flash-attn compatibility" whenever an adapter is trained) keep no fp32 norms: hf-trainer-bnb
# for their 4-bit rows. TRL's SFTTrainer prepares a 4-bit model itself (fp32 norms on one GPU): trl-sft-bnb.
# unsloth (its own kernels, also inside LLaMA-Factory when enabled) is named first, so that it is never read as one.
_CORPUS_STACKS: tuple[tuple[str, str], ...] = (  # (substring of the corpus `stack` cell, stack name), first match
    ("unsloth", "unsloth"),
    ("accelerated-peft-bnb", "hf-trainer-bnb"),
    ("accelerated-peft-autogptq", "hf-trainer"),
    ("qwen finetune.py", "qwen-finetune"),
    ("swift 2", "swift-2"),
    ("torchtune", "torchtune"),
    ("litgpt", "litgpt"),
    ("lit-gpt", "litgpt"),
    ("automodel", "nemo-automodel"),
    ("nemo", "nemo"),
    ("megatron", "nemo"),
    ("mcore", "nemo"),  # Megatron Core
    ("m-core", "nemo"),
    ("hf-2024", "hf-2024"),
    ("no moe kernels", "hf-trainer-no-moe-kernels"),
    ("llama-factory", "hf-trainer"),
    ("llamafactory", "hf-trainer"),
    ("axolotl", "hf-trainer"),
    ("hf-transformers", "hf-trainer"),
    ("transformers", "hf-trainer"),
    # the Hugging Face libraries named without "transformers": their training runs transformers' models
    ("hugging face", "hf-trainer"),
    ("huggingface", "hf-trainer"),
    ("hf trainer", "hf-trainer"),
    ("peft", "hf-trainer"),
    ("accelerate", "hf-trainer"),
    ("hf-trainer", "hf-trainer"),
    ("deepspeed", "hf-trainer"),  # DeepSpeed named alone: its engine around transformers' models (the HF examples)
    # projects whose training loop is transformers' Trainer or accelerate around transformers' models
    ("fastchat", "hf-trainer"),
    ("open-instruct", "hf-trainer"),
)
_TRL = re.compile(r"\btrl\b")
_HF = re.compile(r"\bhf\b|^trainer$")  # "HF", "HF + DeepSpeed", "Trainer" (another project's trainer is not)
_OWN_TRAINER = ("llama-factory", "llamafactory", "axolotl")  # they run their own trainer even with TRL installed


def stack_for(corpus_stack: str, quantization: str = "none", framework: str = "") -> Stack | None:
    """The named stack of a corpus row's `stack` cell (None: unknown). bitsandbytes (4- or 8-bit) rows of a plain
    transformers stack are `hf-trainer-bnb`, or `trl-sft-bnb` when the cell names TRL (its SFTTrainer) or
    fms-acceleration's `framework` is its baseline (PEFT preparation left to TRL's SFTTrainer)."""
    key = corpus_stack.strip().lower()
    if key in STACKS:
        name = key
    else:
        named_hf = _TRL.search(key) or _HF.search(key)
        name = next((n for sub, n in _CORPUS_STACKS if sub in key), "hf-trainer" if named_hf else "")
    if not name:
        return None
    if name == "hf-trainer" and quantization in ("bnb-nf4", "bnb-int8"):
        sft = _TRL.search(key) and not any(own in key for own in _OWN_TRAINER)
        name = _FRAMEWORK_STACKS.get(framework.strip().lower(), "trl-sft-bnb" if sft else "hf-trainer-bnb")
    return STACKS[name]


_TORCHTUNE_OPTIONS = (  # (how a row names it, the option): recipe settings that change what a step keeps
    (re.compile(r"chunked[\s_-]*(cross[\s_-]*entropy|ce\b|loss|output)", re.IGNORECASE), "chunked cross-entropy"),
    (re.compile(r"activation[s]?[\s_-]*offload", re.IGNORECASE), "activation offload"),
    (re.compile(r"optimi[sz]er[\s_-]*in[\s_-]*(backward|bwd)", re.IGNORECASE), "optimizer in backward"),
)


def torchtune_options(text: str) -> tuple[str, ...]:
    """The torchtune recipe options a row names (its stack or stack_versions cell): "chunked cross-entropy"
    (CEWithChunkedOutputLoss), "activation offload" (`enable_activation_offloading`), "optimizer in backward"
    (`optimizer_in_bwd`)."""
    return tuple(option for pattern, option in _TORCHTUNE_OPTIONS if pattern.search(text))
