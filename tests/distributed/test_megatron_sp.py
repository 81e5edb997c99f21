"""Megatron-LM's sequence parallelism on the traced DTensor rank (`distributed.megatron_sp`): the column-parallel
inputs kept as sequence shards (Korthikanti et al. 2022, 4.2.2), their all-gathers repeated in backward, and
`--tp-impl` on the command line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tunecost.distributed.activation_formulas import (
    llama_layer_activation_bytes,
    sp_gathered_excess_bytes,
    traced_layer_activation_bytes,
)
from tunecost.distributed.megatron_sp import kept_gathered_inputs, megatron_sp_step
from tunecost.distributed.model_parallel import model_parallel_rank_memory
from tunecost.distributed.model_parallel_comm import model_parallel_collectives
from tunecost.distributed.tp_single_step import tp_single_gpu_step
from tunecost.errors import TunecostError
from tunecost.workload.job import FineTuneJob, LoraConfig
from tunecost.workload.parallel import ParallelPlan

from .tiny_jobs import CONFIGS

SEQ, BATCH, TP = 64, 2, 2
DIMS = dict(h=64, a=4, kv=2, f=128)  # tiny-llama-2l
MEGATRON = ParallelPlan(num_gpus=TP, strategy="ddp", tp=TP, sequence_parallel=True, tp_impl="megatron")
TORCHTITAN = dataclasses.replace(MEGATRON, tp_impl="torchtitan")


def _job(**kw) -> FineTuneJob:
    kw = {"method": "full", "compute_dtype": "bf16", "batch_size": BATCH, "seq_len": SEQ, **kw}
    kw.setdefault("gradient_checkpointing", False)
    return FineTuneJob(model=str(CONFIGS / "tiny-llama-2l.json"), **kw)


@pytest.fixture(scope="module")
def traced():
    return tp_single_gpu_step(_job(), tp=TP, sequence_parallel=True, granule_bytes=1)


def test_traced_rank_less_the_excess_is_megatrons_layer(traced):
    per_layer = traced_layer_activation_bytes(traced.segments, traced.num_layers)
    kw = dict(tp=TP, sequence_parallel=True, **DIMS)
    assert per_layer == llama_layer_activation_bytes(SEQ, BATCH, keeps_gathered_inputs=True, **kw)
    excess = sum(sp_gathered_excess_bytes(SEQ, BATCH, DIMS["h"], d=2, tp=TP).values())
    megatron = megatron_sp_step(traced, _job(), MEGATRON)
    assert traced_layer_activation_bytes(megatron.segments, megatron.num_layers) == pytest.approx(per_layer - excess)
    assert per_layer - excess == llama_layer_activation_bytes(SEQ, BATCH, **kw)


def test_torchtitan_and_checkpointed_layers_unchanged(traced):
    assert megatron_sp_step(traced, _job(), TORCHTITAN) is traced
    assert megatron_sp_step(traced, _job(gradient_checkpointing=True), MEGATRON) is traced


def test_lora_keeps_only_its_targets_inputs():
    assert kept_gathered_inputs(_job()) == ("qkv_input", "mlp_input")
    assert kept_gathered_inputs(_job(method="lora", lora=LoraConfig(targets=("attention",)))) == ("qkv_input",)


def test_rank_memory_lower_by_the_excess_of_every_layer(traced):
    job = _job()
    excess = sum(sp_gathered_excess_bytes(SEQ, BATCH, DIMS["h"], d=2, tp=TP).values())
    megatron = megatron_sp_step(traced, job, MEGATRON)
    for key in ("forward:unit_last", "backward:unit_last"):
        assert traced.segments[key]["activations"] - megatron.segments[key]["activations"] == round(
            traced.num_layers * excess
        )
    low, high = model_parallel_rank_memory(megatron, job, MEGATRON), model_parallel_rank_memory(traced, job, TORCHTITAN)
    assert low.peak_bytes < high.peak_bytes
    assert any(a.startswith("Megatron sequence parallelism") for a in low.assumptions)
    assert not any(a.startswith("Megatron sequence parallelism") for a in high.assumptions)


def test_backward_gathers_the_saved_shards_again():
    kw = dict(batch=1, seq_len=128, hidden=64, num_layers=2, num_heads=4, num_kv_heads=2, bytes_per_element=2)
    extra = set(model_parallel_collectives(MEGATRON, **kw)) - set(model_parallel_collectives(TORCHTITAN, **kw))
    assert [(c.op, c.phase, c.count, c.nbytes) for c in extra] == [("all_gather", "backward", 2 * 2, 128 * 64 * 2)]


def test_unknown_implementation_is_one_error_line():
    with pytest.raises(TunecostError, match="unknown tensor-parallel implementation 'nemo'") as err:
        ParallelPlan(num_gpus=2, strategy="ddp", tp=2, tp_impl="nemo")
    assert "\n" not in str(err.value)


def _estimate(cli_runner, *extra: str) -> dict:
    from tunecost.cli.main import app

    args = ["estimate", "--model", str(CONFIGS / "tiny-llama-2l.json"), "--method", "full", "--dtype", "bf16"]
    args += ["--seq-len", str(SEQ), "--batch-size", str(BATCH), "--gpu", "H100", "--gpus", "2", "--tp", "2"]
    args += ["--strategy", "ddp", "--epochs", "1", "--queries", "100", "--no-gradient-checkpointing", "--json"]
    result = cli_runner.invoke(app, [*args, *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["setups"][0]


def test_cli_tp_impl(cli_runner):
    titan, megatron = _estimate(cli_runner), _estimate(cli_runner, "--tp-impl", "megatron")
    assert (titan["plan"]["tp_impl"], megatron["plan"]["tp_impl"]) == ("torchtitan", "megatron")
    assert megatron["memory"]["peak_bytes"] < titan["memory"]["peak_bytes"]
