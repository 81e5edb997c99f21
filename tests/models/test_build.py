"""tunecost.models.build: which tokenizer belongs to a model, and loading real weights (offline, tiny fixtures)."""

from __future__ import annotations

import pytest
import torch

from tunecost.errors import TunecostError
from tunecost.models.build import BLACKMAMBA_TOKENIZER, default_tokenizer, load_pretrained
from tunecost.models.catalog import resolve_model


@pytest.mark.parametrize(
    ("model", "tokenizer"),
    [
        ("mixtral-8x7b", "mistral"),
        ("tiny-mixtral", "mistral"),
        ("blackmamba-2.8b", BLACKMAMBA_TOKENIZER),
        ("olmoe-1b-7b", None),
    ],
)
def test_default_tokenizer(model, tokenizer):
    """Mixtral's 32000-piece SentencePiece ships offline ("mistral"); BlackMamba's is GPT-NeoX-20B's; any other
    model's is in its own hub repository."""
    spec = resolve_model(model)
    assert default_tokenizer(spec) == (tokenizer or spec.hub_id)


def test_load_pretrained_blackmamba_folder_and_errors(tmp_path):
    from tunecost.models.blackmamba import build_blackmamba, save_blackmamba, tiny_blackmamba_config

    saved = build_blackmamba(tiny_blackmamba_config(vocab_size=256), seed=1)
    save_blackmamba(saved, tmp_path / "bm", format="safetensors")
    loaded = load_pretrained(resolve_model(str(tmp_path / "bm")), dtype=torch.float32)
    assert loaded.state_dict().keys() == saved.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in saved.state_dict().items())
    with pytest.raises(TunecostError, match="built-in architecture with no weights"):
        load_pretrained(resolve_model("tiny-mixtral"))
    # a catalog model whose weights are not on this machine: one line naming the hub id (nothing downloaded)
    with pytest.raises(TunecostError, match="Zyphra/BlackMamba-2.8B"):
        load_pretrained(resolve_model("blackmamba-2.8b"))


def test_offline_load_asks_no_server_for_files(monkeypatch):
    """Without downloads, a model that is not cached fails at once with one line and without asking the hub for
    any file (transformers' own PEFT adapter lookup otherwise sends HEAD requests, five retries offline)."""
    from huggingface_hub import file_download

    asked = []

    def no_metadata(url, *args, **kwargs):
        asked.append(url)
        raise OSError(f"HEAD {url} during an offline load")

    monkeypatch.setattr(file_download, "get_hf_file_metadata", no_metadata)
    with pytest.raises(TunecostError, match="cannot load mistralai/Mixtral-8x7B-v0.1"):
        load_pretrained(resolve_model("mixtral-8x7b"))
    assert asked == []
