"""Dense routing is top-k == the number of experts, read from the record (not top-k == 8)."""

from __future__ import annotations

import pandas as pd

from tunecost.report.figures import is_dense, routing_label


def test_dense_means_every_expert():
    # OLMoE routes top-8 of 64 experts and Qwen3-30B-A3B top-8 of 128: sparse
    assert not is_dense({"experts_per_token": 8, "num_experts": 64})
    assert routing_label(pd.Series({"experts_per_token": 8, "num_experts": 128})) == "top-8"
    assert is_dense({"experts_per_token": 64, "num_experts": 64})
    assert routing_label({"experts_per_token": 8, "num_experts": 8}) == "dense"


def test_rows_without_num_experts():
    # eq. (2) rows carry sparsity k/E; older profile rows have neither and came from 8-expert models
    assert is_dense({"experts_per_token": 8, "sparsity": 1.0})
    assert not is_dense({"experts_per_token": 8, "sparsity": 8 / 64})
    assert is_dense(pd.Series({"experts_per_token": 8, "num_experts": float("nan")}))
    assert routing_label({"experts_per_token": 2}) == "top-2"
    assert not is_dense({"experts_per_token": None})
