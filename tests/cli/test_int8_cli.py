"""8-bit LoRA (`--quant-type int8`, bitsandbytes LLM.int8) end to end: the memory breakdown, one GPU and several."""

from __future__ import annotations

import pytest

JOB = {"model": "qwen2.5-0.5b", "method": "qlora", "seq_len": 512, "lora_targets": "attention,mlp"}


def test_int8_weights_hold_one_byte_each_between_nf4_and_16_bits(cli_json) -> None:
    def weights(**kw) -> dict:
        out = cli_json("memory", **JOB, batch_size=2, **kw)
        return {k: v for k, v in out["breakdown"].items() if k.startswith("weights_")}

    int8, nf4 = weights(quant_type="int8"), weights(quant_type="nf4")
    assert set(int8) == {"weights_8bit"} and set(nf4) == {"weights_4bit"}
    assert int8["weights_8bit"] == 2 * nf4["weights_4bit"]  # the same matrices: a byte a weight, not half of one


@pytest.mark.long
def test_sharded_strategies_are_refused_or_left_out(cli_error, cli_json) -> None:
    args = ["estimate", "--model", "qwen2.5-0.5b", "--method", "qlora", "--quant-type", "int8", "--gpu", "A100-80GB"]
    line = cli_error([*args, "--gpus", "2", "--strategy", "fsdp2", "--queries", "1000", "--epochs", "1"])
    assert "8-bit (LLM.int8) base weights cannot be sharded" in line
    out = cli_json(
        "estimate", **JOB, quant_type="int8", gpu="A100-80GB", gpus=2, strategy="zero3,ddp", queries=1000, epochs=1
    )
    assert {s["plan"]["strategy"] for s in out["setups"]} == {"ddp"}
    assert "zero3: not searched, 8-bit (LLM.int8) base weights cannot be sharded" in out["notes"]


@pytest.mark.long  # 13 s (estimate's side: the test above)
def test_a_plan_for_8bit_weights_weighs_unsharded_layouts_only(cli_json) -> None:
    plan = cli_json("plan", **JOB, quant_type="int8", gpu="A100-80GB", epochs=1, queries=1000)["plan"]
    strategies = {o["setup"]["plan"]["strategy"] for o in plan["front"]}
    assert plan["recommended"]["method"] == "qlora" and strategies and strategies <= {"single", "ddp", "zero1", "zero2"}
