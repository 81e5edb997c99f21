"""torch FSDP1's held layer inputs (`distributed.fsdp1`): under re-entrant checkpointing with frozen decoder-layer
units, every layer whose backward has run keeps its input and the input's gradient until the backward ends."""

from __future__ import annotations

import json

import pytest
from tiny_jobs import CONFIGS, tiny_job

from tunecost.distributed.rank_memory import rank_memory, rank_segment_bytes, single_gpu_step
from tunecost.workload.job import LoraConfig
from tunecost.workload.parallel import ParallelPlan

LAYERS = 6
FSDP1 = ParallelPlan(num_gpus=2, strategy="fsdp1")


@pytest.fixture
def deep_llama(tmp_path) -> str:
    """The tiny Llama of tests/fixtures/distributed with 6 decoder layers (hidden 64)."""
    config = json.loads((CONFIGS / "tiny-llama-2l.json").read_text(encoding="utf-8"))
    path = tmp_path / "tiny-llama-6l.json"
    path.write_text(json.dumps({**config, "num_hidden_layers": LAYERS}), encoding="utf-8")
    return str(path)


def _job(model: str, method: str = "lora", *, checkpointing: bool = True):
    job = tiny_job(
        "tiny-llama-2l", method, LoraConfig(rank=8, targets=("attention",)), gradient_checkpointing=checkpointing
    )
    return job.with_(model=model, stack="hf-peft")  # transformers' re-entrant checkpointing


def _held(job, segment: str, plan: ParallelPlan = FSDP1) -> int:
    step = single_gpu_step(job, granule_bytes=1)
    return rank_segment_bytes(step.segments[segment], segment, step, job, plan).get("held_layer_inputs", 0)


def test_first_layer_backward_holds_the_other_inputs_and_their_gradients(deep_llama):
    """By hand: 6 layers, batch 2 x 16 tokens, hidden 64, fp32 (4 bytes). At the first layer's backward the other
    5 layers' inputs and 4 of their gradients (the 5th is the gradient flowing into the first layer) are held:
    9 x 2 x 16 x 64 x 4 = 73,728 bytes. Before that, nothing."""
    job = _job(deep_llama)
    assert _held(job, "backward:unit_first") == (2 * LAYERS - 3) * 2 * 16 * 64 * 4 == 73_728
    for segment in ("forward:post", "backward:post", "backward:unit_last", "optimizer:opt"):
        assert _held(job, segment) == 0


def test_fsdp1_is_fsdp2_plus_the_held_bytes(deep_llama):
    """The same single-GPU step; fsdp1's rank differs from fsdp2's by the held inputs alone, and its peak takes
    them."""
    job = _job(deep_llama)
    step = single_gpu_step(job, granule_bytes=1)
    fsdp2 = ParallelPlan(num_gpus=2, strategy="fsdp2")
    for segment, categories in step.segments.items():
        one, two = (rank_segment_bytes(categories, segment, step, job, p) for p in (FSDP1, fsdp2))
        assert sum(one.values()) - sum(two.values()) == one.get("held_layer_inputs", 0)
    assert rank_memory(step, job, FSDP1).peak_bytes >= rank_memory(step, job, fsdp2).peak_bytes
    first = rank_segment_bytes(step.segments["backward:unit_first"], "backward:unit_first", step, job, FSDP1)
    assert rank_memory(step, job, FSDP1).peak_bytes >= sum(first.values())


@pytest.mark.parametrize(
    ("method", "checkpointing", "strategy"),
    [("full", True, "fsdp1"), ("lora", False, "fsdp1"), ("lora", True, "fsdp2"), ("lora", True, "ddp")],
)
def test_nothing_is_held_without_frozen_units_checkpointing_or_fsdp(deep_llama, method, checkpointing, strategy):
    """A full fine-tune's units need gradients (FSDP1 registers the usual post-backward hook, not the reshard-only
    one); without checkpointing no detached input exists; FSDP2 (`fully_shard`) has no reshard-only hook; DDP keeps
    parameters whole."""
    job = _job(deep_llama, method, checkpointing=checkpointing)
    plan = ParallelPlan(num_gpus=2, strategy=strategy)
    assert _held(job, "backward:unit_first", plan) == 0


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:FSDP is switching to use `NO_SHARD`:UserWarning")
@pytest.mark.parametrize(("frozen_layers", "held_while_backward_runs"), [(True, True), (False, False)])
def test_torch_fsdp1_holds_the_recomputed_layer_inputs_and_their_gradients(frozen_layers, held_while_backward_runs):
    """The mechanism in the installed torch, on one CPU rank (gloo): FSDP1 units of four re-entrantly checkpointed
    layers whose own parameters are frozen, with trainable LoRA-like Linears wrapped as units of their own (PEFT's
    FSDP wrap policy). When the gradient reaches the model input every layer's recomputed input is still alive with
    its `.grad`; after the backward FSDP has freed them. With trainable layer units nothing is held. (One rank runs
    NO_SHARD; `_pre_forward` registers the reshard-only hook whatever the sharding strategy.)"""
    import functools
    import gc
    import weakref

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, _or_policy, lambda_auto_wrap_policy
    from torch.utils.checkpoint import checkpoint

    recomputed: list[weakref.ref] = []

    class Layer(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.base, self.norm = nn.Linear(d, d), nn.LayerNorm(d)
            self.lora_a, self.lora_b = nn.Linear(d, 4, bias=False), nn.Linear(4, d, bias=False)

        def forward(self, x):
            if torch.is_grad_enabled():  # the recomputed forward (the first one runs under no_grad)
                recomputed.append(weakref.ref(x))
            h = self.norm(x)
            return x + torch.tanh(self.base(h) + self.lora_b(self.lora_a(h)))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer(16) for _ in range(4))

        def forward(self, x):
            for layer in self.layers:
                x = checkpoint(layer.__call__, x, use_reentrant=True)
            return x

    def trainable_leaf(module: nn.Module) -> bool:
        weight = getattr(module, "weight", None)
        return not list(module.children()) and weight is not None and weight.requires_grad

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = Model()
        for name, p in model.named_parameters():
            p.requires_grad = ".lora_" in name or not frozen_layers
        policy = functools.partial(
            _or_policy,
            policies=[
                functools.partial(lambda_auto_wrap_policy, lambda_fn=trainable_leaf),
                ModuleWrapPolicy({Layer}),
            ],
        )
        wrapped = FullyShardedDataParallel(
            model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu")
        )
        x = torch.randn(2, 8, 16, requires_grad=True)
        seen: list[bool] = []

        def at_model_input(grad):
            gc.collect()
            seen.extend(r() is not None and r().grad is not None for r in recomputed)
            return grad

        x.register_hook(at_model_input)
        wrapped(x).sum().backward()
        gc.collect()
        assert len(seen) == 4 and all(s == held_while_backward_runs for s in seen)
        assert all(r() is None for r in recomputed)
    finally:
        dist.destroy_process_group()
