"""Adapters saved from our experts load where they should: the fused layout into stock PEFT."""

from __future__ import annotations

import json

import pytest
import torch
from moe_helpers import randomize_lora

from tunecost.errors import TunecostError
from tunecost.moe import LoraSpec, adapter_state_dict, install_experts, load_adapter, save_adapter


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))


def test_fast_adapter_loads_into_stock_peft(tmp_path, ids, moe_model):
    from peft import PeftModel

    model = install_experts(moe_model(), "fast", LoraSpec(rank=4, alpha=8))
    randomize_lora(model, std=0.05)
    save_adapter(model, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert sorted(config["target_parameters"]) == [
        "mlp.experts.down_proj",
        "mlp.experts.gate_up_proj",
        "mlp.gate.weight",
    ]
    peft_model = PeftModel.from_pretrained(moe_model(), tmp_path)  # stock transformers + stock PEFT
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(peft_model(ids).logits, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


def test_paper_layout_round_trip_qlora_to_fast_4bit(tmp_path, ids, moe_model):
    qlora = install_experts(moe_model(), "qlora-linear4bit", LoraSpec(rank=4, alpha=8))
    randomize_lora(qlora, std=0.05)
    save_adapter(qlora, tmp_path)
    layout, tensors = adapter_state_dict(qlora)
    assert layout == "per-projection"
    assert "base_model.model.model.layers.1.block_sparse_moe.experts.7.w2.lora_B.weight" in tensors
    assert json.loads((tmp_path / "adapter_config.json").read_text())["target_modules"]
    fast = install_experts(moe_model(), "fast-4bit", LoraSpec(rank=4, alpha=8, expert_layout="per-projection"))
    load_adapter(fast, tmp_path)
    with torch.no_grad():  # same nf4 storage (gate and up quantized separately) and the same LoRA
        expected = qlora(ids).logits
        torch.testing.assert_close(fast(ids).logits, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    with pytest.raises(TunecostError, match="layout"):
        load_adapter(install_experts(moe_model(), "fast", LoraSpec(rank=4, alpha=8)), tmp_path)
