"""Parameter counts are kept on disk: a second process reads them back without building the model."""

from __future__ import annotations

from tunecost.models import params
from tunecost.models.catalog import resolve_model


def test_counts_come_back_from_disk(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(tmp_path))
    spec = resolve_model("mixtral-8x7b")
    monkeypatch.setattr(params, "_CACHE", {})
    first = params.count_parameters(spec, 2)
    assert list((tmp_path / "params").glob("*.json"))
    monkeypatch.setattr(params, "_CACHE", {})
    monkeypatch.setattr(params, "_count", lambda *_: (_ for _ in ()).throw(AssertionError("built again")))
    assert params.count_parameters(spec, 2) == first
