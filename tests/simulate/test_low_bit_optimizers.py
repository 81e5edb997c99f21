"""Low-bit AdamW states as the simulator allocates them: bitsandbytes' 8-bit and torchao's 4-bit layouts, counted by
hand from the libraries' code (torchao/optim/adam.py `_new_buffer`, subclass_4bit.py `OptimState4bit.zeros`)."""

from __future__ import annotations

import pytest
import torch

from tunecost.simulate.step import SimAdamW4bit, SimAdamW8bit, simulated_optimizer


def _state_bytes(optimizer_cls, *shapes, dtype=torch.bfloat16) -> int:
    params = [torch.nn.Parameter(torch.zeros(shape, dtype=dtype)) for shape in shapes]
    optimizer = optimizer_cls(params)
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values())


def test_4bit_states_pack_two_codes_a_byte_with_a_scale_per_128() -> None:
    n = 64 * 128  # 8192 values: quantized
    per_state = n // 2 + 4 * (n // 128) + 4 * 16  # codes, fp32 scales, fp32 code book
    assert _state_bytes(SimAdamW4bit, (64, 128)) == 2 * per_state


@pytest.mark.parametrize("shape", [(32, 64), (4100,)])  # under 4096 values; 128 does not divide 4100
def test_4bit_falls_back_to_states_in_the_parameters_dtype(shape) -> None:
    n = torch.Size(shape).numel()
    assert _state_bytes(SimAdamW4bit, shape) == 2 * 2 * n  # two bf16 states (`zeros_like`)


def test_4bit_states_are_a_bit_over_half_the_8bit_ones() -> None:
    four, eight = _state_bytes(SimAdamW4bit, (1024, 1024)), _state_bytes(SimAdamW8bit, (1024, 1024))
    assert four / eight == pytest.approx((0.5 + 4 / 128) / (1 + 4 / 256), rel=1e-3)


def test_the_optimizer_name_picks_the_4bit_states() -> None:
    assert isinstance(simulated_optimizer("adamw-4bit", [torch.nn.Parameter(torch.zeros(4))]), SimAdamW4bit)
