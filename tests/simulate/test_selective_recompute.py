"""Selective recomputation (Megatron's `recompute_granularity: selective`): the core attention runs under
checkpointing, so a layer keeps everything but what the attention kernel saves beyond its inputs."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_models import write_llama_config

from tunecost.distributed.activation_formulas import llama_layer_activation_bytes, traced_layer_activation_bytes
from tunecost.distributed.single_step import single_gpu_step
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.counts import analytic_step_counts
from tunecost.estimate.throughput.coverage import setup_label
from tunecost.models.catalog import resolve_model
from tunecost.simulate.cache import job_key
from tunecost.simulate.overhead import DEFAULT_OVERHEAD
from tunecost.simulate.prepare import check_supported
from tunecost.workload.job import FineTuneJob, default_gradient_checkpointing

DIMS = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
SEQ, BATCH = 64, 2


@pytest.fixture(scope="module")
def config_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("llama") / "config.json"
    return str(write_llama_config(path, vocab_size=256, num_hidden_layers=2, **DIMS))


def _job(path: str, **fields) -> FineTuneJob:
    base = dict(model=path, method="full", batch_size=BATCH, seq_len=SEQ, gradient_checkpointing=False)
    return FineTuneJob(**{**base, **fields})


def _per_layer(job: FineTuneJob) -> int:
    step = single_gpu_step(job, granule_bytes=1)
    return traced_layer_activation_bytes(step.segments, step.num_layers)


def _form(recompute: str) -> float:
    h, a, kv, f = (DIMS[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size"))
    return llama_layer_activation_bytes(SEQ, BATCH, h=h, a=a, kv=kv, f=f, d=2, recompute=recompute)


def test_a_fused_kernel_keeps_all_but_its_log_sum_exp(config_path) -> None:
    """With a fused attention kernel the core attention saves its output and log-sum-exp; recomputed, the output
    is still the output projection's saved input, so one layer keeps exactly the Llama form's selective count."""
    none, selective = _per_layer(_job(config_path)), _per_layer(_job(config_path, selective_recompute=True))
    assert none == _form("none")
    assert selective == _form("selective")
    assert none - selective == 4 * BATCH * DIMS["num_attention_heads"] * SEQ  # the fp32 log-sum-exp


def test_eager_attention_drops_its_scores(config_path) -> None:
    """Eager attention saves its (B, heads, L, L) scores and probabilities; recomputed, none of them stay."""
    none = _per_layer(_job(config_path, attention="eager"))
    selective = _per_layer(_job(config_path, attention="eager", selective_recompute=True))
    scores = 2 * BATCH * DIMS["num_attention_heads"] * SEQ * SEQ  # one bf16 (B, heads, L, L) tensor
    assert none - selective >= 2 * scores
    assert selective <= _form("selective")


def test_the_job_takes_one_recomputation(config_path) -> None:
    with pytest.raises(TunecostError, match="selective-recompute"):
        _job(config_path, selective_recompute=True, gradient_checkpointing=True)
    assert not default_gradient_checkpointing("lora", selective_recompute=True)
    assert default_gradient_checkpointing("lora")
    job = FineTuneJob(model="blackmamba-2.8b", method="full", selective_recompute=True, gradient_checkpointing=False)
    with pytest.raises(TunecostError, match="selective recomputation"):
        check_supported(job, resolve_model(job.model))


def test_the_flag_enters_the_cache_key_only_when_set(config_path, monkeypatch) -> None:
    """A job without it hashes as before the option existed (its field left out), so cached results still hold."""
    job = _job(config_path)
    key = job_key(job, 2, DEFAULT_OVERHEAD)
    asdict = dataclasses.asdict
    monkeypatch.setattr(
        dataclasses, "asdict", lambda obj: {k: v for k, v in asdict(obj).items() if k != "selective_recompute"}
    )
    assert job_key(job, 2, DEFAULT_OVERHEAD) == key
    monkeypatch.undo()
    assert job_key(job.with_(selective_recompute=True), 2, DEFAULT_OVERHEAD) != key


def test_the_step_counts_run_the_attention_forward_again() -> None:
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    base = FineTuneJob(model=spec.name, method="lora", seq_len=4096, gradient_checkpointing=False)
    jobs = [base, base.with_(selective_recompute=True), base.with_(gradient_checkpointing=True)]
    none, selective, full = (analytic_step_counts(spec, j) for j in jobs)
    once = selective.flops_by_class["attention"] - none.flops_by_class["attention"]
    assert once > 0 and full.flops_by_class["attention"] == pytest.approx(selective.flops_by_class["attention"])
    assert selective.flops_by_class["dense_matmul"] == none.flops_by_class["dense_matmul"]
    assert setup_label(jobs[1]).startswith("selective recompute, bf16")


def test_torch_compile_leaves_the_simulation_key_as_it_was(config_path, monkeypatch) -> None:
    """The simulated step is eager's under torch.compile too: one key for both, the key of before the field."""
    job = _job(config_path)
    key = job_key(job, 2, DEFAULT_OVERHEAD)
    assert job_key(job.with_(torch_compile=True), 2, DEFAULT_OVERHEAD) == key
    asdict = dataclasses.asdict
    monkeypatch.setattr(
        dataclasses, "asdict", lambda obj: {k: v for k, v in asdict(obj).items() if k != "torch_compile"}
    )
    assert job_key(job, 2, DEFAULT_OVERHEAD) == key
