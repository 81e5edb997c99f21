"""One training step, the same code for fake tensors (simulation) and real CPU tensors (measurement).

A step is what a Hugging Face `Trainer` step does: forward with labels, keep only the loss, backward, optimizer
step, `zero_grad(set_to_none=True)`. The optimizer is warmed up first (states allocated), so the step measured is
a steady-state one: the first step of a run additionally allocates the states, which then stay.
"""

from __future__ import annotations

import contextlib
import gc

import torch
from torch import nn

from tunecost.simulate.behaviour import LOSS_TRANSFORMERS_5, LOSS_TRANSFORMERS_440, causal_lm_loss, gradient_buckets
from tunecost.simulate.hf2024 import load_balancing_loss_2024

LEARNING_RATE = 5e-5  # the paper's; irrelevant to memory


class SimAdamW8bit(torch.optim.Optimizer):
    """bitsandbytes `AdamW8bit`'s memory on any tensor type: blockwise 8-bit states (uint8 + one fp32 absmax per
    256 values, two states) for tensors of at least 4096 elements, fp32 states below that (bitsandbytes'
    `min_8bit_size`); the fused update allocates nothing. The update itself is a plain in-place SGD step."""

    BLOCKSIZE = 256
    MIN_8BIT_SIZE = 4096

    def __init__(self, params, lr: float = LEARNING_RATE) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    n = p.numel()
                    if n >= self.MIN_8BIT_SIZE:
                        blocks = -(-n // self.BLOCKSIZE)
                        for i in (1, 2):
                            state[f"state{i}"] = p.new_zeros(p.shape, dtype=torch.uint8)
                            state[f"absmax{i}"] = p.new_zeros((blocks,), dtype=torch.float32)
                    else:
                        for i in (1, 2):
                            state[f"state{i}"] = p.new_zeros(p.shape, dtype=torch.float32)
                p.add_(p.grad, alpha=-group["lr"])


def simulated_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer as a GPU run would build it: torch AdamW / SGD take the multi-tensor (foreach) path on CUDA,
    whose temporaries span every parameter at once, so foreach is forced here too."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATE, foreach=True)
    if name == "adamw-8bit":
        return SimAdamW8bit(params)
    raise ValueError(name)


def warm_up_optimizer(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    """Allocate the optimizer states with one zero-gradient step (outside any fake mode: torch's Adam reads its
    step counter with `.item()`, so the counters stay real 0-d CPU tensors, as they are on a GPU run)."""
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """State tensors that live on the device (the 0-d step counters stay on the host)."""
    out = []
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out.append(v)
    return out


def make_batch(
    vocab_size: int, batch_size: int, seq_len: int, fake_mode=None, seed: int = 0, device: str = "cpu"
) -> dict:
    """Random token ids, every position a real token (padding costs the same memory as a token)."""
    ctx = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with ctx:
        if fake_mode is None:
            g = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g).to(device)
        else:
            ids = torch.empty((batch_size, seq_len), dtype=torch.long)
        labels = ids.clone()
    return {"input_ids": ids, "labels": labels}


def forward_loss(prepared, batch: dict) -> torch.Tensor:
    model = prepared.model
    if prepared.spec.family == "blackmamba":
        return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    loss_code = LOSS_TRANSFORMERS_440 if prepared.stack == "hf-2024" else prepared.behaviour.loss_code
    if loss_code != LOSS_TRANSFORMERS_5:  # the loss of older model code, on the model's logits
        moe = {"output_router_logits": True} if prepared.is_moe else {}
        # the decoder under the LM head: `model.model` in most families, `model.transformer` in GPTBigCode
        out = model.base_model(input_ids=batch["input_ids"], use_cache=False, **moe)
        logits = model.lm_head(out.last_hidden_state)
        loss = causal_lm_loss(loss_code, logits, batch["labels"])
        coef = float(getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0)
        if prepared.is_moe and coef and out.router_logits:
            loss = loss + coef * load_balancing_loss_2024(out.router_logits, prepared.num_experts, prepared.top_k)
        del out, logits
        return loss
    return model(**batch, use_cache=False).loss


def run_step(prepared, batch: dict, recorder=None) -> None:
    """Forward, backward, optimizer step, zero_grad; `recorder` (a StepRecorder) watches if given."""
    fake_ctx = prepared.fake_mode if prepared.fake_mode is not None else contextlib.nullcontext()
    rec_ctx = recorder if recorder is not None else contextlib.nullcontext()
    phase = recorder.set_phase if recorder is not None else (lambda _p: None)
    if prepared.fake_mode is None:
        gc.collect()  # real tensors: start from a clean heap (fake runs skip it: it costs ~1 s on a big graph)
    gc.disable()  # frees happen when the last reference goes, as in a training loop with no cycles
    try:
        with fake_ctx, rec_ctx:
            phase("forward")
            loss = forward_loss(prepared, batch)
            phase("backward")
            buckets = gradient_buckets(prepared.behaviour.deepspeed_zero2, prepared.model)
            loss.backward()
            del loss, buckets  # DeepSpeed frees its gradient buckets when the backward ends
        with rec_ctx:
            phase("optimizer")
            prepared.optimizer.step()
            prepared.optimizer.zero_grad(set_to_none=True)
    finally:
        gc.enable()
