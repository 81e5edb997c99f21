"""The token mixers' work per step: attention (FlashAttention-2 varlen, or transformers' eager attention) or the
Mamba conv + scan, and the element-wise work around them in each layer (norms, rotary, residuals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunecost.estimate.throughput.lengths import SeqLengths
from tunecost.models.arch import Arch
from tunecost.workload.gated_delta import delta_rule_bytes, delta_rule_flops
from tunecost.workload.ssd import ssd_bytes, ssd_flops

if TYPE_CHECKING:
    from tunecost.estimate.throughput.counts import OpTally

BWD_KERNELS_PER_FWD_KERNEL = 1.5  # non-GEMM ops: autograd launches about 1.5 kernels per forward kernel
BWD_BYTES_PER_FWD_BYTE = 2.0  # element-wise backward reads the saved input and the incoming grad, writes a grad
FA2_BWD_FLOPS_PER_FWD = 2.5  # FlashAttention-2 backward recomputes the scores: 5 matmuls vs 2
SCAN_FLOPS_PER_STATE = 9  # selective scan: 9 B L D N FLOPs forward (Gu & Dao 2023, §3.3)
# Element-wise traffic per token per layer, forward, in bytes per element of the named width:
RMSNORM_BYTES_PER_HIDDEN = 34  # HF RMSNorm: upcast, pow, mean, rsqrt, mul, downcast, * weight
RMSNORM_KERNELS = 7
ROTARY_BYTES_PER_QK = 20  # q*cos + rotate_half(q)*sin on q and k (slice, neg, cat, mul, mul, add)
ROTARY_KERNELS = 12
RESIDUAL_BYTES_PER_HIDDEN = 6  # read two bf16, write one
FA2_VARLEN_BYTES_PER_HIDDEN = 16  # unpad q, k, v and pad the output back (index ops)
FA2_VARLEN_KERNELS = 8
# transformers' eager_attention_forward per (B, heads, L, L) score element, bf16: forward writes the QK^T product,
# scales it, adds the mask, softmax in fp32 and back (2 + 4 + 4 + 6 + 6) and the PV matmul reads it (2); backward
# the PV grads (2 + 2), the casts and softmax backward (6 + 12 + 6), the scale (4) and the QK^T grads read it (4)
EAGER_FWD_BYTES_PER_SCORE = 24
EAGER_BWD_BYTES_PER_SCORE = 38
EAGER_FWD_KERNELS = 4  # scale, mask add, softmax, cast (beside the two matmuls)
MAMBA_NORM_BYTES_PER_HIDDEN = 12  # fused residual (fp32) + RMSNorm
MAMBA_ELEMENTWISE_KERNELS = 8
# Gated DeltaNet (fla 0.6 and causal-conv1d): forward kernels (conv, two l2norms, gate cumsum, kkt + solve, w/u,
# state pass, output) and backward (w/u and states again, dv, dh, dq/dk/dw/dg, WY, cumsum, two l2norms, conv)
DELTA_FWD_KERNELS = 8
DELTA_BWD_KERNELS = 11
DELTA_BWD_BYTES_PER_FWD_BYTE = 3.0  # the recompute plus the gradient passes, each reading what the forward wrote
# transformers' eager work per value-head element: the gated RMSNorm (upcast, pow, mean, rsqrt, mul, weight, SiLU
# of the gate in fp32, mul, downcast) and per value head the decay gate (fp32 add, softplus, exp, mul) and beta
DELTA_GATED_NORM_BYTES = 44
DELTA_GATED_NORM_FUSED_BYTES = 6  # read x and z, write the output
DELTA_GATE_BYTES = 26
DELTA_EAGER_KERNELS = 16
# Mamba2 (mamba-ssm's MambaSplitConv1dScanCombinedFn): forward kernels (conv, dt cumsum, chunk states, state passing,
# C B^T, chunk scan, gated RMSNorm), backward (conv and scan recomputed, the scan's six gradient kernels, the norm's,
# the conv's); backward traffic 3x the forward's, as the gated DeltaNet's
SSD_FWD_KERNELS = 7
SSD_BWD_KERNELS = 12
SSD_BWD_BYTES_PER_FWD_BYTE = 3.0
# Fused layers (`fused`): Megatron Core's on Transformer Engine, the norm fused into the next linear's kernel
# (LayerNormLinear: read the input, write the normalized one), fused rotary (read and write q and k), the residual
# add fused with bias and dropout, packed (THD) attention without unpad/pad copies; one kernel each. torch.compile's
# Inductor fuses the same chains (a norm's upcast-reduce-scale, rotary's slice-neg-cat-mul-add) into one kernel each
TE_NORM_BYTES_PER_HIDDEN = 4
TE_ROTARY_BYTES_PER_QK = 4


def windowed_sq_len_tokens2(lengths: SeqLengths, window_tokens: int) -> float:
    """E[l^2] as the work of a layer whose queries see at most w keys: twice its scored pairs, sum over i of
    min(i, w), is l^2 - max(l - w, 0)^2. Exact for one fixed length; over a spread (mean and E[l^2] known) the
    bound min(E[l^2], 2 w E[l]): E[l^2] when every length fits the window (lengths are cut at 1024 tokens)."""
    mean_sq, mean = lengths.mean_sq_len_tokens2, lengths.mean_len_tokens
    if window_tokens > 0 and mean_sq <= mean * mean:  # one length
        return mean_sq - max(mean - window_tokens, 0.0) ** 2
    return min(mean_sq, 2.0 * window_tokens * mean) if window_tokens > 0 else mean_sq


def add_mixers(
    acc: OpTally,
    arch: Arch,
    lengths: SeqLengths,
    *,
    gc: float,
    w_bytes: int,
    fused: bool = False,
    liger: bool = False,
    selective: bool = False,
    eager: bool = False,
) -> None:
    """Attention (FlashAttention-2 varlen: causal l^2 work on real lengths) or the Mamba conv + scan, and the
    per-layer element-wise work around them (norms, rotary, residuals): transformers' eager layers, or with
    `fused` one kernel per chain (Transformer Engine's layers, or Inductor's under torch.compile), or with `liger`
    Liger's norm and rotary kernels (one each; residual adds and the varlen unpad/pad stay). `selective`
    (selective recomputation): the attention kernel's forward runs again in backward. `eager`: transformers' eager
    attention instead of the fused kernel (`_eager_attention`)."""
    batch = lengths.batch_size
    tokens = lengths.tokens_per_step
    fwd_passes = 1.0 + gc
    ew_passes = fwd_passes + BWD_BYTES_PER_FWD_BYTE
    ew_kernel_passes = fwd_passes + BWD_KERNELS_PER_FWD_KERNEL
    if arch.num_attention_layers:
        width = arch.num_heads * arch.head_dim
        full_layers = arch.num_attention_layers - arch.num_window_layers
        window_sq = windowed_sq_len_tokens2(lengths, arch.attention_window_tokens)
        seqs = batch * lengths.attention_seqs_per_row  # causal sequences in the batch (packed rows: several a row)
        fwd_flops = full_layers * seqs * lengths.mean_sq_len_tokens2 * 2.0 * width
        fwd_flops += arch.num_window_layers * seqs * window_sq * 2.0 * width
        attn_fwd = max(fwd_passes, 2.0 if selective else 1.0)
        if eager:
            _eager_attention(acc, arch, lengths, fwd_passes=attn_fwd)
        else:
            acc.add(
                "attention",
                flops=(attn_fwd + FA2_BWD_FLOPS_PER_FWD) * fwd_flops,
                bytes_=(attn_fwd + FA2_BWD_FLOPS_PER_FWD) * arch.num_attention_layers * tokens * 4 * width * w_bytes,
                kernels=arch.num_attention_layers * (attn_fwd + 3.0),
            )
        if fused or liger:
            per_hidden = arch.num_layer_norms * TE_NORM_BYTES_PER_HIDDEN + 2 * RESIDUAL_BYTES_PER_HIDDEN
            per_token_layer = per_hidden * arch.hidden + TE_ROTARY_BYTES_PER_QK * 2 * width
            kernels_layer = arch.num_layer_norms + 1 + 2
            if liger and not fused and not eager:  # Liger keeps transformers' varlen unpad/pad copies
                per_token_layer += FA2_VARLEN_BYTES_PER_HIDDEN * arch.hidden
                kernels_layer += FA2_VARLEN_KERNELS
        else:
            per_token_layer = (
                arch.num_layer_norms * RMSNORM_BYTES_PER_HIDDEN
                + 2 * RESIDUAL_BYTES_PER_HIDDEN
                + (0 if eager else FA2_VARLEN_BYTES_PER_HIDDEN)  # eager attention neither unpads nor pads
            ) * arch.hidden + ROTARY_BYTES_PER_QK * 2 * width
            kernels_layer = (
                arch.num_layer_norms * RMSNORM_KERNELS + ROTARY_KERNELS + 2 + (0 if eager else FA2_VARLEN_KERNELS)
            )
        acc.add(
            "elementwise",
            bytes_=ew_passes * arch.num_attention_layers * tokens * per_token_layer,
            kernels=ew_kernel_passes * arch.num_attention_layers * kernels_layer,
        )
    for layers, add in ((arch.num_delta_layers, _gated_delta), (arch.num_ssd_layers, _ssd)):  # linear-time mixers
        if layers:
            add(acc, arch, tokens, fwd_passes=fwd_passes, w_bytes=w_bytes, fused=fused)
    if arch.num_mamba_layers:
        d, n = arch.mamba_inner, arch.mamba_state
        fwd_flops = arch.num_mamba_layers * tokens * (SCAN_FLOPS_PER_STATE * d * n + 2 * 4 * d)  # scan + conv
        fwd_bytes = arch.num_mamba_layers * tokens * ((6 * d + 4 * n) * w_bytes)  # x, dt, z in, y out, conv io, B, C
        acc.add(
            "ssm_scan",
            flops=(fwd_passes + 2.0) * fwd_flops,
            bytes_=(fwd_passes + 2.5) * fwd_bytes,
            kernels=arch.num_mamba_layers * (2 * fwd_passes + 4),
        )
        acc.add(
            "elementwise",
            bytes_=ew_passes * arch.num_layers * tokens * MAMBA_NORM_BYTES_PER_HIDDEN * arch.hidden
            + ew_passes * arch.num_mamba_layers * tokens * 6 * d,
            kernels=ew_kernel_passes * (arch.num_layers * 2 + arch.num_mamba_layers * MAMBA_ELEMENTWISE_KERNELS),
        )


def _gated_delta(acc: OpTally, arch: Arch, tokens: float, *, fwd_passes: float, w_bytes: int, fused: bool) -> None:
    """Qwen3.5's gated DeltaNet layers: causal-conv1d's convolution and fla's chunked delta rule (`DELTA_*`,
    `delta_rule_flops`), and transformers' eager work around them per layer: two RMSNorms and residual adds, the
    fp32 decay gate, beta's sigmoid and the gated RMSNorm over the value heads (`fused`: one kernel per chain)."""
    layers, heads = arch.num_delta_layers, arch.delta_value_heads
    kd, vd = arch.delta_key_dim, arch.delta_value_dim
    conv_width = 2 * arch.delta_key_heads * kd + heads * vd
    fwd, bwd = delta_rule_flops(tokens, heads, kd, vd)
    fwd_bytes = delta_rule_bytes(tokens, heads, kd, vd, w_bytes) + 2 * tokens * conv_width * w_bytes
    conv_flops = 2 * tokens * conv_width * arch.delta_conv_kernel
    acc.add(
        "ssm_scan",
        flops=layers * (fwd_passes * (fwd + conv_flops) + bwd + 2 * conv_flops),
        bytes_=layers * (fwd_passes + DELTA_BWD_BYTES_PER_FWD_BYTE) * fwd_bytes,
        kernels=layers * (fwd_passes * DELTA_FWD_KERNELS + DELTA_BWD_KERNELS),
    )
    if fused:
        per_token = (2 * TE_NORM_BYTES_PER_HIDDEN + 2 * RESIDUAL_BYTES_PER_HIDDEN) * arch.hidden
        per_token += DELTA_GATED_NORM_FUSED_BYTES * heads * vd
        kernels = 2 + 2 + 2
    else:
        per_token = (2 * RMSNORM_BYTES_PER_HIDDEN + 2 * RESIDUAL_BYTES_PER_HIDDEN) * arch.hidden
        per_token += DELTA_GATED_NORM_BYTES * heads * vd + DELTA_GATE_BYTES * heads
        kernels = 2 * RMSNORM_KERNELS + 2 + DELTA_EAGER_KERNELS
    acc.add(
        "elementwise",
        bytes_=(fwd_passes + BWD_BYTES_PER_FWD_BYTE) * layers * tokens * per_token,
        kernels=(fwd_passes + BWD_KERNELS_PER_FWD_KERNEL) * layers * kernels,
    )


def _ssd(acc: OpTally, arch: Arch, tokens: float, *, fwd_passes: float, w_bytes: int, fused: bool) -> None:
    """Granite 4.0's Mamba2 layers: mamba-ssm's fused kernel (the convolution, the chunked SSD scan and the gated
    RMSNorm: `tunecost.workload.ssd`) and transformers' eager work around it per layer: two RMSNorms and residual
    adds scaled by the residual multiplier (`fused`: one kernel per chain)."""
    layers, heads, head_dim = arch.num_ssd_layers, arch.ssd_heads, arch.ssd_head_dim
    state, groups, chunk = arch.ssd_state, arch.ssd_groups, arch.ssd_chunk
    conv_width = heads * head_dim + 2 * groups * state
    fwd, bwd = ssd_flops(tokens, heads, head_dim, state, groups, chunk)
    conv_flops = 2 * tokens * conv_width * arch.ssd_conv_kernel
    acc.add(
        "ssm_scan",
        flops=layers * (fwd_passes * (fwd + conv_flops) + bwd + 3 * conv_flops),
        bytes_=layers
        * (fwd_passes + SSD_BWD_BYTES_PER_FWD_BYTE)
        * ssd_bytes(tokens, heads, head_dim, state, groups, chunk, w_bytes),
        kernels=layers * (fwd_passes * SSD_FWD_KERNELS + SSD_BWD_KERNELS),
    )
    norm = TE_NORM_BYTES_PER_HIDDEN if fused else RMSNORM_BYTES_PER_HIDDEN
    acc.add(
        "elementwise",
        bytes_=(fwd_passes + BWD_BYTES_PER_FWD_BYTE)
        * layers
        * tokens
        * (2 * norm + 2 * RESIDUAL_BYTES_PER_HIDDEN + 4)
        * arch.hidden,
        kernels=(fwd_passes + BWD_KERNELS_PER_FWD_KERNEL) * layers * (2 + 2 + 2 if fused else 2 * RMSNORM_KERNELS + 4),
    )


def _eager_attention(acc: OpTally, arch: Arch, lengths: SeqLengths, *, fwd_passes: float) -> None:
    """transformers' eager attention on the padded batch: every layer scores all L x L pairs (no causal skip, no
    window), two matmuls forward and four backward, and the scores' element-wise traffic (`EAGER_*`) in between."""
    scores = arch.num_attention_layers * lengths.batch_size * arch.num_heads * lengths.padded_len_tokens**2
    acc.add(
        "attention",
        flops=(fwd_passes + 2.0) * 4.0 * scores * arch.head_dim,
        kernels=arch.num_attention_layers * (2.0 * fwd_passes + 4.0),
    )
    acc.add(
        "elementwise",
        bytes_=scores * (fwd_passes * EAGER_FWD_BYTES_PER_SCORE + EAGER_BWD_BYTES_PER_SCORE),
        kernels=arch.num_attention_layers * EAGER_FWD_KERNELS * (fwd_passes + BWD_KERNELS_PER_FWD_KERNEL),
    )
