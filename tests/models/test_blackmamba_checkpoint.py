"""Loading and saving BlackMamba checkpoints in Zyphra's layout (config.json + {"model": state_dict})."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from tunecost.errors import TunecostError
from tunecost.models.blackmamba import build_blackmamba, load_blackmamba, save_blackmamba, tiny_blackmamba_config

VOCAB = 256


@pytest.fixture(scope="module")
def model():
    return build_blackmamba(tiny_blackmamba_config(vocab_size=VOCAB), seed=0).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


def _zyphra_config_json(model) -> dict:
    """The config.json keys of Zyphra's hub files, nothing of ours (experts_per_token) in it."""
    c = model.config
    return {
        "num_layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "state_size": c.state_size,
        "conv_dimension": c.conv_dimension,
        "vocab_size": c.vocab_size,
        "expansion_factor": c.expansion_factor,
        "mamba_moe_layers": list(c.mamba_moe_layers),
        "ffn_hidden_size": c.ffn_hidden_size,
        "add_bias_linear": False,
        "swiglu": True,
        "max_sequence_length": 2048,
    }


def _write_zyphra_checkpoint(folder: Path, model, state: dict | None = None, wrap: bool = True) -> Path:
    """A checkpoint folder exactly as Zyphra's hub repos hold it: pytorch_model.bin = {"model": state_dict}."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_zyphra_config_json(model)))
    state = {k: v.clone() for k, v in model.state_dict().items()} if state is None else state
    torch.save({"model": state} if wrap else state, folder / "pytorch_model.bin")
    return folder


def _logits(m, ids):
    with torch.no_grad():
        return m(ids).logits


def test_zyphra_layout_loads_strictly_with_identical_logits(tmp_path, model, ids):
    folder = _write_zyphra_checkpoint(tmp_path / "ckpt", model)
    loaded = load_blackmamba(folder)
    assert loaded.config.experts_per_token == 1  # Zyphra's config has no top-k: the released top-1
    assert not loaded.training
    loaded.set_experts_per_token(model.config.experts_per_token)
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))


@pytest.mark.parametrize("fmt,filename", [("bin", "pytorch_model.bin"), ("safetensors", "model.safetensors")])
def test_save_load_round_trip(tmp_path, model, ids, fmt, filename):
    path = save_blackmamba(model, tmp_path / "out", format=fmt)
    assert path.name == filename and (tmp_path / "out" / "config.json").is_file()
    loaded = load_blackmamba(tmp_path / "out")
    assert loaded.config == model.config
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))
    if fmt == "bin":
        raw = torch.load(path, weights_only=True)
        assert set(raw) == {"model"} and set(raw["model"]) == set(model.state_dict())


def test_saving_one_format_removes_the_other(tmp_path, model):
    save_blackmamba(model, tmp_path, format="safetensors")
    save_blackmamba(model, tmp_path, format="bin")
    assert not (tmp_path / "model.safetensors").exists() and (tmp_path / "pytorch_model.bin").exists()
    with pytest.raises(TunecostError, match="unknown checkpoint format"):
        save_blackmamba(model, tmp_path, format="gguf")


def test_zyphra_save_pretrained_layout_is_renamed(tmp_path, model, ids):
    """Zyphra's MambaModel.save_pretrained writes a flat dict with embedding.weight + output_layer.weight."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    emb = state.pop("embedding.word_embeddings.weight")
    state["embedding.weight"], state["output_layer.weight"] = emb, emb.clone()
    folder = _write_zyphra_checkpoint(tmp_path / "flat", model, state, wrap=False)
    loaded = load_blackmamba(folder, experts_per_token=2)
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))
    state["output_layer.weight"] = emb + 1
    _write_zyphra_checkpoint(folder, model, state, wrap=False)
    with pytest.raises(TunecostError, match="ties them"):
        load_blackmamba(folder)


def test_load_options(tmp_path, model):
    folder = _write_zyphra_checkpoint(tmp_path / "ckpt", model)
    loaded = load_blackmamba(folder, dtype=torch.bfloat16, experts_per_token=8)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert all(m.experts_per_token == 8 for m in loaded.moe_mixers())
    with pytest.raises(TunecostError, match="experts_per_token"):
        load_blackmamba(folder, experts_per_token=9)


def test_key_and_shape_mismatches_are_listed(tmp_path, model):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    del state["decoder.layers.0.mixer.A_log"]
    state["decoder.layers.0.mixer.bogus"] = torch.zeros(1)
    folder = _write_zyphra_checkpoint(tmp_path / "keys", model, state)
    with pytest.raises(
        TunecostError,
        match=r"missing keys: decoder\.layers\.0\.mixer\.A_log.*"
        r"unexpected keys: decoder\.layers\.0\.mixer\.bogus",
    ):
        load_blackmamba(folder)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["decoder.layers.1.mixer.router.weight"] = torch.zeros(4, 128)
    _write_zyphra_checkpoint(folder, model, state)
    with pytest.raises(TunecostError, match="shapes do not match.*router.weight"):
        load_blackmamba(folder)


def test_unsafe_pickle_is_refused_with_a_way_out(tmp_path, model):
    folder = tmp_path / "unsafe"
    _write_zyphra_checkpoint(folder, model)
    torch.save({"model": model.state_dict(), "args": argparse.Namespace(lr=1.0)}, folder / "pytorch_model.bin")
    with pytest.raises(TunecostError, match="argparse.Namespace object.*weights_only=True.*safetensors"):
        load_blackmamba(folder)


def test_malformed_or_unknown_checkpoints_are_user_errors(tmp_path, model):
    with pytest.raises(TunecostError, match="no BlackMamba checkpoint folder"):
        load_blackmamba(tmp_path / "does-not-exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TunecostError, match="no BlackMamba config"):
        load_blackmamba(empty)
    (empty / "config.json").write_text(json.dumps(_zyphra_config_json(model)))
    with pytest.raises(TunecostError, match="no weights"):
        load_blackmamba(empty)
    (empty / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(TunecostError, match="not a readable PyTorch checkpoint"):
        load_blackmamba(empty)
    (empty / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(TunecostError, match="not a readable safetensors"):
        load_blackmamba(empty)
    (empty / "config.json").write_text('{"hidden_size": 1}')
    with pytest.raises(TunecostError, match="not a BlackMamba config"):
        load_blackmamba(empty)
    with pytest.raises(TunecostError, match="is a file"):
        load_blackmamba(empty / "config.json")


def test_hub_ids_come_from_the_local_cache_only(tmp_path, model, ids):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--Zyphra--BlackMamba-Tiny"
    save_blackmamba(model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    loaded = load_blackmamba("Zyphra/BlackMamba-Tiny", cache_dir=tmp_path)
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))
    with pytest.raises(TunecostError, match="not in the local Hugging Face cache"):
        load_blackmamba("Zyphra/BlackMamba-Missing", cache_dir=tmp_path)
