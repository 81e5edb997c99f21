"""Some layers recomputed (`--recompute-layers`, Megatron's block method): the step between every layer and none,
checked against real PyTorch with the first k layers of a tiny Llama checkpointed (transformers' per-layer
`gradient_checkpointing` flag), on the CPU allocator as the simulator's other checks are."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.simulate import simulate_step
from tunecost.simulate.measure import build_prepared, make_batch, profile_step_peak, run_step
from tunecost.workload.job import FineTuneJob, LoraConfig

TINY_LLAMA_4L = Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-llama-4l.json"
JOB = FineTuneJob(
    model=str(TINY_LLAMA_4L),
    method="lora",
    lora=LoraConfig(rank=8, targets=("attention", "mlp")),
    compute_dtype="fp32",
    batch_size=2,
    seq_len=64,
)


def _measured_with_first_layers_checkpointed(k: int) -> int:
    prepared = build_prepared(JOB.with_(stack="tunecost"), num_units=None, real=True, seed=0)
    layers = [m for m in prepared.model.modules() if type(m).__name__ == "LlamaDecoderLayer"]
    assert len(layers) == 4
    for layer in layers[k:]:
        layer.gradient_checkpointing = False  # transformers checks the flag per layer
    batch = make_batch(int(prepared.model.config.vocab_size), JOB.batch_size, 64, None, 0)
    run_step(prepared, batch)
    return profile_step_peak(prepared, batch).peak_bytes


@pytest.mark.parametrize("k", [1, 3])
def test_the_peak_with_some_layers_recomputed_matches_real_pytorch(k: int) -> None:
    simulated = simulate_step(JOB.with_(recompute_layers=k), num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    measured = _measured_with_first_layers_checkpointed(k)
    assert abs(simulated.peak_bytes - measured) <= 0.03 * measured
    every = simulate_step(JOB, num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    none = simulate_step(JOB.with_(gradient_checkpointing=False), num_layers_to_trace=99, granule_bytes=1)
    assert every.peak_bytes < simulated.peak_bytes < none.peak_bytes
    assert simulated.counts["recompute"].flops == pytest.approx(every.counts["recompute"].flops * k / 4)
    assert any(f"{k} of 4 layers recomputed" in a for a in simulated.assumptions)


def test_every_layer_is_the_checkpointed_step_and_bad_counts_are_errors() -> None:
    every = simulate_step(JOB, num_layers_to_trace=99, granule_bytes=1)
    assert simulate_step(JOB.with_(recompute_layers=4), num_layers_to_trace=99, granule_bytes=1) == every
    with pytest.raises(TunecostError, match="--recompute-layers 5: the model has 4 layers"):
        simulate_step(JOB.with_(recompute_layers=5))
    with pytest.raises(TunecostError, match="needs gradient checkpointing"):
        JOB.with_(gradient_checkpointing=False, recompute_layers=2)
    with pytest.raises(TunecostError, match="must be >= 1"):
        JOB.with_(recompute_layers=0)


def test_the_throughput_counts_recompute_that_share_of_the_layers() -> None:
    from tunecost.estimate.throughput.counts import analytic_step_counts

    spec = resolve_model("meta-llama/Llama-3.1-8B")
    job = FineTuneJob(model=spec.name, method="lora", lora=LoraConfig(targets=("attention", "mlp")), seq_len=2048)
    every, half = analytic_step_counts(spec, job), analytic_step_counts(spec, job.with_(recompute_layers=16))
    none = analytic_step_counts(spec, job.with_(gradient_checkpointing=False))
    assert half.total_flops == pytest.approx((every.total_flops + none.total_flops) / 2, rel=1e-9)
