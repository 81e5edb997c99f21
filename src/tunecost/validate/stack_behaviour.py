"""The library behaviours a corpus row's stack reproduces: the loss code of its transformers version, torchtune's
recipe options, DeepSpeed's engine, the fp32 norms of 4-bit preparation."""

from __future__ import annotations

import re

from tunecost.simulate.behaviour import (
    ADAMW_FUSED,
    LOSS_MODEL_SHIFTED,
    LOSS_MODEL_SHIFTED_NO_AUTOCAST,
    LOSS_TRANSFORMERS_5,
    LOSS_TRANSFORMERS_440,
    LOSS_TRANSFORMERS_446,
    LOSS_TRL_CHUNKED,
    StackBehaviour,
    torchtune_behaviour,
)
from tunecost.validate.stacks import Stack, torchtune_options

_QWEN_REMOTE_CODE = re.compile(r"^qwen/qwen-\d", re.IGNORECASE)  # Qwen (1.0): Qwen/Qwen-7B, Qwen/Qwen-1_8B-Chat
_TRANSFORMERS_VERSION = re.compile(r"\btransformers\s+v?(\d+)\.(\d+)", re.IGNORECASE)


def loss_code_for(model_id: str, stack_versions: str, family: str = "") -> str:
    """The loss code of a row: the model's own loss code for Qwen (1.0)'s remote code and for GPTBigCode under
    transformers <= 4.48 (its forward computes the loss itself, not through `loss_function`), else the row's
    transformers version (read in each version's wheel: before 4.31 Llama shifts the compute-dtype logits, from
    4.31 to 4.45 the models' forward upcasts them first, 4.46-4.48 `ForCausalLMLoss` copies, the simulator's own
    for >= 4.49 and for an unstated version); TRL's chunked_nll where the row names it."""
    m = _TRANSFORMERS_VERSION.search(stack_versions)
    version = (int(m.group(1)), int(m.group(2))) if m else None
    if "chunked_nll" in stack_versions.lower():  # TRL's SFTTrainer, named
        return LOSS_TRL_CHUNKED
    if _QWEN_REMOTE_CODE.match(model_id.strip()):
        return LOSS_MODEL_SHIFTED
    if family == "gpt_bigcode" and version is not None and version < (4, 49):
        return LOSS_MODEL_SHIFTED
    if version is not None and version < (4, 31):  # 4.30 LlamaForCausalLM: no `logits = logits.float()`
        return LOSS_MODEL_SHIFTED
    if version is not None and (4, 46) <= version < (4, 49):
        return LOSS_TRANSFORMERS_446
    if version is not None and (4, 31) <= version < (4, 46):
        return LOSS_TRANSFORMERS_440
    return LOSS_TRANSFORMERS_5


def behaviour_for(
    stack: Stack,
    *,
    model_id: str,
    stack_versions: str,
    num_gpus: int,
    family: str = "",
    method: str = "",
    strategy: str | None = None,
    stack_cell: str = "",
) -> StackBehaviour:
    """The library behaviours a row's stack reproduces (the fp32 norms unless the parameters are sharded: TRL's
    SFTTrainer skips the preparation for a 4-bit model loaded off the GPU, as under FSDP and ZeRO-3, see
    trl-sft-bnb; FSDP1's held layer inputs come with the fsdp1 strategy, `distributed.fsdp1`; DeepSpeed ZeRO-2 fp16
    for the single-GPU QLoRA rows of a stack that runs them so: see qwen-finetune)."""
    if stack.simulator_spec.torchtune_recipes:
        options = torchtune_options(f"{stack_cell} ; {stack_versions}")
        return torchtune_behaviour(
            chunked_loss="chunked cross-entropy" in options,
            activation_offload="activation offload" in options,
            optimizer_in_backward="optimizer in backward" in options,
            adamw_impl=stack.adamw_impl,
        )
    loss_code = loss_code_for(model_id, stack_versions, family)
    deepspeed = stack.deepspeed_for(method, num_gpus)
    if deepspeed is not None and loss_code == LOSS_MODEL_SHIFTED:
        loss_code = LOSS_MODEL_SHIFTED_NO_AUTOCAST  # DeepSpeed's fp16 / bf16 engine runs without autocast
    zero2 = deepspeed if method == "qlora" else None  # a full fine-tune's engine is a rank of zero2 (`mapping`)
    return StackBehaviour(
        kbit_fp32_norms=stack.kbit_fp32_norms and (num_gpus == 1 or strategy in ("ddp", "zero1", "zero2")),
        loss_code=loss_code,
        deepspeed_zero2=zero2,
        adamw_impl=ADAMW_FUSED if zero2 is not None else stack.adamw_impl,  # DeepSpeed's own FusedAdam
    )
