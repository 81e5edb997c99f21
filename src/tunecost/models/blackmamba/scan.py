"""Mamba's selective scan and causal depthwise convolution, on any device.

Sources and derivations: docs/models.md, section `tunecost.models.blackmamba.scan`.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from tunecost.errors import TunecostError

_SILU_NAMES = ("silu", "swish")


@lru_cache(maxsize=1)
def _cuda_selective_scan_fn() -> Any:
    """mamba-ssm's fused kernel, or None. Imported lazily: the package is CUDA-only and may be absent."""
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except Exception:  # ImportError, or OSError/RuntimeError from a broken CUDA extension
        return None
    return selective_scan_fn


@lru_cache(maxsize=1)
def _cuda_causal_conv1d_fn() -> Any:
    """causal-conv1d's fused kernel, or None (same reasons as above)."""
    try:
        from causal_conv1d import causal_conv1d_fn
    except Exception:
        return None
    return causal_conv1d_fn


def fused_kernels_available() -> dict[str, bool]:
    """Which CUDA kernels are importable here (both are used only for CUDA tensors)."""
    return {"mamba_ssm": _cuda_selective_scan_fn() is not None, "causal_conv1d": _cuda_causal_conv1d_fn() is not None}


def _check_shapes(u, delta, A, B, C, D, z) -> None:
    if u.dim() != 3:
        raise TunecostError(f"selective_scan: u must be (batch, d_inner, seqlen), got {tuple(u.shape)}")
    b, d, seqlen = u.shape
    n = A.shape[-1]
    expected = {"delta": (delta, (b, d, seqlen)), "A": (A, (d, n)), "B": (B, (b, n, seqlen)), "C": (C, (b, n, seqlen))}
    if D is not None:
        expected["D"] = (D, (d,))
    if z is not None:
        expected["z"] = (z, (b, d, seqlen))
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise TunecostError(f"selective_scan: {name} must have shape {shape}, got {tuple(tensor.shape)}")


def _compute_dtype(u: torch.Tensor) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs (as mamba-ssm's kernels), fp64 kept for fp64 inputs (gradcheck)."""
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _softplus_delta(delta, delta_bias, delta_softplus, dtype):
    delta = delta.to(dtype)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dtype)[:, None]
    return F.softplus(delta) if delta_softplus else delta


def _finish(y, u, D, z):
    """y (b, d, L) plus D*u, gated by silu(z), cast back to the input dtype."""
    if D is not None:
        y = y + u.to(y.dtype) * D.to(y.dtype)[:, None]
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y.to(u.dtype)


def default_chunk_size(seqlen: int) -> int:
    """T ~ sqrt(L) balances the Python loops (2T steps within chunks + L/T across); a power of two >= 8."""
    return max(8, 1 << max(0, math.ceil(math.log2(max(1, seqlen)) / 2)))


def _to_chunk_major(x: torch.Tensor, chunk: int, num_chunks: int) -> torch.Tensor:
    """(b, k, L) -> contiguous (T, chunks, b, k): position c*T + j lands at [j, c], zero-padded at the end.

    Step j of every chunk is then one contiguous block, so each loop step below reads memory in order (a
    strided (chunks, T) layout made these steps ~8x slower on CPU), and `unbind` keeps the backward linear.
    """
    b, k, seqlen = x.shape
    x = F.pad(x, (0, num_chunks * chunk - seqlen))
    return x.reshape(b, k, num_chunks, chunk).permute(3, 2, 0, 1).contiguous()


def chunked_scan_readout(
    delta: torch.Tensor, A: torch.Tensor, drive: torch.Tensor, readout: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = <C, h> for the recurrence h = exp(delta * A) * h_prev + drive, on chunk-major tensors.

    delta: (T, chunks, b, d, 1) >= 0; A: (d, n) <= 0; drive: (T, chunks, b, d, n); readout: (T, chunks, b, n, 1).
    Returns y (T, chunks, b, d) and the state after the last step. Three short Python loops over whole
    blocks: (1) every chunk from a zero state, keeping its end state; (2) the true state carried from chunk
    to chunk; (3) every chunk again from its true starting state, reading y out step by step. Only decays in
    [0, 1] are multiplied, so nothing can overflow.
    """
    t = drive.shape[0]
    decays = torch.exp(delta * A).unbind(0)  # t blocks of (chunks, b, d, n)
    drives = drive.unbind(0)
    readouts = readout.unbind(0)

    state = drives[0]  # (1) from a zero state
    for j in range(1, t):
        state = torch.addcmul(drives[j], decays[j], state)
    chunk_ends = state.unbind(0)
    chunk_decays = torch.exp(delta.sum(dim=0) * A).unbind(0)  # sum of delta*A over a chunk = A * sum of delta

    carry = drive.new_zeros(drive.shape[2:])  # (2) the state before the sequence is zero
    carried_in = [carry]
    for chunk_end, chunk_decay in zip(chunk_ends[:-1], chunk_decays[:-1]):
        carry = torch.addcmul(chunk_end, chunk_decay, carry)
        carried_in.append(carry)

    state = torch.stack(carried_in)  # (3) the true state entering each chunk
    ys = []
    for j in range(t):
        state = torch.addcmul(drives[j], decays[j], state)
        ys.append(torch.matmul(state, readouts[j]).squeeze(-1))
    return torch.stack(ys), state[-1]


def selective_scan_chunked(
    u,
    delta,
    A,
    B,
    C,
    D=None,
    z=None,
    delta_bias=None,
    delta_softplus=True,
    return_last_state=False,
    chunk_size: int | None = None,
):
    """The pure-PyTorch chunked scan (any device, autograd-friendly); see docs/models.md."""
    _check_shapes(u, delta, A, B, C, D, z)
    dtype = _compute_dtype(u)
    b, d, seqlen = u.shape
    t = max(1, min(chunk_size or default_chunk_size(seqlen), seqlen))
    num_chunks = math.ceil(seqlen / t)
    delta = _softplus_delta(delta, delta_bias, delta_softplus, dtype)  # padding after softplus: decay 1
    delta_c = _to_chunk_major(delta, t, num_chunks).unsqueeze(-1)  # (T, chunks, b, d, 1)
    delta_u_c = _to_chunk_major(delta * u.to(dtype), t, num_chunks).unsqueeze(-1)
    b_c = _to_chunk_major(B.to(dtype), t, num_chunks).unsqueeze(3)  # (T, chunks, b, 1, n)
    c_c = _to_chunk_major(C.to(dtype), t, num_chunks).unsqueeze(-1)  # (T, chunks, b, n, 1)
    y_c, last_state = chunked_scan_readout(delta_c, A.to(dtype), delta_u_c * b_c, c_c)
    y = y_c.permute(2, 3, 1, 0).reshape(b, d, num_chunks * t)[:, :, :seqlen]
    out = _finish(y, u, D, z)
    return (out, last_state) if return_last_state else out


def selective_scan_reference(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=True, return_last_state=False
):
    """The naive sequential loop, one Python step per position, written as mamba-ssm's `selective_scan_ref`
    (which Zyphra's BlackMamba code falls back to without CUDA). For tests and as the benchmark baseline."""
    _check_shapes(u, delta, A, B, C, D, z)
    dtype = _compute_dtype(u)
    delta = _softplus_delta(delta, delta_bias, delta_softplus, dtype)
    u_f, b_f, c_f = u.to(dtype), B.to(dtype), C.to(dtype)
    delta_a = torch.exp(torch.einsum("bdl,dn->bdln", delta, A.to(dtype)))
    delta_b_u = torch.einsum("bdl,bnl,bdl->bdln", delta, b_f, u_f)
    state = u_f.new_zeros(u.shape[0], u.shape[1], A.shape[-1])
    ys = []
    for i in range(u.shape[-1]):
        state = delta_a[:, :, i] * state + delta_b_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", state, c_f[:, :, i]))
    out = _finish(torch.stack(ys, dim=2), u, D, z)
    return (out, state) if return_last_state else out


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=True, return_last_state=False):
    """Selective scan: mamba-ssm's fused kernel for CUDA tensors when installed, else the chunked scan."""
    if u.is_cuda:
        fused = _cuda_selective_scan_fn()
        if fused is not None:
            return fused(
                u,
                delta,
                A,
                B,
                C,
                D,
                z=z,
                delta_bias=delta_bias,
                delta_softplus=delta_softplus,
                return_last_state=return_last_state,
            )
    return selective_scan_chunked(
        u,
        delta,
        A,
        B,
        C,
        D,
        z=z,
        delta_bias=delta_bias,
        delta_softplus=delta_softplus,
        return_last_state=return_last_state,
    )


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = "silu"
) -> torch.Tensor:
    """Depthwise causal convolution of x (b, d, L) with weight (d, 1, k) or (d, k), then optional SiLU.

    Output position t sees inputs t-k+1..t only (left padding k-1, right side cut), as Mamba's conv1d.
    """
    if activation not in (None, *_SILU_NAMES):
        raise TunecostError(f"causal_conv1d: activation must be None or 'silu', got {activation!r}")
    weight_2d = weight.squeeze(1) if weight.dim() == 3 else weight
    if x.is_cuda:
        fused = _cuda_causal_conv1d_fn()
        if fused is not None:
            return fused(x.contiguous(), weight_2d, bias, activation)
    width = weight_2d.shape[-1]
    y = F.conv1d(x, weight_2d.unsqueeze(1), bias, padding=width - 1, groups=x.shape[1])[..., : x.shape[-1]]
    return F.silu(y) if activation is not None else y
