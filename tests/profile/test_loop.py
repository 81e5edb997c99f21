"""The timed training loop, model setup per method, inputs, expert loads (tunecost.profile.loop and friends)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from tunecost.errors import TunecostError
from tunecost.models.anatomy import set_top_k
from tunecost.profile.expert_load import ExpertLoadCounter
from tunecost.profile.inputs import Query, dataset_source, lengths_source, pad_batch, synthetic_source
from tunecost.profile.layers import LayerTimer
from tunecost.profile.loop import TrainableSnapshot, forward_only, make_optimizer, train_step
from tunecost.profile.model_setup import ModelSetup, build_training_model
from tunecost.profile.timers import PerfCounterClock

MICRO_DIR = Path(__file__).parents[1] / "fixtures" / "profile" / "micro-mixtral"


def _setup(method: str, **kw) -> ModelSetup:
    return ModelSetup(model=str(MICRO_DIR), method=method, random_weights=True, **kw)


def test_stages_add_up_to_the_wall_clock_step():
    prepared = build_training_model(_setup("full", gradient_checkpointing=False))
    opt = make_optimizer(prepared.model)
    batch = synthetic_source(vocab_size=512, seq_len=64).batches(2, 1)[0]
    clock = PerfCounterClock()
    train_step(prepared.model, opt, batch, clock, device="cpu")
    for _ in range(3):
        t = train_step(prepared.model, opt, batch, clock, device="cpu").times
        # Stage times sum to the (independently measured) step time within 5 %.
        assert t.stages_sum_seconds == pytest.approx(t.step_seconds, rel=0.05)
        assert min(t.forward_seconds, t.backward_seconds, t.optimizer_seconds) > 0


def test_methods_set_up_what_they_say():
    full = build_training_model(_setup("full"))
    assert full.trainable_params == full.total_params and full.weights == "random"
    lora = build_training_model(_setup("lora"))
    trainable = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("gate" in n for n in trainable) and any("experts" in n for n in trainable)  # router + experts
    qlora = build_training_model(_setup("qlora", experts_per_token=3))
    assert qlora.experts_impl == "qlora-linear4bit"
    kinds = {type(m).__name__ for m in qlora.model.modules()}
    assert "Linear4bit" in kinds  # experts (and attention) stored in 4-bit
    attn = qlora.model.model.layers[0].self_attn.q_proj
    assert type(attn).__name__ == "Linear4bit"
    assert all("lora_" in n for n, p in qlora.model.named_parameters() if p.requires_grad)
    assert all(getattr(m, "top_k", 3) == 3 for m in qlora.model.modules())  # experts per token set everywhere
    assert qlora.model.config.num_experts_per_tok == 3


def test_bad_setups_are_clear_errors():
    with pytest.raises(TunecostError, match="unknown model"):
        build_training_model(ModelSetup(model="no-such-model-xyz"))
    with pytest.raises(TunecostError, match="no weights"):
        build_training_model(ModelSetup(model=str(MICRO_DIR), method="full"))
    with pytest.raises(TunecostError, match="between 1 and 4"):
        build_training_model(_setup("full", experts_per_token=5))
    with pytest.raises(TunecostError, match="4-bit"):
        build_training_model(_setup("qlora", experts_impl="peft-fused"))
    with pytest.raises(TunecostError, match="unknown method"):
        ModelSetup(model="tiny-mixtral", method="adapter")


def test_streamed_random_qlora_build_matches_the_plain_path():
    from tunecost.models.catalog import resolve_model
    from tunecost.profile.model_setup import _random_streamed_4bit

    setup = _setup("qlora")
    model = _random_streamed_4bit(resolve_model(str(MICRO_DIR)), setup, torch.float32, {})
    assert not any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    assert "Linear4bit" in {type(m).__name__ for m in model.modules()}
    batch = synthetic_source(vocab_size=512, seq_len=16).batches(1, 1)[0]
    loss = model(**batch.model_kwargs()).loss
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


def test_dense_costs_more_than_sparse_on_the_same_batch(small_mixtral):
    """Paper §IV-B: top-8 of 8 experts routes 4x the tokens of top-2, and the experts take longer."""
    model = small_mixtral(128, 4, num_hidden_layers=2, intermediate_size=512, vocab_size=512)
    model.train()
    batch = synthetic_source(vocab_size=512, seq_len=128).batches(2, 1)[0]
    tokens = {}
    for k in (2, 8):
        set_top_k(model, k)
        counter = ExpertLoadCounter(model).attach()
        forward_only(model, batch)
        counter.detach()
        tokens[k] = counter.counts().tokens
    for layer in tokens[2]:
        assert sum(tokens[2][layer]) == 2 * 256 and sum(tokens[8][layer]) == 8 * 256
        assert tokens[8][layer] == [256] * 8  # dense: every expert sees every token
    # Expert time (forward + backward): sparse and dense steps interleaved, the least disturbed (min) of each, so
    # load from other processes affects both alike; one thread, so OpenMP threads spinning against other processes
    # on a shared machine do not swamp the work being compared.
    clock, opt = PerfCounterClock(), make_optimizer(model)
    timer = LayerTimer(model, clock).attach()
    expert_seconds: dict[int, list[float]] = {2: [], 8: []}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(6):
            for k in (2, 8):
                set_top_k(model, k)
                layers = train_step(model, opt, batch, clock, device="cpu", layer_timer=timer).layers
                if i:  # the first round warms up
                    expert_seconds[k].append(sum(s for (_, _, c), s in layers.seconds.items() if c == "moe_experts"))
    finally:
        torch.set_num_threads(threads)
        timer.detach()
    assert min(expert_seconds[8]) > 1.5 * min(expert_seconds[2])


def test_expert_load_counter_skips_padding_and_reports_variance(small_mixtral):
    model = small_mixtral(64, 4, num_hidden_layers=1, intermediate_size=64, vocab_size=256, num_local_experts=4)
    batch = pad_batch([Query(tuple(range(5, 15))), Query(tuple(range(5, 9)))], pad_id=0)
    counter = ExpertLoadCounter(model).attach()
    counter.set_token_mask(batch.attention_mask)
    forward_only(model, batch)
    load = counter.counts()
    assert sum(load.tokens[0]) == 2 * 14  # top-2 of the 14 real tokens, not of the 20 padded ones
    assert load.variance(0) == statistics.pvariance(load.tokens[0])
    assert {r["expert"] for r in load.rows()} == {0, 1, 2, 3}


def test_snapshot_restores_trainable_weights():
    prepared = build_training_model(_setup("lora"))
    snap = TrainableSnapshot(prepared.model)
    before = {n: p.detach().clone() for n, p in prepared.model.named_parameters() if p.requires_grad}
    opt = make_optimizer(prepared.model, lr=1e-2)
    batch = synthetic_source(vocab_size=512, seq_len=16).batches(1, 1)[0]
    train_step(prepared.model, opt, batch, PerfCounterClock(), device="cpu")
    changed = any(not torch.equal(before[n], p) for n, p in prepared.model.named_parameters() if p.requires_grad)
    assert changed
    snap.restore()
    assert all(torch.equal(before[n], p) for n, p in prepared.model.named_parameters() if p.requires_grad)


def test_inputs_pad_mask_and_too_small_dataset(tmp_path):
    src = lengths_source(vocab_size=100, lengths=[5, 9, 3, 7], dataset="toy")
    b = src.batches(2, 2)
    assert [x.seq_len for x in b] == [9, 7] and b[0].num_tokens == 14
    assert (b[0].labels[0, 5:] == -100).all() and (b[0].attention_mask[0, 5:] == 0).all()
    assert src.longest_batch(3).seq_len == 9
    with pytest.raises(TunecostError, match="has 4 queries, but 3 steps at batch size 2 need 6"):
        src.batches(2, 3)
    assert len(synthetic_source(vocab_size=50, seq_len=8, num_queries=2).batches(4, 3)) == 3  # synthetic cycles
    data = tmp_path / "tiny.jsonl"
    data.write_text('{"instruction": "Add 2 and 3.", "output": "5"}\n{"instruction": "Say hi", "output": "hi"}\n')
    ds = dataset_source(str(data), vocab_size=32000, max_length=6)
    assert len(ds) == 2 and ds.max_length <= 6
    batch = ds.batches(2, 1)[0]
    assert (batch.labels != -100).any()  # the response keeps its loss, the prompt does not
    assert (batch.labels[:, 0] == -100).all()


def test_expert_load_sees_through_peft_router_wrappers():
    """PEFT's ParamWrapper around the router has its own `num_experts` (1): counts must still have one entry per
    expert, also when a short batch hits only some experts."""
    prepared = build_training_model(_setup("lora"))
    counter = ExpertLoadCounter(prepared.model).attach()
    forward_only(prepared.model, pad_batch([Query((5, 6))], pad_id=0))
    load = counter.counts()
    assert all(len(v) == 4 and sum(v) == 2 * 2 for v in load.tokens.values())


def test_pretrained_weights_are_loaded_from_a_local_folder(tmp_path):
    from tunecost.models.build import build_model
    from tunecost.models.catalog import resolve_model

    saved = build_model(resolve_model(str(MICRO_DIR)), seed=3)
    saved.save_pretrained(tmp_path / "micro")
    prepared = build_training_model(ModelSetup(model=str(tmp_path / "micro"), method="full"))
    assert prepared.weights == f"pretrained:{tmp_path / 'micro'}"
    a = saved.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(prepared.model.model.layers[0].self_attn.q_proj.weight.detach(), a.detach())


def test_pretrained_blackmamba_loads_with_its_own_strict_loader(tmp_path):
    """A BlackMamba checkpoint folder in Zyphra's layout (what `hf download Zyphra/BlackMamba-2.8B` gives) is
    loaded by tunecost's loader, not transformers' (which has no BlackMamba class), and trains."""
    from tunecost.models.blackmamba import build_blackmamba, save_blackmamba, tiny_blackmamba_config

    saved = build_blackmamba(tiny_blackmamba_config(vocab_size=256), seed=5)
    save_blackmamba(saved, tmp_path / "bm")
    prepared = build_training_model(ModelSetup(model=str(tmp_path / "bm"), method="full", experts_per_token=2))
    assert prepared.weights == f"pretrained:{tmp_path / 'bm'}" and prepared.model.training
    for name, value in saved.state_dict().items():
        assert torch.equal(prepared.model.state_dict()[name], value), name
    assert prepared.experts_per_token == 2 and prepared.trainable_params == prepared.total_params
    with pytest.raises(TunecostError, match="load strictly, without config changes"):
        build_training_model(ModelSetup(model=str(tmp_path / "bm"), method="full", num_layers=2))
