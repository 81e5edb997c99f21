"""Load and save BlackMamba checkpoints in Zyphra's layout: `config.json` + `pytorch_model.bin` holding
`{"model": state_dict}` (or `model.safetensors` holding the state dict itself).

Sources and derivations: docs/models.md, section `tunecost.models.blackmamba.checkpoint`.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from tunecost.errors import TunecostError
from tunecost.io import atomic_write_json
from tunecost.models.blackmamba.config import BlackMambaConfig
from tunecost.models.blackmamba.model import BlackMambaForCausalLM, build_blackmamba

CONFIG_NAME = "config.json"
BIN_NAME = "pytorch_model.bin"
SAFETENSORS_NAME = "model.safetensors"
FORMATS = {"bin": BIN_NAME, "safetensors": SAFETENSORS_NAME}
_EMBEDDING_KEY = "embedding.word_embeddings.weight"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_MAX_LISTED = 8
_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def resolve_blackmamba_dir(
    path_or_hub_id: str | os.PathLike[str],
    *,
    allow_download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """A local checkpoint folder, or a hub id's snapshot folder in the local HF cache (downloads only when
    `allow_download`)."""
    name = str(path_or_hub_id)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise TunecostError(f"{path} is a file; pass the folder that holds {CONFIG_NAME} and the weights")
    if not _HUB_ID.match(name):
        raise TunecostError(f"no BlackMamba checkpoint folder at {name}")
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id=name,
            cache_dir=None if cache_dir is None else Path(cache_dir),
            local_files_only=not allow_download,
            allow_patterns=[CONFIG_NAME, BIN_NAME, SAFETENSORS_NAME],
        )
    except Exception as exc:  # the hub client's own error types vary across versions
        if allow_download:
            raise TunecostError(f"could not download {name} from the Hugging Face hub ({exc})") from None
        raise TunecostError(
            f"{name!r} is not a local folder and is not in the local Hugging Face cache (tunecost does not "
            f"download unless asked): run `hf download {name}` or pass allow_download=True"
        ) from None
    return Path(folder)


def _read_bin(path: Path) -> object:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        unsafe = _UNSAFE_GLOBAL.search(str(exc))
        if unsafe is None:  # not a forbidden class: the bytes themselves are not a checkpoint
            reason = str(exc).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
            raise TunecostError(f"{path}: not a readable PyTorch checkpoint ({reason})") from None
        raise TunecostError(
            f"{path}: refusing to load: the pickle holds a {unsafe.group(1)} object, and tunecost loads "
            "checkpoints with torch.load(weights_only=True) only. If you trust the file, convert it once: "
            "sd = torch.load(path, weights_only=False); sd = sd.get('model', sd); "
            "safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items() if torch.is_tensor(v)}, "
            "'model.safetensors') next to its config.json"
        ) from None
    except Exception as exc:  # truncated or not a torch file: zip and pickle readers raise many types
        raise TunecostError(f"{path}: not a readable PyTorch checkpoint ({type(exc).__name__}: {exc})") from None


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError and OSError
        raise TunecostError(f"{path}: not a readable safetensors file ({exc})") from None


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """The raw state dict in `folder` (safetensors preferred), unwrapped from {"model": ...}."""
    raw: object
    if (folder / SAFETENSORS_NAME).is_file():
        where, raw = folder / SAFETENSORS_NAME, _read_safetensors(folder / SAFETENSORS_NAME)
    elif (folder / BIN_NAME).is_file():
        where, raw = folder / BIN_NAME, _read_bin(folder / BIN_NAME)
    else:
        raise TunecostError(f"{folder}: no weights ({SAFETENSORS_NAME} or {BIN_NAME})")
    if isinstance(raw, Mapping) and isinstance(raw.get("model"), Mapping):
        raw = raw["model"]
    if not isinstance(raw, Mapping) or not raw:
        raise TunecostError(f"{where}: expected a state dict or {{'model': state_dict}}, got {type(raw).__name__}")
    # Megatron/TransformerEngine keep non-tensor metadata under "*._extra_state"; it holds no weights.
    state = {k: v for k, v in raw.items() if not str(k).endswith("_extra_state")}
    not_tensors = sorted(str(k) for k, v in state.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise TunecostError(f"{where}: entries that are not tensors: {_listed(not_tensors)}")
    return dict(state)


def _listed(names: list[str]) -> str:
    more = f" (and {len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
    return ", ".join(names[:_MAX_LISTED]) + more


def _to_our_keys(state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """Rename Zyphra's in-memory layout (embedding.weight, output_layer.weight) to the hub layout."""
    state = dict(state)
    if "embedding.weight" in state and _EMBEDDING_KEY not in state:
        state[_EMBEDDING_KEY] = state.pop("embedding.weight")
    output = state.pop("output_layer.weight", None)
    if output is not None and not (_EMBEDDING_KEY in state and torch.equal(output, state[_EMBEDDING_KEY])):
        raise TunecostError(f"{where}: output_layer.weight differs from the embedding; BlackMamba ties them")
    return state


def _check_against(model: BlackMambaForCausalLM, state: dict[str, torch.Tensor], where: Path) -> None:
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = ([f"missing keys: {_listed(missing)}"] if missing else []) + (
            [f"unexpected keys: {_listed(unexpected)}"] if unexpected else []
        )
        raise TunecostError(f"{where}: weights do not match config.json; " + "; ".join(parts))
    wrong = [f"{k} {tuple(state[k].shape)} != {tuple(s)}" for k, s in expected.items() if state[k].shape != s]
    if wrong:
        raise TunecostError(f"{where}: weight shapes do not match config.json: {_listed(wrong)}")


def load_blackmamba(
    path_or_hub_id: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    experts_per_token: int | None = None,
    allow_download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> BlackMambaForCausalLM:
    """A BlackMamba from a checkpoint folder or a cached hub id, strictly loaded, in eval mode.

    `dtype` None keeps the checkpoint's dtype; `experts_per_token` overrides the routing top-k.
    """
    folder = resolve_blackmamba_dir(path_or_hub_id, allow_download=allow_download, cache_dir=cache_dir)
    config = BlackMambaConfig.from_json_file(folder / CONFIG_NAME)
    if experts_per_token is not None:
        config = config.with_experts_per_token(experts_per_token)
    state = _to_our_keys(read_state_dict(folder), folder)
    model = build_blackmamba(config, device="meta")
    _check_against(model, state, folder)
    model.load_state_dict(state, strict=True, assign=True)  # takes the loaded tensors, no second copy
    model.to(device=device, dtype=dtype)
    return model.eval()


def save_blackmamba(model: BlackMambaForCausalLM, directory: str | os.PathLike[str], *, format: str = "bin") -> Path:
    """Write config.json and the weights in Zyphra's layout ("bin": pytorch_model.bin = {"model": sd};
    "safetensors": model.safetensors = sd). A weights file of the other format in `directory` is removed
    so that loading cannot pick up stale weights. Returns the weights file."""
    if format not in FORMATS:
        raise TunecostError(f"unknown checkpoint format {format!r}; choose one of {', '.join(FORMATS)}")
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if any(v.is_meta for v in state.values()):
        raise TunecostError("cannot save a model built on the meta device (it has no weights)")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / FORMATS[format]
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        if format == "bin":
            torch.save({"model": state}, tmp)
        else:
            from safetensors.torch import save_file

            save_file(state, tmp, metadata={"format": "pt"})
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for other in set(FORMATS.values()) - {target.name}:
        (folder / other).unlink(missing_ok=True)
    atomic_write_json(folder / CONFIG_NAME, model.config.to_dict())
    return target
