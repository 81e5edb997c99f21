"""LLM.int8 base weights (8-bit LoRA): the simulated layer against bitsandbytes' own `Linear8bitLt` and
`MatMul8bitLt` on the CPU (values, stored bytes, what autograd keeps under checkpointing), and the simulated peak
of a tiny Llama against the same step on real CPU tensors."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from tunecost.errors import TunecostError
from tunecost.simulate import simulate_step
from tunecost.simulate.int8 import matmul_int8
from tunecost.simulate.measure import measure_step_peak
from tunecost.simulate.quant4bit import Quantized4bit, QuantSpec
from tunecost.workload.job import FineTuneJob, LoraConfig

bnb = pytest.importorskip("bitsandbytes")
TINY_LLAMA_4L = Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-llama-4l.json"


def _bnb_linear(weight: torch.Tensor):
    """bitsandbytes' frozen 8-bit layer (what `load_in_8bit` puts in the model), on the CPU."""
    rows, cols = weight.shape
    layer = bnb.nn.Linear8bitLt(cols, rows, bias=False, has_fp16_weights=False, threshold=6.0)
    layer.load_state_dict({"weight": weight})
    return layer.to("cpu")


def test_stored_bytes_are_bitsandbytes_int8params():
    torch.manual_seed(0)
    w = torch.randn(48, 80)
    layer = _bnb_linear(w)
    q = Quantized4bit(1, 48, 80, QuantSpec("int8"))
    q.load_from(w[None])
    assert torch.equal(q.CB[0], layer.weight.data) and torch.equal(q.SCB[0], layer.weight.SCB)
    assert q.storage_bytes() == (48 * 80, 48 * 4)  # int8 codes; one fp32 absmax per output row


def test_forward_and_input_gradient_match_matmul8bitlt():
    from bitsandbytes.autograd._functions import MatMul8bitLt, MatmulLtState

    torch.manual_seed(0)
    w = torch.randn(48, 80)
    layer = _bnb_linear(w)
    state = MatmulLtState()
    state.CB, state.SCB, state.threshold, state.has_fp16_weights = layer.weight.data, layer.weight.SCB, 6.0, False
    x = (0.5 * torch.randn(12, 80)).to(torch.bfloat16).requires_grad_()  # no |x| >= 6 outlier
    ours_x = x.detach().clone().requires_grad_()
    expected = MatMul8bitLt.apply(x, layer.weight, None, None, state)
    got = matmul_int8(ours_x, layer.weight.data, layer.weight.SCB)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=0.02, atol=0.02)
    grad = torch.randn(12, 48, dtype=torch.bfloat16)
    expected.backward(grad)
    got.backward(grad)
    torch.testing.assert_close(ours_x.grad, x.grad)


def _input_kept_after_checkpointed_forward(linear, reentrant: bool) -> bool:
    """Whether the input of `linear`, made inside a checkpointed function, is still alive once forward is done."""
    kept: list[weakref.ref] = []

    def block(x):
        h = torch.relu(x * 2.0)  # a fresh activation: only `linear` could keep it
        kept.append(weakref.ref(h))
        return linear(h)

    x = torch.randn(6, 80, dtype=torch.bfloat16, requires_grad=True)
    y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant)
    gc.collect()
    alive = kept[0]() is not None
    y.float().sum().backward()
    return alive


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_input_outlives_non_reentrant_checkpointing_as_in_bitsandbytes(reentrant: bool):
    """MatMul8bitLt (and its CPU twin) hold their input on `ctx`, which checkpointing does not discard: under
    non-re-entrant checkpointing the input lives until backward; re-entrant forward builds no graph."""
    torch.manual_seed(0)
    w = torch.randn(48, 80)
    layer = _bnb_linear(w)
    q = Quantized4bit(1, 48, 80, QuantSpec("int8"))
    q.load_from(w[None])
    ours = _input_kept_after_checkpointed_forward(lambda h: matmul_int8(h, q.CB[0], q.SCB[0]), reentrant)
    theirs = _input_kept_after_checkpointed_forward(layer, reentrant)
    assert ours == theirs == (not reentrant)


@pytest.mark.parametrize("checkpointing", [True, False])
def test_simulated_peak_matches_cpu_allocator(checkpointing: bool):
    job = FineTuneJob(
        model=str(TINY_LLAMA_4L),
        method="qlora",
        quant_type="int8",
        compute_dtype="bf16",
        batch_size=2,
        seq_len=16,
        lora=LoraConfig(rank=8, targets=("attention", "mlp")),
        gradient_checkpointing=checkpointing,
    )
    simulated = simulate_step(job, num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    measured = measure_step_peak(job)
    assert simulated.breakdown_bytes["weights_8bit"] > 0
    assert abs(simulated.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes


def test_int8_is_for_dense_models(config_path):
    job = FineTuneJob(model=config_path("tiny-mixtral-2l"), method="qlora", quant_type="int8", seq_len=16)
    with pytest.raises(TunecostError, match="8-bit .LLM.int8. base weights are simulated for dense models"):
        simulate_step(job, use_cache=False)


def test_stacks_without_8bit_lora_refuse_it():
    lora = LoraConfig(rank=8, targets=("attention", "mlp"))
    job = FineTuneJob(model=str(TINY_LLAMA_4L), method="qlora", quant_type="int8", seq_len=16, lora=lora)
    for stack in ("hf-2024", "torchtune"):
        with pytest.raises(TunecostError, match=f"stack {stack} has no 8-bit .LLM.int8. LoRA"):
            simulate_step(job.with_(stack=stack), use_cache=False)
