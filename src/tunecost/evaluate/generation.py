"""Batched greedy generation and continuation log-likelihoods for causal LMs.

Prompts are left-padded into batches so each row's last prompt token sits at the end; `transformers`'
``generate`` derives positions from the attention mask. Generation stops at EOS or after `max_new_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tunecost.errors import TunecostError

ProgressFn = Callable[[int, int, str], None]


def greedy_generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    pad_id: int,
    eos_id: int | None,
    max_new_tokens: int = 32,
    batch_size: int = 16,
    on_progress: ProgressFn | None = None,
) -> list[list[int]]:
    """Greedy continuations (new token ids only, EOS and anything after it dropped) for each prompt."""
    import torch

    if max_new_tokens <= 0 or batch_size <= 0:
        raise TunecostError(f"max new tokens and batch size must be positive, got {max_new_tokens} and {batch_size}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    outputs: list[list[int]] = []
    num_batches = (len(prompts) + batch_size - 1) // batch_size
    try:
        for b, start in enumerate(range(0, len(prompts), batch_size)):
            chunk = prompts[start : start + batch_size]
            width = max(len(p) for p in chunk)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(chunk):
                input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
            with torch.no_grad():
                generated = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    num_beams=1,
                    pad_token_id=pad_id,
                    eos_token_id=eos_id,
                )
            for row in generated[:, width:].tolist():
                if eos_id is not None and eos_id in row:
                    row = row[: row.index(eos_id)]
                outputs.append(row)
            if on_progress is not None:
                on_progress(b + 1, num_batches, "generate")
    finally:
        model.train(was_training)
    return outputs


def continuation_logprobs(
    model: Any,
    contexts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    pad_id: int,
    batch_size: int = 16,
) -> list[tuple[float, int]]:
    """For each (context, continuation) pair: (sum of log-probabilities of the continuation tokens given the
    context, number of continuation tokens). Used to score multiple-choice endings (HellaSwag)."""
    import torch

    if len(contexts) != len(continuations):
        raise ValueError("contexts and continuations differ in length")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    results: list[tuple[float, int]] = []
    try:
        for start in range(0, len(contexts), batch_size):
            pairs = list(zip(contexts[start : start + batch_size], continuations[start : start + batch_size]))
            width = max(len(c) + len(x) for c, x in pairs)
            input_ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(pairs), width), dtype=torch.long)
            for row, (ctx, cont) in enumerate(pairs):
                ids = list(ctx) + list(cont)
                input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, : len(ids)] = 1
            with torch.no_grad():
                logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            for row, (ctx, cont) in enumerate(pairs):
                if not cont:
                    results.append((0.0, 0))
                    continue
                # token at position t is predicted by the logits at t - 1
                positions = torch.arange(len(ctx) - 1, len(ctx) + len(cont) - 1, device=logprobs.device)
                targets = torch.tensor(list(cont), dtype=torch.long, device=logprobs.device)
                total = logprobs[row, positions, targets].sum().item()
                results.append((float(total), len(cont)))
    finally:
        model.train(was_training)
    return results
