"""LoRA dropout (PEFT's `lora_dropout`): a dropout on each adapter's input, whose mask (and, where the input was not
copied already, its dropped copy) the step keeps for backward; the step counts read and write it each pass."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_models import write_llama_config

from tunecost.distributed.activation_formulas import traced_layer_activation_bytes
from tunecost.distributed.single_step import single_gpu_step
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.counts import analytic_step_counts
from tunecost.models.catalog import resolve_model
from tunecost.simulate.cache import job_key
from tunecost.simulate.overhead import DEFAULT_OVERHEAD
from tunecost.workload.job import FineTuneJob, LoraConfig

DIMS = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
TOKENS = 2 * 64
INPUTS = 6 * 64 + 128  # q, k, v, o, gate and up read the hidden size; down the intermediate size


@pytest.fixture(scope="module")
def config_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("llama") / "config.json"
    return str(write_llama_config(path, vocab_size=256, num_hidden_layers=2, **DIMS))


def _job(path: str, dropout: float) -> FineTuneJob:
    lora = LoraConfig(rank=4, alpha=8, targets=("attention", "mlp"), dropout=dropout)
    return FineTuneJob(model=path, method="lora", lora=lora, batch_size=2, seq_len=64, gradient_checkpointing=False)


def _per_layer(job: FineTuneJob, stack: str) -> int:
    step = single_gpu_step(job.with_(stack=stack), granule_bytes=1)
    return traced_layer_activation_bytes(step.segments, step.num_layers)


# the inputs only the adapters kept before (frozen base weights need no input): the attention block's and the
# MLP's normalized inputs (q, k and v share one, gate and up another) and the down projection's; the output
# projection's input is the attention kernel's output, which it keeps anyway
ADAPTER_ONLY_INPUTS = 64 + 64 + 128


def test_each_adapter_keeps_a_mask_and_its_dropped_input(config_path) -> None:
    """Adapters in the compute dtype (tunecost's stack, torchtune's): each keeps its dropped bf16 input and the
    1-byte mask the GPU's fused dropout keeps, where before the adapters of one input shared it."""
    plain, dropped = (_per_layer(_job(config_path, p), "tunecost") for p in (0.0, 0.1))
    assert dropped - plain == TOKENS * (3 * INPUTS - 2 * ADAPTER_ONLY_INPUTS)


def test_peft_adds_only_the_mask(config_path) -> None:
    """PEFT's fp32 adapters keep a cast copy of their input already: the dropout adds its mask, 1 byte each."""
    plain, dropped = (_per_layer(_job(config_path, p), "hf-peft") for p in (0.0, 0.1))
    assert dropped - plain == TOKENS * INPUTS


def test_the_counts_move_the_dropout_and_the_key_holds_without_it(config_path, monkeypatch) -> None:
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    base = FineTuneJob(model=spec.name, method="lora", seq_len=1024, lora=LoraConfig(targets=("attention", "mlp")))
    plain = analytic_step_counts(spec, base)
    dropped = analytic_step_counts(spec, base.with_(lora=dataclasses.replace(base.lora, dropout=0.05)))
    assert dropped.bytes_by_class["lora"] > plain.bytes_by_class["lora"]
    assert dropped.flops_by_class["lora"] == plain.flops_by_class["lora"]
    with pytest.raises(TunecostError, match="--lora-dropout"):
        LoraConfig(dropout=1.0)
    job = _job(config_path, 0.0)
    key = job_key(job, 2, DEFAULT_OVERHEAD)
    asdict = dataclasses.asdict

    def without_dropout(obj):
        out = asdict(obj)
        if isinstance(out.get("lora"), dict):
            out["lora"] = {k: v for k, v in out["lora"].items() if k != "dropout"}
        return out

    monkeypatch.setattr(dataclasses, "asdict", without_dropout)
    assert job_key(job, 2, DEFAULT_OVERHEAD) == key  # as before the field existed
    monkeypatch.undo()
    assert job_key(_job(config_path, 0.1), 2, DEFAULT_OVERHEAD) != key
