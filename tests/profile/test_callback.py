"""TunecostCallback in a real transformers Trainer run on CPU (tunecost.profile.callback)."""

from __future__ import annotations

import pytest
import torch

from tunecost.profile.callback import TunecostCallback
from tunecost.profile.point_rows import read_rows
from tunecost.results.schema import record_path


class _Rows(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


def test_trainer_run_records_stages_layers_and_expert_loads(tmp_path, small_mixtral):
    from transformers import Trainer, TrainingArguments

    model = small_mixtral(64, 4, num_hidden_layers=2, intermediate_size=128, vocab_size=256, num_local_experts=4)
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        max_steps=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        learning_rate=1e-3,
        gradient_checkpointing=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    out = tmp_path / "run"
    callback = TunecostCallback(out, warmup_steps=0, workload={"dataset": "random-ids", "seq_len": 16})
    Trainer(model=model, args=args, train_dataset=_Rows(8, 16, 256), callbacks=[callback]).train()

    steps = read_rows(out, "trainer_step") if record_path(out, "trainer_step").exists() else []
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        parts = r["forward_seconds"] + r["backward_seconds"] + r["optimizer_seconds"]
        assert 0 < parts <= r["step_seconds"]
    stages = {r["stage"]: r for r in read_rows(out, "stages")}
    assert set(stages) == {"forward", "backward", "optimizer", "step"}
    layers = read_rows(out, "layers")
    assert {r["pass"] for r in layers} == {"forward", "backward", "recompute"}
    assert {r["component"] for r in layers} >= {"attention", "norm", "moe_router", "moe_experts", "lm_head_loss"}
    fwd = sum(r["seconds"] for r in layers if r["pass"] == "forward")
    assert fwd == pytest.approx(stages["forward"]["seconds"], rel=0.10)  # two micro-batches, both counted
    loads = read_rows(out, "expert_load")
    for phase in ("before", "after"):
        per_layer = {}
        for r in loads:
            if r["phase"] == phase:
                per_layer[r["layer_index"]] = per_layer.get(r["layer_index"], 0) + r["tokens"]
        assert per_layer == {0: 2 * 2 * 2 * 16, 1: 2 * 2 * 2 * 16}  # top-2 x (2 micro-batches x 2 x 16 tokens)
    row = read_rows(out, "throughput")[0]
    assert row["num_queries"] == 2 * 4 and row["queries_per_s"] > 0
    assert row["dataset"] == "random-ids" and row["method"] == "full" and row["experts_per_token"] == 2
    assert (out / "meta.json").exists() and read_rows(out, "point")[0]["status"] == "done"
