"""The torchtune stack: its simulated step equals the same step on real CPU tensors (the CPU allocator's peak, an
independent measurement), its loss allocates what torchtune's code does, its adapters are in the compute dtype,
and activation offload moves saved tensors off the device."""

from __future__ import annotations

import pytest
import torch
from tiny_models import gqa_attention, write_llama_config

from tunecost.errors import TunecostError
from tunecost.simulate import simulate_step
from tunecost.simulate.behaviour import (
    LOSS_TORCHTUNE,
    LOSS_TORCHTUNE_CHUNKED,
    TORCHTUNE_OUTPUT_CHUNKS,
    StackBehaviour,
    torchtune_loss,
    torchtune_output,
)
from tunecost.simulate.measure import allocation_peak_bytes, measure_step_peak
from tunecost.simulate.prepare import build_prepared
from tunecost.workload.job import FineTuneJob, LoraConfig

B, L, V, H = 2, 16, 1000, 64  # batch, sequence length, vocabulary, hidden size
T = B * L
I64 = 8
CHUNKED = StackBehaviour(loss_code=LOSS_TORCHTUNE_CHUNKED)
OFFLOAD = StackBehaviour(loss_code=LOSS_TORCHTUNE_CHUNKED, activation_offload=True)


def _job(tmp_path, **overrides) -> FineTuneJob:
    sizes = gqa_attention(H, 4)
    path = write_llama_config(
        tmp_path / "config.json", intermediate_size=128, num_hidden_layers=3, vocab_size=512, **sizes
    )
    fields = {
        "model": str(path),
        "method": "lora",
        "lora": LoraConfig(rank=4, alpha=8, targets=("attention", "mlp")),
        "attention": "sdpa",
        "batch_size": B,
        "seq_len": 32,
        **overrides,
    }
    return FineTuneJob(**fields)


# bf16 where the CPU kernels allocate what a GPU's do; the chunked loss in fp32: on CPU, bf16 matmuls of the chunked
# output's backward allocate internal weight copies (+9 % of a 1.2 MB step here) that no CUDA kernel makes. QLoRA
# without checkpointing: with it, the scratch of the measurement's own CPU 4-bit decode (int64 codes and block
# indices of a whole matrix, `quant4bit._dequantize_4bit_cpu`) lands on the peak of a model this small
@pytest.mark.parametrize(
    ("method", "checkpointing", "behaviour", "dtype"),
    [
        ("lora", True, StackBehaviour(), "bf16"),
        ("full", False, StackBehaviour(), "bf16"),
        ("full", True, StackBehaviour(optimizer_in_backward=True), "bf16"),
        ("lora", False, CHUNKED, "fp32"),
        ("qlora", False, CHUNKED, "fp32"),
    ],
)
def test_simulated_peak_matches_cpu_allocator(tmp_path, method, checkpointing, behaviour, dtype) -> None:
    job = _job(tmp_path, method=method, gradient_checkpointing=checkpointing, compute_dtype=dtype)
    simulated = simulate_step(
        job.with_(stack="torchtune"), num_layers_to_trace=99, behaviour=behaviour, granule_bytes=1, use_cache=False
    )
    measured = measure_step_peak(job.with_(stack="torchtune"), behaviour=behaviour)
    assert measured.num_events > 100
    assert abs(simulated.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes


def test_loss_allocates_what_torchtunes_code_does() -> None:
    """Bytes beside the bf16 hidden states and the head, read off torchtune's code (fp32 logits, shifted labels)."""
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False, dtype=torch.bfloat16)
    hidden = torch.randn(B, L, H, generator=g).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, V, (B, L), generator=g)

    def plain() -> torch.Tensor:
        return torchtune_loss(torchtune_output(LOSS_TORCHTUNE, head, hidden), labels)

    def chunked() -> torch.Tensor:
        return torchtune_loss(torchtune_output(LOSS_TORCHTUNE_CHUNKED, head, hidden), labels)

    labels_bytes = I64 * B * L + I64 * B  # the shifted labels (hstack) and the ignored last column
    # bf16 logits (2 T V, a temporary), their fp32 copy (4 T V), log_softmax (4 T V)
    peak, _ = allocation_peak_bytes(plain)
    assert peak >= 2 * T * V + 4 * T * V + labels_bytes
    assert peak <= 2 * T * V + 4 * T * V + 4 * T * V + labels_bytes + 64
    # every bf16 chunk (2 T V) and every chunk's kept log_softmax (4 T V), one fp32 copy of a chunk at a time
    chunk = T * V // TORCHTUNE_OUTPUT_CHUNKS
    peak_chunked, _ = allocation_peak_bytes(chunked)
    # (beside them, under 1 KiB per chunk: the labels' copies nll_loss keeps, masks and scalars)
    assert 2 * T * V + 4 * T * V <= peak_chunked <= 2 * T * V + 4 * T * V + 4 * chunk + 1024 * TORCHTUNE_OUTPUT_CHUNKS
    assert peak_chunked < peak
    ours = float(plain().detach())
    reference = torch.nn.functional.cross_entropy(
        head(hidden)[:, :-1].float().reshape(-1, V), labels[:, 1:].reshape(-1)
    )
    assert ours == pytest.approx(float(reference.detach()), rel=1e-5)
    assert float(chunked().detach()) == pytest.approx(ours, rel=1e-5)


def test_adapters_are_in_the_compute_dtype(tmp_path) -> None:
    job = _job(tmp_path)
    tune = build_prepared(job.with_(stack="torchtune"), num_units=1)
    peft = build_prepared(job.with_(stack="hf-peft"), num_units=1)
    assert {p.dtype for p in tune.trainable} == {torch.bfloat16}
    assert {p.dtype for p in peft.trainable} == {torch.float32}


def test_activation_offload_moves_saved_tensors_off_the_device(tmp_path) -> None:
    job = _job(tmp_path, method="full", gradient_checkpointing=False)
    kept = simulate_step(job.with_(stack="torchtune"), behaviour=CHUNKED, use_cache=False)
    offloaded = simulate_step(job.with_(stack="torchtune"), behaviour=OFFLOAD, use_cache=False)
    assert offloaded.peak_bytes < kept.peak_bytes
    assert any("activation offload" in line for line in offloaded.assumptions)


def test_optimizer_in_backward_frees_each_gradient(tmp_path) -> None:
    """With optimizer_in_bwd no more than one parameter's gradient is alive at any point of the backward (each is
    applied and freed as it completes); without it the gradients pile up over the layers."""
    from tunecost.simulate.trace import trace_step

    job = _job(tmp_path, method="full", gradient_checkpointing=True, optimizer="sgd")
    held = {}
    for in_backward in (False, True):
        behaviour = StackBehaviour(optimizer_in_backward=in_backward)
        prepared = build_prepared(job.with_(stack="torchtune"), num_units=2, behaviour=behaviour)
        largest = max(p.numel() * p.element_size() for p in prepared.trainable)
        trace = trace_step(prepared, B, 32, round_bytes=1)
        held[in_backward] = max(
            s.by_category.get("gradients", 0) for k, s in trace.segments.items() if k.startswith("backward")
        )
    assert held[True] <= largest < held[False]


def test_offload_and_torchtune_loss_need_the_torchtune_stack(tmp_path) -> None:
    job = _job(tmp_path)
    with pytest.raises(TunecostError, match="stack torchtune"):
        simulate_step(job.with_(stack="hf-peft"), behaviour=OFFLOAD, use_cache=False)
    with pytest.raises(TunecostError, match="simulated only"):
        measure_step_peak(job.with_(stack="torchtune"), behaviour=OFFLOAD)
