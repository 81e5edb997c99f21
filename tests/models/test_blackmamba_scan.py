"""The chunked selective scan against the sequential reference loop (forward, last state and gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tunecost.errors import TunecostError
from tunecost.models.blackmamba.scan import (
    causal_conv1d,
    default_chunk_size,
    selective_scan,
    selective_scan_chunked,
    selective_scan_reference,
)

NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")  # the scans' positional arguments, in order


def _inputs(b: int, d: int, n: int, seqlen: int, *, dtype=torch.float32, seed: int = 0, delta_scale=0.5):
    g = torch.Generator().manual_seed(seed)
    t = {
        "u": torch.randn(b, d, seqlen, generator=g),
        "delta": torch.randn(b, d, seqlen, generator=g) * delta_scale,
        "A": -(torch.rand(d, n, generator=g) * 4 + 0.1),
        "B": torch.randn(b, n, seqlen, generator=g),
        "C": torch.randn(b, n, seqlen, generator=g),
        "D": torch.randn(d, generator=g),
        "z": torch.randn(b, d, seqlen, generator=g),
        "delta_bias": torch.randn(d, generator=g) * 0.5,
    }
    return {k: v.to(dtype).requires_grad_(True) for k, v in t.items()}


def _run(fn, t, **kw):
    """fn(u, delta, A, B, C, D, z, delta_bias) of the tensors in `t`, softplus on delta; returns its last state too."""
    return fn(*(t[k] for k in NAMES), delta_softplus=True, return_last_state=True, **kw)


def _grads(out, last, t, weight_out, weight_last):
    loss = (out * weight_out).sum() + (last * weight_last).sum()
    return torch.autograd.grad(loss, [t[k] for k in NAMES])


# (batch, d_inner, d_state, seqlen, chunk): chunk sizes that divide L, leave a ragged last chunk, exceed L.
SHAPES = [(2, 8, 4, 37, 8), (1, 16, 16, 64, 16), (3, 5, 3, 20, 7), (2, 4, 2, 1, None), (1, 16, 8, 100, None)]


@pytest.mark.parametrize("b,d,n,seqlen,chunk", SHAPES)
def test_chunked_matches_reference_fp32_forward_and_gradients(b, d, n, seqlen, chunk):
    t = _inputs(b, d, n, seqlen)
    out_ref, last_ref = _run(selective_scan_reference, t)
    out, last = _run(selective_scan_chunked, t, chunk_size=chunk)
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(last, last_ref, rtol=1e-4, atol=1e-5)
    g = torch.Generator().manual_seed(1)
    w_out, w_last = torch.randn(out.shape, generator=g), torch.randn(last.shape, generator=g)
    for name, got, want in zip(NAMES, _grads(out, last, t, w_out, w_last), _grads(out_ref, last_ref, t, w_out, w_last)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"d/d{name}: {m}")


def test_fp64_inputs_are_computed_in_fp64_and_agree_tightly():
    t = _inputs(2, 6, 4, 45, dtype=torch.float64)
    out_ref, last_ref = _run(selective_scan_reference, t)
    out, last = _run(selective_scan_chunked, t, chunk_size=8)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, last_ref, rtol=1e-12, atol=1e-12)


def test_gradcheck_on_a_small_case():
    t = _inputs(1, 3, 2, 11, dtype=torch.float64)

    def fn(*xs):
        return selective_scan_chunked(*xs[:6], z=xs[6], delta_bias=xs[7], chunk_size=4)

    assert torch.autograd.gradcheck(fn, tuple(t[k] for k in NAMES))


def test_large_decays_neither_overflow_nor_drift():
    """delta*|A| up to ~1000 per step: an exp(-cumsum) closed form would overflow; products of decays don't."""
    t = _inputs(1, 8, 16, 96, delta_scale=30.0)
    with torch.no_grad():
        t["A"].mul_(20)
    out_ref, _ = _run(selective_scan_reference, t)
    out, _ = _run(selective_scan_chunked, t, chunk_size=32)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-4)


def test_optional_inputs_and_dtype():
    t = _inputs(2, 4, 3, 17)
    ref = selective_scan_reference(t["u"], t["delta"], t["A"], t["B"], t["C"], delta_softplus=False)
    got = selective_scan_chunked(t["u"], t["delta"], t["A"], t["B"], t["C"], delta_softplus=False)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    bf = {k: v.detach().to(torch.bfloat16) for k, v in t.items()}
    out = selective_scan(bf["u"], bf["delta"], bf["A"], bf["B"], bf["C"], bf["D"], z=bf["z"])
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, 17)


def test_dispatch_on_cpu_is_the_chunked_scan():
    t = _inputs(1, 4, 2, 9)
    a = selective_scan(t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], z=t["z"], delta_bias=t["delta_bias"])
    b = selective_scan_chunked(t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], z=t["z"], delta_bias=t["delta_bias"])
    assert torch.equal(a, b)


def test_bad_shapes_are_user_errors():
    t = _inputs(1, 4, 2, 9)
    with pytest.raises(TunecostError, match="B must have shape"):
        selective_scan(t["u"], t["delta"], t["A"], t["B"][:, :, :5], t["C"])


def test_default_chunk_size_is_about_sqrt_length():
    assert default_chunk_size(512) == 32
    assert default_chunk_size(1) == 8
    assert default_chunk_size(2048) == 64


def test_causal_conv1d_matches_a_hand_loop_and_is_causal():
    g = torch.Generator().manual_seed(0)
    x, w, bias = torch.randn(2, 3, 10, generator=g), torch.randn(3, 1, 4, generator=g), torch.randn(3, generator=g)
    y = causal_conv1d(x, w, bias, activation=None)
    padded = F.pad(x, (3, 0))
    expected = torch.stack([(padded[:, :, t : t + 4] * w[:, 0]).sum(-1) + bias for t in range(10)], dim=-1)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(causal_conv1d(x, w.squeeze(1), bias), F.silu(expected))
    x2 = x.clone()
    x2[:, :, 6:] += 1.0  # the future must not leak into positions 0..5
    torch.testing.assert_close(causal_conv1d(x2, w, bias)[:, :, :6], causal_conv1d(x, w, bias)[:, :, :6])
