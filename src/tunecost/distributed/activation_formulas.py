"""Activation bytes one decoder layer saves for backward: Korthikanti et al. 2022's GPT forms (their Table 2) and
the same term-by-term count for a Llama block (RMSNorm, SwiGLU, grouped-query flash attention, no dropout).

s: tokens per sequence, b: micro-batch, h: hidden size, a: attention heads, t: tensor-parallel degree.
Derivations and the comparison with tunecost's traced step: docs/multi-gpu.md, "Activation memory per layer vs
Korthikanti et al. 2022".
"""

from __future__ import annotations

from collections.abc import Mapping

from tunecost.errors import TunecostError

RECOMPUTE = ("none", "selective", "full")
FP32_BYTES = 4  # RMSNorm's upcast input and inverse RMS, the attention log-sum-exp


def _check(recompute: str, tp: int, sequence_parallel: bool) -> None:
    if recompute not in RECOMPUTE:
        raise TunecostError(f"recompute {recompute!r}: one of {', '.join(RECOMPUTE)}")
    if tp < 1:
        raise TunecostError(f"tensor-parallel degree must be at least 1, got {tp}")
    if sequence_parallel and tp == 1:
        raise TunecostError("sequence parallelism needs a tensor-parallel degree of 2 or more")


# Korthikanti et al. 2022, section 4.1 (16-bit activations, 1-byte dropout masks), per term in bytes.
def gpt_attention_bytes(s: int, b: int, h: int, a: int) -> dict[str, float]:
    """The attention block's saved tensors: 11sbh + 5as^2b."""
    sbh = s * b * h
    return {
        "qkv_input": 2 * sbh,  # shared input of the Q, K, V projections
        "q_k": 4 * sbh,  # Q and K for QK^T
        "softmax_output": 2 * a * s * s * b,
        "softmax_dropout_mask": a * s * s * b,
        "softmax_dropout_output": 2 * a * s * s * b,  # attention over V needs it
        "v": 2 * sbh,
        "projection_input": 2 * sbh,
        "attention_dropout_mask": sbh,
    }


def gpt_mlp_bytes(s: int, b: int, h: int) -> dict[str, float]:
    """The MLP block's saved tensors (intermediate 4h): 19sbh."""
    sbh = s * b * h
    return {"fc1_input": 2 * sbh, "gelu_input": 8 * sbh, "fc2_input": 8 * sbh, "mlp_dropout_mask": sbh}


def gpt_layernorm_bytes(s: int, b: int, h: int) -> dict[str, float]:
    """The two LayerNorms' inputs: 4sbh."""
    return {"layernorm_inputs": 4 * s * b * h}


# Which GPT terms tensor parallelism splits t ways (the rest is replicated on every TP rank: the 10sbh).
GPT_TP_SHARDED = frozenset(
    {"q_k", "softmax_output", "softmax_dropout_mask", "softmax_dropout_output", "v", "projection_input"}
    | {"gelu_input", "fc2_input"}
)
GPT_CORE_ATTENTION = frozenset({"softmax_output", "softmax_dropout_mask", "softmax_dropout_output"})


def gpt_layer_terms_bytes(
    s: int, b: int, h: int, a: int, *, tp: int = 1, sequence_parallel: bool = False, recompute: str = "none"
) -> dict[str, float]:
    """Every saved tensor of one GPT layer on one TP rank: split t ways where TP (or SP) splits it; selective
    recomputation drops the core attention's (the 5as^2b); full recomputation keeps only the layer input."""
    _check(recompute, tp, sequence_parallel)
    if recompute == "full":
        return {"layer_input": 2 * s * b * h / (tp if sequence_parallel else 1)}
    terms = {**gpt_attention_bytes(s, b, h, a), **gpt_mlp_bytes(s, b, h), **gpt_layernorm_bytes(s, b, h)}
    if recompute == "selective":
        terms = {k: v for k, v in terms.items() if k not in GPT_CORE_ATTENTION}
    return {k: v / tp if (sequence_parallel or k in GPT_TP_SHARDED) else v for k, v in terms.items()}


def korthikanti_layer_activation_bytes(
    s: int, b: int, h: int, a: int, *, tp: int = 1, sequence_parallel: bool = False, recompute: str = "none"
) -> float:
    """Korthikanti et al. 2022 Table 2, bytes per layer: sbh(34 + 5as/h) (t = 1); sbh(10 + 24/t + 5as/(ht)) (TP);
    sbh/t (34 + 5as/h) (TP + SP); sbh(10 + 24/t) (TP + selective); 34sbh/t (TP + SP + selective); 2sbh (full)."""
    _check(recompute, tp, sequence_parallel)
    sbh, t = s * b * h, tp
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    scores = 0.0 if recompute == "selective" else 5 * a * s / h
    if sequence_parallel:
        return sbh / t * (34 + scores)
    return sbh * (10 + 24 / t + scores / t)


# The Llama block as transformers runs it (full fine-tuning), per saved tensor in bytes. d: bytes per activation
# element; f: MLP intermediate size; kv: key-value heads; hd: head dimension.
def rmsnorm_bytes(s: int, b: int, h: int, d: int) -> dict[str, float]:
    """One RMSNorm (LlamaRMSNorm computes in fp32): its fp32 input (for the square), the per-token inverse RMS and
    the normalized input cast back (for the weight's gradient)."""
    return {"norm_fp32_input": FP32_BYTES * s * b * h, "norm_inv_rms": FP32_BYTES * s * b, "norm_output": d * s * b * h}


def llama_attention_bytes(s: int, b: int, h: int, a: int, kv: int, d: int) -> dict[str, float]:
    """Grouped-query attention through a fused (flash / SDPA) kernel: the projections' shared input, Q and the
    kv-head K and V after RoPE, the kernel output (also the output projection's input) and its fp32 log-sum-exp;
    no s^2 scores, no dropout."""
    hd = h // a
    return {
        "qkv_input": d * s * b * h,
        "q": d * s * b * h,
        "k_v": 2 * d * s * b * kv * hd,
        "attention_output": d * s * b * h,
        "logsumexp": FP32_BYTES * b * a * s,
    }


def swiglu_mlp_bytes(s: int, b: int, h: int, f: int, d: int) -> dict[str, float]:
    """SwiGLU: the gate/up projections' shared input; the gate output (SiLU's input), SiLU's output and the up
    output (the product's inputs) and their product (the down projection's input), each s x b x f."""
    return {"mlp_input": d * s * b * h, "swiglu": 4 * d * s * b * f}


LLAMA_TP_SHARDED = frozenset({"q", "k_v", "attention_output", "logsumexp", "swiglu"})
LLAMA_SP_GATHERED = frozenset({"qkv_input", "mlp_input"})  # gathered before the column-parallel projections


def sp_gathered_excess_bytes(s: int, b: int, h: int, *, d: int, tp: int, inputs=LLAMA_SP_GATHERED) -> dict[str, float]:
    """What keeping each gathered input of `inputs` (of `LLAMA_SP_GATHERED`) costs beyond Megatron's sequence
    shard: d s b h (1 - 1/t) each (`llama_layer_terms_bytes` with and without `keeps_gathered_inputs`)."""
    _check("none", tp, True)
    unknown = set(inputs) - LLAMA_SP_GATHERED
    if unknown:
        raise TunecostError(f"not gathered inputs: {', '.join(sorted(unknown))}")
    return {k: d * s * b * h * (1 - 1 / tp) for k in inputs}


def llama_layer_terms_bytes(
    s: int,
    b: int,
    *,
    h: int,
    a: int,
    kv: int,
    f: int,
    d: int = 2,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    keeps_gathered_inputs: bool = False,
) -> dict[str, float]:
    """Every saved tensor of one Llama layer on one TP rank (as `gpt_layer_terms_bytes`). With SP, Megatron saves
    the projections' inputs sharded and gathers them again in backward (Korthikanti et al. 4.2.2); DTensor's
    ColwiseParallel (torchtitan) keeps the gathered input (`keeps_gathered_inputs`). Selective recomputation of
    the core attention drops only the log-sum-exp: its output is the output projection's input."""
    _check(recompute, tp, sequence_parallel)
    if recompute == "full":
        return {"layer_input": d * s * b * h / (tp if sequence_parallel else 1)}
    terms = {f"input_{k}": v for k, v in rmsnorm_bytes(s, b, h, d).items()}
    terms |= {f"post_attention_{k}": v for k, v in rmsnorm_bytes(s, b, h, d).items()}
    terms |= llama_attention_bytes(s, b, h, a, kv, d) | swiglu_mlp_bytes(s, b, h, f, d)
    if recompute == "selective":
        terms.pop("logsumexp")

    def split(name: str) -> bool:
        if name in LLAMA_TP_SHARDED:
            return True
        return sequence_parallel and not (keeps_gathered_inputs and name in LLAMA_SP_GATHERED)

    return {k: v / tp if split(k) else v for k, v in terms.items()}


def llama_layer_activation_bytes(s: int, b: int, **kwargs) -> float:
    """The sum of `llama_layer_terms_bytes` (same arguments). At t = 1, 16-bit: sbh(20 + 4 kv hd / h + 8f/h) +
    sb(8 + 4a), against GPT's sbh(34 + 5as/h)."""
    return sum(llama_layer_terms_bytes(s, b, **kwargs).values())


def traced_layer_activation_bytes(segments: Mapping[str, Mapping[str, int]], num_layers: int) -> float:
    """One decoder layer's saved activations in a traced step scaled to full depth (`single_step.SingleGpuStep`
    segments): what the activations grow by from the first decoder layer's forward peak to the last's."""
    if num_layers < 2:
        raise TunecostError("a per-layer difference needs at least 2 decoder layers")
    first = segments["forward:unit_first"]["activations"]
    last = segments["forward:unit_last"]["activations"]
    return (last - first) / (num_layers - 1)
