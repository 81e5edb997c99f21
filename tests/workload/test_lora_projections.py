"""LoRA on single projections (`--lora-targets q_proj,v_proj`, PEFT's default for Llama): the simulated model has
adapters on those linears only, the throughput model counts the same matrices, and a group cannot be named with one
of its own projections."""

from __future__ import annotations

import pytest
from tiny_models import write_llama_config

from tunecost.errors import TunecostError
from tunecost.estimate.throughput.lora_counts import dense_lora_targets
from tunecost.models.catalog import resolve_model
from tunecost.models.families import arch_of
from tunecost.simulate.prepare import build_prepared
from tunecost.workload.job import FineTuneJob, LoraConfig, parse_lora_targets

HIDDEN, Q_OUT, KV_OUT, INTER, LAYERS, RANK = 64, 64, 32, 128, 2, 4  # 4 heads, 2 KV heads of 16


@pytest.fixture
def model(tmp_path) -> str:
    path = write_llama_config(
        tmp_path / "llama.json", hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
    )  # fmt: skip
    return str(path)


@pytest.mark.parametrize(
    ("targets", "in_out", "names"),
    [
        (("q_proj", "v_proj"), (HIDDEN + Q_OUT) + (HIDDEN + KV_OUT), {"q_proj", "v_proj"}),
        (("o_proj", "mlp"), (Q_OUT + HIDDEN) + 3 * (HIDDEN + INTER), {"o_proj", "gate_proj", "up_proj", "down_proj"}),
        (
            ("attention",),
            (HIDDEN + Q_OUT) + 2 * (HIDDEN + KV_OUT) + (Q_OUT + HIDDEN),
            {"q_proj", "k_proj", "v_proj", "o_proj"},
        ),
    ],
)
def test_adapters_are_on_the_named_projections_and_counted_as_such(model: str, targets, in_out: int, names) -> None:
    job = FineTuneJob(model=model, method="lora", lora=LoraConfig(rank=RANK, alpha=8, targets=targets), seq_len=16)
    prepared = build_prepared(job.with_(stack="hf-peft"), num_units=None)
    adapted = {n.split(".")[-2] for n, p in prepared.model.named_parameters() if p.requires_grad}
    assert adapted == names
    assert sum(p.numel() for p in prepared.trainable) == LAYERS * RANK * in_out
    assert dense_lora_targets(arch_of(resolve_model(model)), targets) == (LAYERS * in_out, LAYERS * len(names))


def test_a_group_and_its_own_projection_are_one_error() -> None:
    assert parse_lora_targets("q_proj, v_proj,mlp") == ("q_proj", "v_proj", "mlp")
    with pytest.raises(TunecostError, match="q_proj is part of attention"):
        parse_lora_targets("attention,q_proj")
    with pytest.raises(TunecostError, match="down_proj is part of mlp"):
        LoraConfig(targets=("down_proj", "mlp"))
    assert LoraConfig(targets=("v_proj", "mlp")).adapted("attention") == ("v_proj",)


def test_a_projection_the_model_does_not_have_is_an_error(tmp_path) -> None:
    path = tmp_path / "phi3.json"  # Phi-3 fuses q, k, v into qkv_proj
    path.write_text(
        '{"model_type": "phi3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,'
        ' "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 32064}'
    )
    job = FineTuneJob(model=str(path), method="lora", lora=LoraConfig(targets=("q_proj",)), seq_len=16)
    with pytest.raises(TunecostError, match="no LoRA target among q_proj exists"):
        build_prepared(job.with_(stack="hf-peft"), num_units=None)
