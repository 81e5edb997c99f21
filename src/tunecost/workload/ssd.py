"""The work of mamba-ssm's fused Mamba2 training kernel (the chunked SSD scan with its convolution), torch-free:
shared by the step simulator and the throughput model."""

from __future__ import annotations

import math

MAMBA2_NOTE = (
    "Mamba2 layers as mamba-ssm's fused mamba_split_conv1d_scan_combined runs them (mamba-ssm and causal-conv1d "
    "installed); it reads out_proj.weight itself, so a LoRA adapter on the Mamba layers' out_proj trains nothing"
)
MAMBA2_QLORA_NOTE = (
    "Mamba2 layers on transformers' PyTorch path, as a run without mamba-ssm goes: its fused kernel reads "
    "out_proj.weight, which bitsandbytes packs in 4 bits (with mamba-ssm installed the step fails); the step "
    "time still counts the fused kernel's work"
)


def ssd_flops(tokens: float, heads: int, head_dim: int, state: int, groups: int, chunk: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of the chunked SSD scan (Dao & Gu 2024, section 7) over `tokens` tokens, chunk Q,
    state N, head dim P: per token, C B^T within the chunk (2QN per group), its product with x (2QP per head), the
    chunk states B^T x and the output from the states (2NP each per head). Backward: the forward's products twice
    (their gradients) and once more (the states and C B^T recomputed)."""
    per_token = groups * 2 * chunk * state + heads * (2 * chunk * head_dim + 4 * state * head_dim)
    return tokens * per_token, 3 * tokens * per_token


def ssd_bytes(
    tokens: float,
    heads: int,
    head_dim: int,
    state: int,
    groups: int,
    chunk: int,
    elem_bytes: int,
    *,
    chunks: float | None = None,
) -> float:
    """Forward traffic of the same kernels: x, B, C and z read, the scan output written and read by the gated norm,
    the norm's output written; the chunk states (fp32) written and read once per chunk (`chunks`: how many the
    kernel runs, each sequence chunked on its own; default the tokens' count as one sequence)."""
    width = heads * head_dim
    per_token = elem_bytes * (4 * width + 4 * groups * state + heads)
    states = (math.ceil(tokens / chunk) if chunks is None else chunks) * heads * head_dim * state * 4
    return tokens * per_token + 2 * states
