"""The work of flash-linear-attention's chunked gated delta rule (Qwen3.5's linear attention), torch-free: shared
by the step simulator and the throughput model."""

from __future__ import annotations

import math

CHUNK_TOKENS = 64  # fla's chunk_gated_delta_rule chunk size (BT)
GATED_DELTA_NOTE = (
    "gated DeltaNet layers as flash-linear-attention's chunked delta rule and causal-conv1d run them (both "
    "installed, as transformers recommends); without them its PyTorch fallbacks keep more"
)


def delta_rule_flops(tokens: float, value_heads: int, key_dim: int, value_dim: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of fla's chunked gated delta rule over `tokens` tokens (per value head: key
    dim K, value dim V, chunk C). Forward: K K^T and the WY products w, u (2CK + 2CK + 2CV per token), the state
    pass (v_new = u - w h, h += k^T v_new: 4KV) and the output (q h + (q k^T) v_new: 2KV + 2CK + 2CV).
    Backward: w, u and h recomputed, then twice the forward's products (dq, dk, dv, dh and the WY gradients)."""
    c, k, v = CHUNK_TOKENS, key_dim, value_dim
    per_token = value_heads * (6 * k * v + 6 * c * k + 4 * c * v)
    recompute = value_heads * (4 * k * v + 4 * c * k + 2 * c * v)
    return tokens * per_token, tokens * (2 * per_token + recompute)


def delta_rule_bytes(
    tokens: float, value_heads: int, key_dim: int, value_dim: int, elem_bytes: int, *, chunks: float | None = None
) -> float:
    """Forward traffic of the same kernels: q, k, v in; A, w, u, v_new and o written and read once; the per-chunk
    states h (K x V per chunk and head) written and read (`chunks`: how many the kernel runs, each sequence
    chunked on its own; default the tokens' count as one sequence)."""
    per_token = value_heads * (4 * key_dim + 4 * value_dim + CHUNK_TOKENS)
    states = (math.ceil(tokens / CHUNK_TOKENS) if chunks is None else chunks) * value_heads * key_dim * value_dim
    return elem_bytes * (tokens * per_token + 2 * states)
