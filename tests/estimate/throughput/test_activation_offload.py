"""Activation offload's copies beside the step's compute (`estimate.throughput.activation_offload`)."""

from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate.throughput.activation_offload import copies_seconds, offloaded_bytes, with_copies_s
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import FineTuneJob

JOB = FineTuneJob(model="llama-3.2-3b", method="full", batch_size=2, seq_len=4096)


def test_the_copies_are_each_layer_input_and_two_more_hidden_states_each_way() -> None:
    spec = resolve_model(JOB.model)  # 28 layers of hidden 3072, bf16
    assert offloaded_bytes(spec, JOB, 8192) == (28 + 2) * 8192 * 3072 * 2
    # to the host and back over PCIe (A100: PCIe 4; H100 SXM: PCIe 5, faster)
    a100, h100 = (copies_seconds(spec, JOB, 8192, gpu) for gpu in ("A100-80GB-SXM", "H100-80GB-SXM"))
    assert 0 < h100 < a100


def test_without_checkpointing_the_copies_are_not_modelled() -> None:
    with pytest.raises(TunecostError, match="without gradient checkpointing"):
        offloaded_bytes(resolve_model(JOB.model), JOB.with_(gradient_checkpointing=False), 8192)


def test_copies_hide_under_longer_compute_and_set_the_step_when_longer() -> None:
    assert with_copies_s(1.0, 0.1) == pytest.approx(1.0, rel=1e-3)
    assert with_copies_s(0.1, 1.0) == pytest.approx(1.0, rel=1e-3)
    assert with_copies_s(1.0, 1.0) > 1.0  # the roofline's soft corner


@pytest.mark.long  # CI runs it (with the test beside it, 7-15 s of work no other test shares)
def test_estimate_says_what_the_copies_cost(cli_json) -> None:
    job = {"model": "llama-3.2-3b", "method": "lora", "gpu": "A100-80GB", "seq_len": 4096, "batch_size": 2}
    job |= {"epochs": 1, "queries": 1000, "stack": "torchtune"}
    plain, offloaded = cli_json("estimate", **job)[0], cli_json("estimate", **job, offload_activations=True)[0]
    assert "activation offload:" in offloaded["notes"] and "ms of host copies" in offloaded["notes"]
    assert offloaded["queries_per_s"] == pytest.approx(plain["queries_per_s"], rel=0.01)  # hidden under compute


@pytest.mark.long  # CI runs it (with the test beside it, 7-15 s of work no other test shares)
def test_the_simulate_estimator_prices_the_copies_and_several_gpus_say_they_do_not(cli_json) -> None:
    job = {"model": "llama-3.2-3b", "method": "lora", "gpu": "A100-80GB", "seq_len": 4096, "batch_size": 2}
    job |= {"epochs": 1, "queries": 1000, "stack": "torchtune", "offload_activations": True}
    single = cli_json("estimate", **job, estimator="simulate")[0]
    assert "activation offload:" in single["notes"] and "ms of host copies" in single["notes"]
    several = cli_json("estimate", **job, gpus=2, strategy="ddp")
    assert any("host copies beside each rank's compute are not in the step time" in n for n in several["notes"])
