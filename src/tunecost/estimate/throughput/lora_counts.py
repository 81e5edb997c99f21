"""LoRA adapters' work per step: their GEMMs, the bytes and kernels around them (PEFT's fp32 adapters or adapters in
the compute dtype), the parameters the optimizer steps, and the modules PEFT trains beside them (modules_to_save).
Derivations: docs/throughput-model.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunecost.errors import TunecostError
from tunecost.models.arch import Arch
from tunecost.workload.job import FineTuneJob

if TYPE_CHECKING:
    from tunecost.estimate.throughput.counts import OpTally

LORA_BYTES_PER_IN_OUT = 12  # fp32 adapter path: cast x to fp32, x@A, @B, * scaling, add into the bf16 output
LORA_KERNELS_FWD, LORA_KERNELS_BWD = 5, 8  # cast, A, B, scale, add / their gradients (incl. A, B weight grads)
LORA_PARAM_BYTES = 4  # LLaMA-Factory upcasts trainable adapter weights to fp32
# Adapters in the compute dtype (torchtune's LoRALinear, litgpt's, NeMo's; `lora_compute_dtype`), per (in + out) at
# in = out: the forward reads x (2 B per in) and writes, scales and adds the update (2 + 4 + 6 B per out); the
# backward scales the update's gradient (4 per out), reads it for B's two GEMMs (4), writes x's gradient and adds
# it into the base's (2 + 6 per in) and reads x for A's gradient (2 per in).
LORA_COMPUTE_DTYPE_FWD_BYTES_PER_IN_OUT, LORA_COMPUTE_DTYPE_BWD_BYTES_PER_IN_OUT = 7, 9
LORA_COMPUTE_DTYPE_KERNELS_FWD, LORA_COMPUTE_DTYPE_KERNELS_BWD = 4, 6  # A, B, scale, add / their gradients
# lora_dropout on an adapter's input (its in side taken as half of its in + out) forward, recompute and backward:
# read and write fp32 and the 1-byte mask each pass, one kernel a pass
LORA_DROPOUT_BYTES_PER_INPUT = 4 + 4 + 1
LORA_INPUT_SHARE_OF_IN_OUT = 0.5


def dense_lora_targets(arch: Arch, targets: tuple[str, ...]) -> tuple[int, int]:
    """(sum of in + out, matrices) of the dense matrices LoRA adapts: q, k, v, o for `attention`, the other dense
    matrices (MLPs, shared experts) for `mlp`, and the projections named one by one (q_proj, ..., down_proj); a
    model without attention (Mamba) adapts every dense matrix for either group."""
    named = [(in_out, n) for name, in_out, n in arch.projection_in_out if name in targets]
    in_out, mats = sum(i for i, _ in named), sum(n for _, n in named)
    attention, mlp = "attention" in targets, "mlp" in targets
    if not (attention or mlp):
        return in_out, mats
    if (attention and mlp) or not arch.num_attention_matrices:
        return arch.dense_in_out, arch.num_dense_matrices
    if attention:
        return arch.attention_in_out + in_out, arch.num_attention_matrices + mats
    rest = arch.dense_in_out - arch.attention_in_out, arch.num_dense_matrices - arch.num_attention_matrices
    return rest[0] + in_out, rest[1] + mats


def _adapted(arch: Arch, targets: tuple[str, ...], *, experts: float, expert_calls: float) -> tuple[float, float]:
    """(sum of in + out, matrices) of the matrices LoRA adapts per token: the routed experts' counted `experts`
    times (top-k for the work, every expert for the parameters) and their matrices `expert_calls` times, the
    router's, and the dense ones (`dense_lora_targets`)."""
    dense_in_out, dense_mats = dense_lora_targets(arch, targets)
    in_out, mats = float(dense_in_out), float(dense_mats)
    if arch.num_experts > 1 and "experts" in targets:
        in_out += arch.num_moe_layers * experts * arch.expert_in_out
        mats += arch.num_moe_layers * expert_calls * arch.num_expert_matrices
    if arch.num_experts > 1 and "router" in targets:
        in_out += arch.num_moe_layers * (arch.hidden + arch.num_experts)
        mats += arch.num_moe_layers
    return in_out, mats


def add_lora(
    acc: OpTally, arch: Arch, job: FineTuneJob, *, tokens: float, k: int, hit: float, gc: float, compute_dtype: bool
) -> None:
    """Rank-r adapters (PEFT's fp32 ones, or in the compute dtype) beside the frozen weights they target: x@A@B on
    every pass, plus A/B grads."""
    if job.method == "full":
        return
    in_out, calls = _adapted(arch, job.lora.targets, experts=k, expert_calls=hit)
    token_io = tokens * in_out  # sum over adapter calls of tokens x (in + out)
    passes = 1.0 + gc + 2.0  # forward, recompute, grad-input, grad-weight of A and B
    dropout_passes = (2.0 + gc) if job.lora.dropout > 0 else 0.0  # forward, recompute, backward
    if compute_dtype:
        fwd_bytes, bwd_bytes = LORA_COMPUTE_DTYPE_FWD_BYTES_PER_IN_OUT, LORA_COMPUTE_DTYPE_BWD_BYTES_PER_IN_OUT
        fwd_kernels, bwd_kernels = LORA_COMPUTE_DTYPE_KERNELS_FWD, LORA_COMPUTE_DTYPE_KERNELS_BWD
        dropout_bytes = 2 * job.compute_bytes_per_element + 1  # read and write x, the 1-byte mask
    else:
        fwd_bytes, bwd_bytes = LORA_BYTES_PER_IN_OUT, 2 * LORA_BYTES_PER_IN_OUT
        fwd_kernels, bwd_kernels = LORA_KERNELS_FWD, LORA_KERNELS_BWD
        dropout_bytes = LORA_DROPOUT_BYTES_PER_INPUT
    acc.add(
        "lora",
        flops=passes * 2.0 * job.lora.rank * token_io,
        bytes_=((1.0 + gc) * fwd_bytes + bwd_bytes) * token_io
        + dropout_passes * LORA_INPUT_SHARE_OF_IN_OUT * token_io * dropout_bytes,
        kernels=calls * ((1.0 + gc) * fwd_kernels + bwd_kernels + dropout_passes),
    )


def adapter_params(arch: Arch, job: FineTuneJob, compute_dtype: bool) -> tuple[float, int, int]:
    """(trainable parameters, trainable tensors, bytes per trainable parameter) of the job's adapters: fp32
    (PEFT's, LLaMA-Factory upcasts them) or in the compute dtype."""
    n = arch.num_experts
    in_out, mats = _adapted(arch, job.lora.targets, experts=n, expert_calls=n)
    param_bytes = job.compute_bytes_per_element if compute_dtype else LORA_PARAM_BYTES
    return job.lora.rank * in_out, 2 * int(mats), param_bytes


# module names (a path's last part) of the input embedding and the output head, for PEFT's modules_to_save
EMBEDDING_NAMES = frozenset({"embed_tokens", "wte", "word_embeddings", "embed_in"})
HEAD_NAMES = frozenset({"lm_head", "embed_out", "output"})


def check_counted_modules(names: tuple[str, ...]) -> None:
    """One-line error for a module saved beside LoRA that the counts do not know (the embedding and the head)."""
    unknown = [n for n in names if n not in EMBEDDING_NAMES | HEAD_NAMES]
    if unknown:
        raise TunecostError(
            f"--modules-to-save {', '.join(unknown)}: the throughput counts train the input embedding "
            f"({', '.join(sorted(EMBEDDING_NAMES))}) or the output head ({', '.join(sorted(HEAD_NAMES))}) beside "
            "LoRA; `tunecost memory` simulates any module"
        )


def saved_modules(job: FineTuneJob) -> tuple[bool, bool]:
    """(the embedding, the output head): whether PEFT trains a copy of it beside LoRA (modules_to_save)."""
    saved = set(job.modules_to_save)
    return bool(EMBEDDING_NAMES & saved), bool(HEAD_NAMES & saved)
