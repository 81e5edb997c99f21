"""Liger's kernels in the step simulator: the autograd functions compute what eager computes and keep what Liger's
keep (liger-kernel 0.8.5's save_for_backward), and a simulated step with them matches the CPU allocator."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import write_llama_config
from torch import nn

from tunecost.errors import TunecostError
from tunecost.simulate import simulate_step
from tunecost.simulate.liger import FusedLinearCrossEntropy, GLUFunction, RMSNormFunction, liger_loss
from tunecost.simulate.measure import measure_step_peak
from tunecost.workload.job import FineTuneJob, LoraConfig
from tunecost.workload.liger import flce_chunk_rows

TINY = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}  # fmt: skip


def _saved(fn):
    """The (shape, dtype, storage pointer) of every tensor autograd keeps for backward while `fn()` runs."""
    kept = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append((tuple(t.shape), t.dtype, t.untyped_storage().data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, kept


@pytest.mark.parametrize("offset", [0.0, 1.0])  # Gemma's norms scale by 1 + w
def test_rmsnorm_matches_eager_and_keeps_input_weight_and_fp32_rstd(offset: float) -> None:
    x = torch.randn(2, 7, 32, dtype=torch.float64, requires_grad=True)
    w = torch.randn(32, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: RMSNormFunction.apply(x, w, 1e-6, offset, False), (x, w))
    eager = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (w + offset)
    torch.testing.assert_close(RMSNormFunction.apply(x, w, 1e-6, offset, False), eager)
    xb = torch.randn(3, 5, 16, dtype=torch.bfloat16, requires_grad=True)
    _, kept = _saved(lambda: RMSNormFunction.apply(xb, torch.ones(16, dtype=torch.bfloat16), 1e-6, 0.0, True))
    assert kept[0] == ((3, 5, 16), torch.bfloat16, xb.untyped_storage().data_ptr())  # X itself, no copy
    assert [k[:2] for k in kept[1:]] == [((16,), torch.bfloat16), ((15,), torch.float32)]  # W, RSTD per row


@pytest.mark.parametrize("gelu", [False, True])
def test_glu_matches_eager_and_keeps_gate_and_up_only(gelu: bool) -> None:
    a, b = (torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
    a2, b2 = (t.detach().clone().requires_grad_(True) for t in (a, b))
    grad = torch.randn(3, 5, 16, dtype=torch.float64)
    out, kept = _saved(lambda: GLUFunction.apply(a * 1, b * 1, gelu))  # backward writes over its inputs
    act = nn.functional.gelu(a2, approximate="tanh") if gelu else nn.functional.silu(a2)
    torch.testing.assert_close(out, act * b2)
    out.backward(grad)
    (act * b2).backward(grad)
    torch.testing.assert_close((a.grad, b.grad), (a2.grad, b2.grad))
    assert [k[:2] for k in kept] == [((3, 5, 16), torch.float64)] * 2


@pytest.mark.parametrize("head_trains", [False, True])
def test_fused_linear_cross_entropy_matches_eager_and_keeps_no_logits(head_trains: bool) -> None:
    hidden = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    head = nn.Linear(16, 100, bias=False, dtype=torch.float64).requires_grad_(head_trains)
    labels = torch.randint(0, 100, (2, 9))
    labels[0, :3] = -100
    loss, kept = _saved(lambda: liger_loss(hidden, head, labels))
    loss.backward()
    ref_hidden = hidden.detach().clone().requires_grad_(True)
    ref_head = nn.Linear(16, 100, bias=False, dtype=torch.float64)
    ref_head.weight.data.copy_(head.weight.data)
    shifted = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    ref = nn.functional.cross_entropy(ref_head(ref_hidden).view(-1, 100), shifted.reshape(-1))
    ref.backward()
    torch.testing.assert_close(loss, ref.float().to(loss.dtype), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hidden.grad, ref_hidden.grad)
    if head_trains:
        torch.testing.assert_close(head.weight.grad, ref_head.weight.grad)
    # dX (and dW when the head trains), computed in the forward; never a tokens x vocab tensor
    assert [k[:1] for k in kept] == [((18, 16),)] + ([((100, 16),)] if head_trains else [])
    assert FusedLinearCrossEntropy.apply is not None


def test_chunk_rows_follow_liger() -> None:
    """fused_linear_cross_entropy.py's own example: BT = 4096 x 4, V = 32000, H = 4096 -> chunks of 2048."""
    assert flce_chunk_rows(4096 * 4, 4096, 32000) == 2048
    assert flce_chunk_rows(4096, 4096, 128256) == 128  # Llama 3: next_power_of_2(ceil(4096 / 32))
    assert flce_chunk_rows(10, 64, 100) == 8
    assert flce_chunk_rows(3, 4096, 1000) == 3  # never beyond BT


def _job(path, **changes) -> FineTuneJob:
    base = dict(model=str(path), compute_dtype="fp32", batch_size=2, seq_len=64, liger_kernel=True,
                lora=LoraConfig(rank=8, targets=("attention",)))  # fmt: skip
    return FineTuneJob(**(base | changes))


@pytest.fixture
def tiny_llama(tmp_path):
    return write_llama_config(tmp_path / "llama.json", **TINY)


@pytest.mark.parametrize(
    "options",
    [
        dict(method="full", gradient_checkpointing=False),
        dict(method="lora", gradient_checkpointing=False),
        dict(method="lora", gradient_checkpointing=True),
    ],
)
def test_simulated_peak_with_liger_matches_cpu_allocator(tiny_llama, options) -> None:
    """The same step on fake tensors and on real CPU tensors (the profiler's allocator events) within 3 %."""
    job = _job(tiny_llama, **options)
    simulated = simulate_step(job, num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    measured = measure_step_peak(job)
    assert abs(simulated.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes
    assert any(a.startswith("Liger kernels (use_liger_kernel)") for a in simulated.assumptions)


def test_liger_drops_the_logits_from_the_peak(tiny_llama) -> None:
    """A large vocabulary: without Liger the fp32 logits and their gradient set the peak; with it they are gone."""
    eager, liger = (
        simulate_step(_job(tiny_llama, method="lora", liger_kernel=on), num_layers_to_trace=99, use_cache=False)
        for on in (False, True)
    )
    logits_fp32 = 2 * 64 * TINY["vocab_size"] * 4
    assert eager.peak_bytes - liger.peak_bytes > logits_fp32


def test_a_model_liger_does_not_patch_runs_its_own_code(tmp_path) -> None:
    path = tmp_path / "olmo.json"
    path.write_text(json.dumps({"model_type": "olmo", **TINY}))
    eager, liger = (
        simulate_step(_job(path, method="lora", liger_kernel=on), num_layers_to_trace=99, use_cache=False)
        for on in (False, True)
    )
    assert liger.peak_bytes == eager.peak_bytes
    assert any("Liger does not patch model type olmo" in a for a in liger.assumptions)


@pytest.mark.parametrize("stack", ["torchtune", "hf-2024"])
def test_liger_on_a_stack_without_it_is_an_error(tiny_llama, stack: str) -> None:
    with pytest.raises(TunecostError, match="--liger-kernel"):
        _job(tiny_llama, method="lora", stack=stack)
