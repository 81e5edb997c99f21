"""The training loop the profiler times: one step = forward (with loss), backward, AdamW step + zero_grad.

Stage boundaries are clock marks (CUDA events on GPU, perf_counter on CPU), resolved once per step. The same
step runs plain (throughput, stages, memory) or with the per-layer hooks (layer breakdown); both train on the
same batches, interleaved step by step, so their ratio is the instrumentation overhead.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any

from tunecost.profile.inputs import Batch
from tunecost.profile.layers import LayerTimer, LayerTimes
from tunecost.profile.timers import Clock, StepTimes, synchronize

DEFAULT_LR = 5e-5  # the paper's learning rate


def make_optimizer(model: Any, lr: float = DEFAULT_LR) -> Any:
    """AdamW over the trainable parameters (fused on CUDA, as current trainers default to)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and params[0].is_cuda and all(p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=lr, fused=fused or None)


def accepts_router_logits(model: Any) -> bool:
    """Whether the model trains with a router load-balancing loss that `output_router_logits=True` turns on
    (transformers MoE models; BlackMamba takes the argument but has no such loss)."""
    if getattr(getattr(model, "config", None), "router_aux_loss_coef", None) is None:
        return False
    try:
        return "output_router_logits" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True)
class StepResult:
    times: StepTimes
    wall_seconds: float  # perf_counter around the step with the device synchronised at both edges
    loss: float | None
    layers: LayerTimes | None = None


def train_step(
    model: Any,
    optimizer: Any,
    batch: Batch,
    clock: Clock,
    *,
    device: str,
    layer_timer: LayerTimer | None = None,
    router_aux_loss: bool = True,
    read_loss: bool = False,
) -> StepResult:
    """One optimizer step on `batch` (already on the device); times each stage with `clock`."""
    kwargs = batch.model_kwargs()
    if router_aux_loss and accepts_router_logits(model):
        kwargs["output_router_logits"] = True
    synchronize(device)
    clock.reset()
    t0 = time.perf_counter()
    m0 = clock.mark()
    out = model(**kwargs)
    loss = out.loss if hasattr(out, "loss") else out["loss"]
    m1 = clock.mark()
    loss.backward()
    if layer_timer is not None:
        layer_timer.mark_backward_end()
    m2 = clock.mark()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    m3 = clock.mark()
    times = clock.resolve()  # synchronises the device once (CUDA)
    wall = time.perf_counter() - t0
    layers = layer_timer.collect(times) if layer_timer is not None else None
    clock.reset()
    value = float(loss.detach()) if read_loss else None
    # The step time is the wall clock around the whole step, device synchronised at both edges: measured
    # independently of the stage marks, so "stages add up to the step" is a real check.
    return StepResult(
        times=StepTimes(
            forward_seconds=times[m1] - times[m0],
            backward_seconds=times[m2] - times[m1],
            optimizer_seconds=times[m3] - times[m2],
            step_seconds=wall,
        ),
        wall_seconds=wall,
        loss=value,
        layers=layers,
    )


class TrainableSnapshot:
    """A copy of the trainable weights, to start every sweep point from the same model (expert loads "before
    fine-tuning" must be the original model's, not the previous point's)."""

    def __init__(self, model: Any, *, offload_over_bytes: int = 2**30) -> None:
        import torch

        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        total = sum(p.numel() * p.element_size() for p in params.values())
        where = torch.device("cpu") if total > offload_over_bytes else None
        self._params = params
        self._saved = {n: p.detach().to(where or p.device, copy=True) for n, p in params.items()}

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for n, p in self._params.items():
                p.copy_(self._saved[n], non_blocking=True)
                p.grad = None


def forward_only(model: Any, batch: Batch) -> None:
    """A forward pass without gradients (expert-load counting).

    The model stays in its training mode on purpose: bitsandbytes repacks a `Linear4bit`'s weight for CPU
    inference the first time it runs in eval mode without gradients, which would change every later training
    step's kernels (and what the profile measures). No gradients are recorded, so nothing is recomputed either.
    """
    import torch

    with torch.no_grad():
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
