"""Stack behaviours that change what a training step allocates, beyond the simulator stack's own model code.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.behaviour`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunecost.errors import TunecostError
from tunecost.workload.stacks import STACK_SPECS

if TYPE_CHECKING:  # torch is imported when a simulation runs, not when a behaviour is named
    import torch
    from torch import nn

LOSS_TRANSFORMERS_5 = "transformers>=4.49"
LOSS_TRANSFORMERS_446 = "transformers-4.46-4.48"
LOSS_TRANSFORMERS_440 = "transformers-4.40"
LOSS_MODEL_SHIFTED = "model-shifted-compute-dtype"
LOSS_MODEL_SHIFTED_NO_AUTOCAST = "model-shifted-no-autocast"
LOSS_TORCHTUNE = "torchtune"
LOSS_TORCHTUNE_CHUNKED = "torchtune-chunked"
TORCHTUNE_OUTPUT_CHUNKS = 8  # CEWithChunkedOutputLoss's default num_output_chunks
LOSS_TRL_CHUNKED = "trl-chunked-nll"
TRL_CHUNK_TOKENS = 256  # SFTTrainer's _CHUNKED_LM_HEAD_CHUNK_SIZE
# loss code -> what it keeps, in vocab x tokens tensors beside the compute-dtype logits
LOSS_CODES: dict[str, str] = {
    LOSS_TRANSFORMERS_5: "loss_utils.ForCausalLMLoss: one fp32 copy of the logits, labels padded (no shifted copy)",
    LOSS_TRANSFORMERS_446: "loss_utils.ForCausalLMLoss: an fp32 copy of the logits and a contiguous shifted fp32 copy",
    LOSS_TRANSFORMERS_440: "the model's forward upcasts the logits to fp32, then a contiguous shifted fp32 copy",
    LOSS_MODEL_SHIFTED: "the model's own loss code (Qwen 1.0's modeling_qwen.py; GPTBigCode in transformers <= 4.48, "
    "checked in the 4.48.1 wheel): a contiguous shifted copy in the compute dtype, cast to fp32 by autocast inside "
    "the cross-entropy",
    LOSS_MODEL_SHIFTED_NO_AUTOCAST: "the model's own loss code without autocast (Qwen 1.0's modeling_qwen.py "
    "under DeepSpeed fp16): a contiguous shifted copy, log-softmax and its gradient all in the compute dtype",
    LOSS_TORCHTUNE: "torchtune's TransformerDecoder: the output projection upcast to fp32 (`self.output(h).float()`, "
    "the compute-dtype logits freed), labels shifted by the recipe (no shifted logits copy), cross-entropy on the "
    "fp32 logits",
    LOSS_TORCHTUNE_CHUNKED: "torchtune's CEWithChunkedOutputLoss: the output projection per chunk of "
    f"{TORCHTUNE_OUTPUT_CHUNKS} along the sequence (compute-dtype chunks), each chunk upcast to fp32 inside its own "
    "cross-entropy (eager: every chunk's fp32 log-softmax kept for backward, one fp32 copy at a time)",
    LOSS_TRL_CHUNKED: "TRL's chunked_nll (SFTConfig's default loss_type since TRL 1.7): the shifted hidden states "
    f"copied with the valid tokens first, then per chunk of {TRL_CHUNK_TOKENS} tokens the head in fp32 on an fp32 copy "
    "of its weight, log-softmax, NLL, argmax and entropy, each chunk under non-re-entrant checkpointing",
}
TORCHTUNE_LOSS_CODES = (LOSS_TORCHTUNE, LOSS_TORCHTUNE_CHUNKED)

ADAMW_TORCH_20 = "torch-2.0-foreach"
ADAMW_FUSED = "fused"
ADAMW_FOREACH = "foreach"  # the multi-tensor AdamW asked for where the stack's own is fused (torchtune fused=False)
# AdamW implementation -> its temporaries at the step ("": the installed torch's multi-tensor AdamW)
ADAMW_IMPLS: dict[str, str] = {
    "": "torch multi-tensor AdamW: one temporary the size of the trainable tensors",
    ADAMW_TORCH_20: "torch 2.0's multi-tensor AdamW (torch/optim/adamw.py: denom = _foreach_add(exp_avg_sq_sqrt, "
    "eps) out of place): two temporaries the size of the trainable tensors",
    ADAMW_FUSED: "a fused AdamW kernel (DeepSpeed's FusedAdam; torch's AdamW with fused=True, as torchtune's "
    "configs set it): no temporaries",
    ADAMW_FOREACH: "torch multi-tensor AdamW (fused off): one temporary the size of the trainable tensors",
}


@dataclass(frozen=True, kw_only=True)
class DeepSpeedZero2:
    """DeepSpeed ZeRO stage 2 with an fp16 engine on one GPU: fp16 parameters without autocast, fp32 master copy
    and AdamW states, gradient buckets in backward (sources: docs/memory-model.md, `DeepSpeedZero2`)."""

    reduce_bucket_elements: int  # zero_optimization.reduce_bucket_size
    overlap_comm: bool  # zero_optimization.overlap_comm: double buffering

    def __post_init__(self) -> None:
        if self.reduce_bucket_elements < 1:
            raise TunecostError(f"reduce_bucket_size must be >= 1, got {self.reduce_bucket_elements}")

    @property
    def num_buckets(self) -> int:
        return 2 if self.overlap_comm else 1

    def bucket_bytes(self) -> int:
        """Bytes of the gradient buckets alive through each backward: buckets x reduce_bucket_size x 2 (fp16)."""
        return self.num_buckets * self.reduce_bucket_elements * FP16_BYTES


FP16_BYTES = 2


@dataclass(frozen=True, kw_only=True)
class StackBehaviour:
    """Behaviours of a training stack the simulator reproduces on request (defaults: none of them)."""

    kbit_fp32_norms: bool = False  # prepare_model_for_kbit_training + TRL's bf16 recast: norm weights in fp32
    loss_code: str = LOSS_TRANSFORMERS_5  # one of LOSS_CODES
    deepspeed_zero2: DeepSpeedZero2 | None = None  # DeepSpeed ZeRO-2 fp16 engine on one GPU (None: not DeepSpeed)
    adamw_impl: str = ""  # one of ADAMW_IMPLS ("": the installed torch's)
    activation_offload: bool = False  # torchtune's OffloadActivations around the forward
    optimizer_in_backward: bool = False  # torchtune's optimizer_in_bwd: each parameter stepped in the backward
    reentrant_checkpointing: bool | None = None  # torch.utils.checkpoint's use_reentrant (None: the stack's default)

    def __post_init__(self) -> None:
        if self.loss_code not in LOSS_CODES:
            raise TunecostError(f"unknown loss code {self.loss_code!r}; known: {', '.join(LOSS_CODES)}")
        if self.adamw_impl not in ADAMW_IMPLS:
            raise TunecostError(f"unknown AdamW {self.adamw_impl!r}; known: {', '.join(filter(None, ADAMW_IMPLS))}")

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_BEHAVIOUR

    def describe(self) -> tuple[str, ...]:
        """One assumption line per behaviour that differs from the default."""
        out = []
        if self.kbit_fp32_norms:
            out.append(
                "prepare_model_for_kbit_training (TRL SFTTrainer, bf16): norm weights in fp32, so norm outputs, 4-bit "
                "layer outputs, the residual stream and checkpointed layer inputs are fp32; attention on "
                "compute-dtype copies"
            )
        if self.loss_code != LOSS_TRANSFORMERS_5:
            out.append(f"loss of {self.loss_code}: {LOSS_CODES[self.loss_code]}")
        if self.adamw_impl:
            out.append(f"AdamW: {ADAMW_IMPLS[self.adamw_impl]}")
        if self.activation_offload:
            out.append(
                "activation offload (torchtune's OffloadActivations): saved tensors of 1024 bytes or more that are "
                "not parameters or buffers copied to host memory in forward, the last five kept on the device until "
                "their copy ends, each brought back when backward unpacks it; the output projection's kept"
            )
        if self.optimizer_in_backward:
            out.append(
                "optimizer in backward (torchtune's optimizer_in_bwd): one optimizer per parameter, stepped as soon "
                "as its gradient is complete and the gradient freed, so one gradient is alive at a time"
            )
        if self.reentrant_checkpointing is not None:
            kind = "re-entrant" if self.reentrant_checkpointing else "non-re-entrant"
            out.append(
                f"checkpointed layers, if any, recomputed by {kind} torch.utils.checkpoint "
                f"(use_reentrant={self.reentrant_checkpointing}), as named"
            )
        if self.deepspeed_zero2 is not None:
            zero2 = self.deepspeed_zero2
            out.append(
                "DeepSpeed ZeRO-2 fp16 engine: model in fp16, no autocast; fp16 LoRA factors with an fp32 master "
                "copy, fp32 AdamW states and an fp16 gradient partition (16 bytes per trainable parameter, as fp32 "
                f"factors with fp32 gradients and states); {zero2.num_buckets} x {zero2.reduce_bucket_elements} fp16 "
                f"gradient bucket elements ({zero2.bucket_bytes() / 1e9:.2f} GB) alive through each backward"
            )
        return tuple(out)


DEFAULT_BEHAVIOUR = StackBehaviour()


def torchtune_behaviour(
    *, chunked_loss: bool = False, activation_offload: bool = False, optimizer_in_backward: bool = False, **fields: Any
) -> StackBehaviour:
    """torchtune's recipe with its options: its loss (`CEWithChunkedOutputLoss` with `chunked_loss`), activation
    offload, optimizer in backward; `fields` are other `StackBehaviour` fields (the AdamW, checkpointing)."""
    return StackBehaviour(
        loss_code=LOSS_TORCHTUNE_CHUNKED if chunked_loss else LOSS_TORCHTUNE,
        activation_offload=activation_offload,
        optimizer_in_backward=optimizer_in_backward,
        **fields,
    )


def stack_loss_code(stack: str, behaviour: StackBehaviour) -> str:
    """The loss code a step runs: the paper's 2024 stack always has transformers 4.40's; torchtune its own (the
    behaviour chooses chunked or not); every other stack the behaviour's."""
    spec = STACK_SPECS[stack]
    if spec.loss_upcast_in_model:
        return LOSS_TRANSFORMERS_440
    if spec.torchtune_recipes and behaviour.loss_code not in TORCHTUNE_LOSS_CODES:
        return LOSS_TORCHTUNE
    return behaviour.loss_code


def stack_adamw_impl(stack: str, behaviour: StackBehaviour) -> str:
    """The AdamW a step runs: the behaviour's, else torchtune's configs' fused AdamW under stack torchtune, else the
    installed torch's multi-tensor one ("")."""
    if not behaviour.adamw_impl and STACK_SPECS[stack].torchtune_recipes:
        return ADAMW_FUSED
    return behaviour.adamw_impl


def runs_fused_adamw(stack: str, behaviour: StackBehaviour | None) -> bool:
    """Whether a step on `stack` runs a fused AdamW (`stack_adamw_impl`; None: the default behaviour)."""
    return stack_adamw_impl(stack, behaviour or DEFAULT_BEHAVIOUR) == ADAMW_FUSED


def causal_lm_loss(loss_code: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The causal-LM loss on compute-dtype `logits` (B, L, V) as the named code computes it, for the codes that
    differ from the simulator's own (`LOSS_TRANSFORMERS_5` is the model's forward with labels)."""
    from torch import nn

    from tunecost.simulate.hf2024 import causal_lm_loss_2024

    if loss_code in (LOSS_TRANSFORMERS_446, LOSS_TRANSFORMERS_440):
        # 4.40: `logits = logits.float()` in the model's forward; 4.46-4.48: the first line of ForCausalLMLoss; then
        # both take `logits[..., :-1, :].contiguous()` (checked in the 4.45.2 and 4.48.1 wheels; 4.49.0 pads labels)
        return causal_lm_loss_2024(logits, labels)
    if loss_code in (LOSS_MODEL_SHIFTED, LOSS_MODEL_SHIFTED_NO_AUTOCAST):
        # the shifted copy in the compute dtype (a local that lives through the loss); CrossEntropyLoss under
        # autocast runs in fp32 on a cast copy of it, without autocast in the compute dtype
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        flat = shift_logits.view(-1, shift_logits.size(-1))
        if loss_code == LOSS_MODEL_SHIFTED:
            flat = flat.float()
        return nn.functional.cross_entropy(flat, shift_labels.view(-1))
    raise TunecostError(f"loss code {loss_code!r} is the model's own forward, not a separate loss")


def trl_chunked_loss(hidden_states: torch.Tensor, lm_head: nn.Module, labels: torch.Tensor, config: Any) -> Any:
    """TRL's `_chunked_cross_entropy_loss` as SFTTrainer's patched forward runs it on the decoder's last hidden states
    (`loss_type="chunked_nll"`, TRL 1.4-1.9): hidden states and labels shifted, the valid tokens packed first by a
    stable argsort (every position is a real token here), then each chunk's head, loss, accuracy and entropy under
    non-re-entrant checkpointing; the mean over the valid tokens."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from tunecost.simulate.counts import like_backward, like_iterations  # imports torch

    hidden = hidden_states[..., :-1, :].reshape(-1, hidden_states.size(-1))
    target = labels[..., 1:].reshape(-1)
    valid = target != -100
    order = valid.to(torch.int8).argsort(descending=True, stable=True)
    hidden, target = hidden[order], target[order]
    scale, softcap = getattr(config, "logit_scale", 1.0), getattr(config, "final_logit_softcapping", None)
    loss = hidden.new_zeros((), dtype=torch.float32)
    count = -(-hidden.shape[0] // TRL_CHUNK_TOKENS)
    for i in like_iterations(count, hidden):  # the recorder may run some chunks and repeat their record
        start, end = i * TRL_CHUNK_TOKENS, (i + 1) * TRL_CHUNK_TOKENS
        args = (hidden[start:end], lm_head.weight, lm_head.bias, target[start:end], scale, softcap)
        loss = loss + checkpoint(_trl_chunk, *args, use_reentrant=False)[0]
        like_backward(i, count, loss)  # and their backward: the sum's gradient starts each chunk's
    return loss / valid.sum()


def _trl_chunk(h: Any, w: Any, b: Any, target: Any, scale: float, softcap: float | None) -> tuple:
    from torch.nn import functional as F

    logits = h.float() @ w.float().t()
    logits = logits + b.float() if b is not None else logits
    logits = logits * scale if scale != 1.0 else logits
    if softcap is not None:
        logits = softcap * (logits / softcap).tanh()
    log_p = F.log_softmax(logits, dim=-1)
    valid = target != -100
    correct = ((logits.argmax(dim=-1) == target) & valid).sum().float()
    entropy = (-(log_p.exp() * log_p).sum(dim=-1) * valid).sum()
    return F.nll_loss(log_p, target, ignore_index=-100, reduction="sum"), correct, entropy


def gradient_buckets(zero2: DeepSpeedZero2 | None, model: nn.Module) -> list[torch.Tensor]:
    """The fp16 gradient buckets DeepSpeed ZeRO-2's `backward()` allocates, on the model's device, before autograd
    runs (none without DeepSpeed); the caller drops them when the backward ends."""
    import torch

    if zero2 is None:
        return []
    device = next(model.parameters()).device
    return [
        torch.empty(zero2.reduce_bucket_elements, dtype=torch.float16, device=device) for _ in range(zero2.num_buckets)
    ]


def cast_norms_fp32(model: nn.Module) -> None:
    """TRL's `peft_module_casting_to_bf16` rule after `prepare_model_for_kbit_training`: every module whose name
    contains "norm" (and every LayerNorm) in fp32; embeddings and lm_head stay in the compute dtype."""
    import torch
    from torch import nn

    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm) or "norm" in name.rsplit(".", 1)[-1]:
            for p in module.parameters(recurse=False):
                p.data = p.data.to(torch.float32)


def _cast_input(dtype: torch.dtype) -> Callable[..., Any]:
    def pre(_module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        return (x.to(dtype), *args[1:]) if x.dtype != dtype else args

    return pre


def _restore_output_dtype(module: nn.Module, args: tuple, output: Any) -> Any:
    want = getattr(module, "_tunecost_in_dtype", None)
    if want is not None and getattr(output, "dtype", want) != want:
        return output.to(want)
    return output


def install_autocast_boundaries(model: nn.Module, compute_dtype: torch.dtype) -> list[Any]:
    """Where fp32 activations meet compute-dtype weights outside the 4-bit layers (which cast themselves, see
    `SimLinear`), do what the real stack does (module hooks on this instance, no library patching):
    - the lm_head (nn.Linear, bf16 weight) and the routers: autocast casts the input to the compute dtype;
    - routed experts (per-expert `Linear4bit` in transformers 4.x): compute in the compute dtype, output cast back
      to the input's dtype (fp32), as bitsandbytes does per expert.
    Returns the hook handles."""
    handles = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("lm_head", "gate", "router", "shared_expert_gate") and any(True for _ in module.parameters()):
            handles.append(module.register_forward_pre_hook(_cast_input(compute_dtype)))
        elif leaf == "experts":

            def remember(mod: nn.Module, args: tuple, cast=_cast_input(compute_dtype)) -> tuple:
                mod._tunecost_in_dtype = args[0].dtype
                return cast(mod, args)

            handles.append(module.register_forward_pre_hook(remember))
            handles.append(module.register_forward_hook(_restore_output_dtype))
    return handles


def autocast_attention(base_name: str, compute_dtype: torch.dtype) -> str:
    """Register (once) an attention function that runs `base_name` on compute-dtype copies of fp32 query, key and
    value: what transformers' flash-attention path does for fp32 inputs and what autocast does for SDPA."""
    from transformers import AttentionInterface

    name = f"{base_name}_{str(compute_dtype).removeprefix('torch.')}"
    if name not in AttentionInterface._global_mapping:
        base = AttentionInterface._global_mapping.get(base_name)
        if base is None:
            from transformers.models.llama.modeling_llama import eager_attention_forward

            base = eager_attention_forward

        def forward(module, query, key, value, *args, **kwargs):
            if query.dtype != compute_dtype:
                query, key, value = (t.to(compute_dtype) for t in (query, key, value))
            return base(module, query, key, value, *args, **kwargs)

        AttentionInterface.register(name, forward)
    return name


def torchtune_output(loss_code: str, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
    """torchtune's `TransformerDecoder.unembed` after the final norm: the fp32 logits (`self.output(h).float()`, the
    compute-dtype ones a temporary), or with chunked output the compute-dtype logits of each of the
    `TORCHTUNE_OUTPUT_CHUNKS` chunks along the sequence (`chunked_output`)."""
    if loss_code == LOSS_TORCHTUNE_CHUNKED:
        return [lm_head(chunk) for chunk in hidden.tensor_split(TORCHTUNE_OUTPUT_CHUNKS, dim=1)]
    return lm_head(hidden).float()


def torchtune_loss(output: torch.Tensor | list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """torchtune's SFT recipe loss: labels shifted left with an ignored last position (`torch.hstack`), then
    cross-entropy on the fp32 logits, or CEWithChunkedOutputLoss over the chunks (each upcast to fp32 inside its own
    cross-entropy, summed and divided by the counted tokens)."""
    import torch
    from torch.nn import functional as F

    ignore = -100
    shifted = torch.hstack((labels[..., 1:], torch.full_like(labels[..., :1], ignore)))
    if not isinstance(output, list):
        return F.cross_entropy(output.reshape(-1, output.size(-1)), shifted.reshape(-1), ignore_index=ignore)
    total = (shifted != ignore).sum()
    loss = None
    for chunk, chunk_labels in zip(output, shifted.tensor_split(len(output), dim=1), strict=True):
        part = F.cross_entropy(
            chunk.reshape(-1, chunk.size(-1)).float(), chunk_labels.reshape(-1), ignore_index=ignore, reduction="sum"
        )
        loss = part if loss is None else loss + part
    assert loss is not None
    return loss / total
