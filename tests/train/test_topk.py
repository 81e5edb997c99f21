from __future__ import annotations

import pytest
import torch

from tunecost.errors import TunecostError
from tunecost.models.anatomy import num_experts, set_top_k
from tunecost.train.topk import routing_name


def test_dense_and_sparse_routing_change_the_model(one_layer_mixtral):
    model = one_layer_mixtral(vocab_size=64).eval()
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        sparse = model(input_ids=ids).logits
    set_top_k(model, 8)
    assert num_experts(model) == 8
    assert model.config.num_experts_per_tok == 8 and model.num_experts_per_tok == 8
    assert all(m.top_k == 8 for m in model.modules() if hasattr(m, "top_k"))
    with torch.no_grad():
        dense = model(input_ids=ids).logits
    assert not torch.allclose(sparse, dense)
    set_top_k(model, 2)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, sparse)


def test_bad_values_and_names(one_layer_mixtral):
    model = one_layer_mixtral(vocab_size=64)
    with pytest.raises(TunecostError, match="between 1 and 8, got 9"):
        set_top_k(model, 9)
    with pytest.raises(TunecostError):
        set_top_k(torch.nn.Linear(2, 2), 2)
    assert (routing_name(2, 8), routing_name(8, 8)) == ("sparse", "dense")


def test_blackmamba_routing_goes_through_its_own_setter():
    from tunecost.models.blackmamba.config import tiny_blackmamba_config
    from tunecost.models.blackmamba.model import build_blackmamba

    model = build_blackmamba(tiny_blackmamba_config()).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    set_top_k(model, 8)
    assert num_experts(model) == 8
    assert model.config.experts_per_token == 8
    assert all(m.experts_per_token == 8 for m in model.moe_mixers())
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, before)
