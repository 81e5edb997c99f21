"""A hub repository's small files (config.json, adapter_config.json): from the local Hugging Face cache, else
fetched from the Hub (never weights). `HF_HUB_OFFLINE=1` keeps tunecost to the cache; `HF_TOKEN` or `hf auth
login` opens gated repositories; `HF_ENDPOINT` names a mirror."""

from __future__ import annotations

from pathlib import Path

from tunecost.errors import TunecostError


def cached_hub_file(repo_id: str, filename: str = "config.json") -> Path | None:
    """The file of a hub repository in the local Hugging Face cache (None: not cached, or not a repository id)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(repo_id, filename)
    except ValueError:  # huggingface_hub's HFValidationError: not a repository id ("a/b/c", spaces, ...)
        return None
    return Path(hit) if isinstance(hit, str) else None


# why a file could not be had, once per process (a corpus names the same model in many rows)
_FAILED: dict[tuple[str, str], TunecostError] = {}


def hub_file(repo_id: str, filename: str = "config.json") -> Path:
    """The file from the cache, else downloaded into it; a `TunecostError` says why it could not be had."""
    cached = cached_hub_file(repo_id, filename)
    if cached is not None:
        return cached
    if (repo_id, filename) not in _FAILED:
        try:
            return _download(repo_id, filename)
        except TunecostError as exc:
            _FAILED[repo_id, filename] = exc
    raise _FAILED[repo_id, filename]


def _download(repo_id: str, filename: str) -> Path:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    where = f"{filename} of {repo_id!r}"
    try:
        # one metadata request without retries first, so that a machine without network fails in a second
        get_hf_file_metadata(hf_hub_url(repo_id, filename))
        return Path(hf_hub_download(repo_id, filename))
    except HFValidationError:
        raise TunecostError(f"{repo_id!r} is not a Hugging Face repository id (namespace/name)") from None
    except OfflineModeIsEnabled:
        raise TunecostError(f"{where} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set") from None
    except GatedRepoError:
        raise TunecostError(
            f"{where}: the repository is gated; accept its terms on the Hub, then `hf auth login` or set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise TunecostError(
            f"{where}: no such repository on the Hub (or a private one: `hf auth login` or set HF_TOKEN)"
        ) from None
    except RemoteEntryNotFoundError:
        raise TunecostError(f"{where}: the repository has no {filename}") from None
    except Exception as exc:  # network errors of huggingface_hub's HTTP client, HTTP errors
        raise _unreachable(where, exc) from None


def _unreachable(where: str, exc: Exception) -> TunecostError:
    reason = " ".join(str(exc).split())[:160]
    return TunecostError(
        f"{where} is not in the local Hugging Face cache and the Hub could not be reached "
        f"({type(exc).__name__}: {reason}); without network, set HF_HUB_OFFLINE=1 or pass a local config.json"
    )
