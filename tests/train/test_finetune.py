from __future__ import annotations

import pytest
import torch

from tunecost.train.finetune import (
    IGNORE_INDEX,
    OptimConfig,
    causal_lm_loss,
    make_batches,
    make_optimizer_with_schedule,
    train_epoch,
)
from tunecost.workload.templates import EncodedQuery

QUERIES = [
    EncodedQuery(ids=(1, 5, 6, 7, 8, 2), num_prompt_tokens=3),
    EncodedQuery(ids=(1, 9, 10, 2), num_prompt_tokens=2),
]


def test_batches_pad_right_and_mask_the_prompt():
    (batch,) = make_batches(QUERIES, 2, pad_id=2)
    assert batch["input_ids"].tolist() == [[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 2, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    m = IGNORE_INDEX
    assert batch["labels"].tolist() == [[m, m, m, 7, 8, 2], [m, m, 10, 2, m, m]]
    assert len(make_batches(QUERIES * 3, 4, pad_id=0, seed=1)) == 2
    with pytest.raises(ValueError):
        make_batches(QUERIES, 0, pad_id=0)


def test_loss_matches_transformers_loss_on_response_tokens(one_layer_mixtral):
    model = one_layer_mixtral(vocab_size=64).eval()
    model.router_aux_loss_coef = 0.0  # compare the LM part only
    (batch,) = make_batches(QUERIES, 2, pad_id=2)
    _loss, value = causal_lm_loss(model, batch)
    reference = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
    assert value == pytest.approx(reference.item(), rel=1e-5)
    model.router_aux_loss_coef = 0.02
    with_aux, lm_only = causal_lm_loss(model, batch)
    assert lm_only == pytest.approx(value, rel=1e-6) and with_aux.item() > lm_only  # balancing loss added


def test_a_few_steps_fit_a_tiny_batch(one_layer_mixtral):
    torch.manual_seed(0)
    model = one_layer_mixtral(vocab_size=64)
    batches = make_batches(QUERIES, 2, pad_id=2)
    optimizer, scheduler = make_optimizer_with_schedule(model, OptimConfig(lr=3e-3, warmup_steps=1), total_steps=30)
    first = train_epoch(model, batches, optimizer, scheduler)
    for _ in range(25):
        last = train_epoch(model, batches, optimizer, scheduler)
    assert last < first / 4
    assert not model.training  # left in eval mode for evaluation
