"""4-bit storage in bitsandbytes' layout: our de-quantization of bitsandbytes' own packed output must equal
bitsandbytes' `dequantize_4bit`, and the byte counts must equal the sizes of bitsandbytes' tensors."""

from __future__ import annotations

import pytest
import torch

from tunecost.simulate.quant4bit import Quantized4bit, QuantSpec, matmul_4bit, packed_bytes, quant_constant_bytes


@pytest.mark.parametrize("double_quant", [True, False])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_dequantize_matches_bitsandbytes(double_quant, quant_type):
    bnbf = pytest.importorskip("bitsandbytes.functional")
    torch.manual_seed(0)
    w = torch.randn(3, 96, 200)  # 19200 values per matrix: 300 blocks of 64, a partial second-level block
    q = Quantized4bit(3, 96, 200, QuantSpec(quant_type, double_quant))
    q.load_from(w)
    for i in range(3):
        packed, state = bnbf.quantize_4bit(w[i], blocksize=64, compress_statistics=double_quant, quant_type=quant_type)
        expected = bnbf.dequantize_4bit(packed, state)
        got = q.dequantize(i, torch.float32)
        assert got.shape == (96, 200)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
        # byte counts: packed codes and constants exactly as bitsandbytes stores them
        assert packed.numel() == packed_bytes(96 * 200) == q.packed.shape[1]
        consts = state.absmax.numel() * state.absmax.element_size()
        if double_quant:
            consts += state.state2.absmax.numel() * 4 + 4  # second-level absmax + offset
        assert consts == quant_constant_bytes(96 * 200, double_quant)


def test_matmul_4bit_gradient_flows_to_input_only():
    torch.manual_seed(0)
    w = torch.randn(1, 32, 64)
    q = Quantized4bit(1, 32, 64, QuantSpec("nf4", True))
    q.load_from(w)
    x = torch.randn(5, 64, requires_grad=True)
    y = matmul_4bit(x, q)
    y.sum().backward()
    dense = q.dequantize(0, torch.float32)
    torch.testing.assert_close(y, x.detach() @ dense.t())
    torch.testing.assert_close(x.grad, torch.ones(5, 32) @ dense)


def test_fake_dequantize_allocates_matrix_and_absmax_only():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with torch.device("meta"):
        q = Quantized4bit(2, 128, 256, QuantSpec("nf4", True))
    from tunecost.simulate.tensor_groups import to_fake

    to_fake(q, mode)
    with mode:
        w = q.dequantize(1, torch.bfloat16)
    assert w.shape == (128, 256) and w.dtype == torch.bfloat16
