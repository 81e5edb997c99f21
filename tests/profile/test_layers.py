"""Per-layer timing (tunecost.profile.layers): parts found, every pass measured, breakdowns add up."""

from __future__ import annotations

import pytest
import torch

from tunecost.models.anatomy import decoder_layers
from tunecost.profile.inputs import synthetic_source
from tunecost.profile.layers import LayerTimer, layer_parts, model_layer_parts
from tunecost.profile.loop import make_optimizer, train_step
from tunecost.profile.timers import PerfCounterClock, median_step_index


@pytest.fixture
def micro(small_mixtral):
    """`micro(checkpointing=False)`: a training-mode Mixtral of two layers (width 64, four heads, 4 experts,
    vocabulary 512), without the KV cache, with activation checkpointing when asked."""

    def build(checkpointing: bool = False):
        model = small_mixtral(64, 4, num_hidden_layers=2, intermediate_size=128, vocab_size=512, num_local_experts=4)
        model.train()
        model.config.use_cache = False
        if checkpointing:
            model.activation_checkpointing_enable()
        return model

    return build


def _timed_steps(model, n=3, batch_size=2, seq_len=64):
    torch.manual_seed(0)
    clock = PerfCounterClock()
    timer = LayerTimer(model, clock).attach()
    opt = make_optimizer(model)
    batch = synthetic_source(vocab_size=512, seq_len=seq_len).batches(batch_size, 1)[0]
    train_step(model, opt, batch, clock, device="cpu", layer_timer=timer)  # warm-up
    steps = [train_step(model, opt, batch, clock, device="cpu", layer_timer=timer) for _ in range(n)]
    timer.detach()
    return steps[median_step_index([s.times for s in steps])]


def test_mixtral_layer_parts(micro):
    model = micro()
    parts = model_layer_parts(model)
    assert [p.index for p in parts] == [0, 1]
    assert [(k, c) for k, c, _ in parts[0].parts] == [
        ("attention", "attention"),
        ("moe", "moe_experts"),
        ("norm0", "norm"),
        ("norm1", "norm"),
    ]
    assert parts[0].router is model.model.layers[0].mlp.gate


def test_blackmamba_style_layer_parts():
    class Router(torch.nn.Linear):
        pass

    class MoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = Router(8, 4)
            self.local_experts = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

    class Mamba(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.A_log = torch.nn.Parameter(torch.zeros(3))

    class Layer(torch.nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)
            self.mixer = MoE() if moe else Mamba()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = torch.nn.Module()
            self.decoder.layers = torch.nn.ModuleList([Layer(False), Layer(True)])

    net = Net()
    assert len(decoder_layers(net)) == 2
    mamba, moe = layer_parts(0, net.decoder.layers[0]), layer_parts(1, net.decoder.layers[1])
    assert [c for _, c, _ in mamba.parts] == ["norm", "mamba"] and not mamba.is_moe
    assert [c for _, c, _ in moe.parts] == ["norm", "moe_experts"] and moe.router is net.decoder.layers[1].mixer.router


@pytest.mark.parametrize("checkpointing", [False, True])
def test_breakdown_adds_up_to_the_stage_times(micro, checkpointing):
    step = _timed_steps(micro(checkpointing))
    layers, times = step.layers, step.times
    comps = {(p, c) for (p, _, c) in layers.seconds}
    for component in ("embedding", "norm", "attention", "moe_router", "moe_experts", "lm_head_loss"):
        assert ("forward", component) in comps and ("backward", component) in comps, component
    per_layer = {layer for (p, layer, _) in layers.seconds if p == "forward" and layer is not None}
    assert per_layer == {0, 1}
    # Per-layer forward times sum to the forward time within 10 %.
    assert layers.total("forward") == pytest.approx(times.forward_seconds, rel=0.10)
    # The backward stage is the real backward plus the checkpointing recomputation, never double counted.
    assert layers.total("backward") + layers.total("recompute") == pytest.approx(times.backward_seconds, rel=0.10)
    if checkpointing:
        assert layers.total("recompute") > 0
        assert {c for (p, _, c) in layers.seconds if p == "recompute"} >= {"attention", "moe_router", "moe_experts"}
    else:
        assert layers.total("recompute") == 0


def test_hooks_are_removed_and_model_still_trains(micro):
    model = micro()
    timer = LayerTimer(model, PerfCounterClock()).attach()
    timer.detach()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
