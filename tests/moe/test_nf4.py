"""NF4ExpertWeights: the stored bytes are 4-bit and de-quantize exactly as bitsandbytes does per matrix."""

from __future__ import annotations

import pytest
import torch

from tunecost.errors import TunecostError
from tunecost.moe.nf4 import NF4ExpertWeights


@pytest.fixture(scope="module")
def weights():
    torch.manual_seed(0)
    return torch.randn(4, 96, 64) * 0.1


def _bnb_roundtrip(matrix: torch.Tensor) -> torch.Tensor:
    import bitsandbytes.functional as bnbf

    data, state = bnbf.quantize_4bit(matrix.contiguous(), blocksize=64, compress_statistics=True, quant_type="nf4")
    return bnbf.dequantize_4bit(data, state)


@pytest.mark.parametrize("parts", [1, 2])
def test_dequantize_matches_bitsandbytes_per_matrix(weights, parts):
    stack = NF4ExpertWeights.from_dense(weights, parts=parts)
    expected = torch.stack([torch.cat([_bnb_roundtrip(p) for p in w.chunk(parts)]) for w in weights])
    assert torch.equal(stack.dequantize(), expected)
    assert torch.equal(stack.dequantize([3, 1]), expected[[3, 1]])  # only the experts asked for, in that order
    assert (stack.dequantize() - weights).abs().mean() < 0.1 * weights.abs().mean()


def test_last_dimension_not_a_multiple_of_the_blocksize():
    # bitsandbytes 0.50's CPU kernel indexes blocks per row and mis-dequantizes such matrices (about twice the
    # quantization error); our stacks must agree with bitsandbytes' Python reference implementation instead, run
    # as written (`__wrapped__`: bitsandbytes wraps it in torch.compile, ~18 s to compile on 2 cores).
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    torch.manual_seed(1)
    weight = torch.randn(3, 32, 48)
    stack = NF4ExpertWeights.from_dense(weight, double_quant=False)
    code = _get_4bit_code("nf4", weight.device)
    expected = torch.stack(
        [
            _dequantize_4bit_compute.__wrapped__(
                stack.packed[e], stack.absmax[e].reshape(-1), code, 64, (32, 48), torch.float32
            )
            for e in range(3)
        ]
    )
    assert torch.equal(stack.dequantize(), expected)
    assert torch.equal(stack.dequantize([2]), expected[[2]])


def test_stored_bytes_are_4bit(weights):
    stack = NF4ExpertWeights.from_dense(weights)
    numel = weights.numel()
    assert stack.packed.dtype == torch.uint8 and stack.packed.numel() == numel // 2
    assert stack.absmax.dtype == torch.uint8  # double quantization: 8-bit block scales
    assert stack.absmax.numel() == numel // 64
    # packed codes + constants: about 4.1 bits per weight here (plus two fixed code books)
    assert stack.storage_bytes() * 8 / numel < 4.6
    assert not any(p.requires_grad for p in stack.parameters())


def test_to_dtype_keeps_quantization_constants(weights):
    stack = NF4ExpertWeights.from_dense(weights).to(torch.bfloat16)
    assert stack.dtype == torch.bfloat16 and stack.absmax2.dtype == torch.float32
    assert stack.dequantize([0]).dtype == torch.bfloat16


def test_matrix_not_a_multiple_of_the_blocksize_is_an_error():
    with pytest.raises(TunecostError, match="blocksize"):
        NF4ExpertWeights.from_dense(torch.randn(2, 5, 7))
