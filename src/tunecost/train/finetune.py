"""A small, plain fine-tuning loop for causal LMs (CPU or GPU): padded batches, loss on the response only.

As in LLaMA-Factory (``train_on_prompt=False``), the prompt tokens are masked out of the loss, and for MoE models
the router load-balancing loss is added with the model's ``router_aux_loss_coef`` (the paper kept it on).
The LM head runs only on the positions that have a label: with a 32000-token vocabulary it is most of a tiny
model's work, and the prompt positions would be thrown away anyway.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunecost.workload.templates import EncodedQuery

IGNORE_INDEX = -100
ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to `min_lr_ratio` x lr over the whole run."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0


def make_batches(
    encoded: Sequence[EncodedQuery], batch_size: int, pad_id: int, *, seed: int | None = None
) -> list[dict[str, Any]]:
    """Right-padded batches (input_ids, attention_mask, labels); `seed` shuffles the order (None keeps it)."""
    import torch

    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    order = list(range(len(encoded)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    batches = []
    for start in range(0, len(order), batch_size):
        items = [encoded[i] for i in order[start : start + batch_size]]
        width = max(len(q.ids) for q in items)
        input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(items), width), dtype=torch.long)
        labels = torch.full((len(items), width), IGNORE_INDEX, dtype=torch.long)
        for row, q in enumerate(items):
            ids = torch.tensor(q.ids, dtype=torch.long)
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
            labels[row, q.num_prompt_tokens : len(ids)] = ids[q.num_prompt_tokens :]
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return batches


def _split_lm(model: Any) -> tuple[Any, Any] | None:
    """(decoder, lm_head) of a transformers causal LM, or None when the model is not laid out that way."""
    decoder = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if decoder is None or head is None:
        return None
    return decoder, head


def causal_lm_loss(model: Any, batch: dict[str, Any]) -> tuple[Any, float]:
    """(loss to backpropagate, LM loss value): next-token cross-entropy on labelled positions, plus the router
    load-balancing loss x ``router_aux_loss_coef`` for Mixtral-style MoE models."""
    import torch.nn.functional as F

    device = next(model.parameters()).device
    input_ids = batch["input_ids"].to(device)
    attention_mask = batch["attention_mask"].to(device)
    labels = batch["labels"].to(device)
    parts = _split_lm(model)
    if parts is None:  # generic model: let it compute its own loss
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        return out.loss, float(out.loss.detach())
    decoder, head = parts
    aux_coef = float(getattr(model, "router_aux_loss_coef", 0.0) or 0.0)
    num_experts = getattr(model, "num_experts", None)
    want_router = aux_coef > 0 and num_experts is not None
    kwargs = {"output_router_logits": True} if want_router else {}
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    hidden = out.last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    keep = targets != IGNORE_INDEX
    logits = head(hidden[keep]).float()
    lm_loss = F.cross_entropy(logits, targets[keep])
    loss = lm_loss
    router_logits = getattr(out, "router_logits", None)
    if want_router and router_logits:
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

        aux = load_balancing_loss_func(router_logits, num_experts, model.num_experts_per_tok, attention_mask)
        loss = lm_loss + aux_coef * aux
    return loss, float(lm_loss.detach())


def make_optimizer_with_schedule(model: Any, config: OptimConfig, total_steps: int) -> tuple[Any, Any]:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))

    def lr_factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    return optimizer, scheduler


def train_epoch(
    model: Any,
    batches: Sequence[dict[str, Any]],
    optimizer: Any,
    scheduler: Any,
    *,
    max_grad_norm: float = 1.0,
    on_progress: ProgressFn | None = None,
    label: str = "train",
) -> float:
    """One pass over `batches`; returns the mean LM loss (per batch)."""
    import torch

    model.train()
    losses = []
    for i, batch in enumerate(batches):
        loss, lm_value = causal_lm_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scheduler.step()
        losses.append(lm_value)
        if on_progress is not None:
            on_progress(i + 1, len(batches), label)
    model.eval()
    return sum(losses) / len(losses)
