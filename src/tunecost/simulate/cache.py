"""Simulation results cached per workload: in process, and on disk under ``~/.cache/tunecost/simulate/`` (or
``$TUNECOST_CACHE_DIR/simulate/``), one JSON file per key. The key hashes the job, the stack, the trace depth, the
overhead model, the model's config and the tunecost + simulator versions, so any change misses the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from tunecost import __version__
from tunecost.errors import TunecostError
from tunecost.io import CACHE_ENV, atomic_write_json, cache_root  # noqa: F401 (CACHE_ENV: tests set it through here)
from tunecost.models.catalog import resolve_model
from tunecost.simulate.fp8 import FP8_MEMORY_VERSION
from tunecost.simulate.step_types import SIMULATOR_VERSION, StepCounts, StepSimulation

_MEMORY: dict[str, object] = {}


def cache_dir() -> Path:
    return cache_root() / "simulate"


# job fields left out of the key when unset: older keys hold
_UNSET = {
    "fp8": "none",
    "fp8_params": False,
    "selective_recompute": False,
    "recompute_layers": None,
    "packing": "none",
    "liger_kernel": False,
    "fp32_params": False,
}


def job_key(job, num_layers_to_trace, overhead, granule_bytes: int = 512, behaviour=None) -> str:
    """The cache key; `behaviour` (a `StackBehaviour`) enters it only when it is not the default, so the default
    simulation keeps its key."""
    spec = resolve_model(job.model)
    fields = {k: v for k, v in dataclasses.asdict(job).items() if not (k in _UNSET and v == _UNSET[k])}
    fields.pop("torch_compile", None)  # the simulated step is eager's either way
    fields.pop("grad_accum", None)  # and a micro-batch's
    if not fields["lora"].get("dropout"):
        fields["lora"] = {k: v for k, v in fields["lora"].items() if k != "dropout"}
    payload = {
        "job": fields,
        "trace": num_layers_to_trace,
        "stack": job.stack,  # also in the job: kept so that the keys of earlier runs hold
        "overhead": dataclasses.asdict(overhead),
        "granule": granule_bytes,
        "config": spec.config,
        "family": spec.family,
        "version": __version__,
        "simulator": SIMULATOR_VERSION,
    }
    if job.fp8 != "none":  # the FP8 rule's version: keys without FP8 keep their old form
        payload["fp8_memory"] = FP8_MEMORY_VERSION
    if behaviour is not None and not behaviour.is_default:  # unset fields (None, "") left out: older keys hold
        payload["behaviour"] = {k: v for k, v in dataclasses.asdict(behaviour).items() if v is not None and v != ""}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _to_json(sim) -> dict:
    d = dataclasses.asdict(sim)
    d["layers_traced"] = list(sim.layers_traced)
    d["assumptions"] = list(sim.assumptions)
    return d


def _from_json(d: dict):
    d = dict(d)
    d["counts"] = {k: StepCounts(**v) for k, v in d["counts"].items()}
    d["layers_traced"] = tuple(d["layers_traced"])
    d["assumptions"] = tuple(d["assumptions"])
    return StepSimulation(**d)


def load(key: str):
    hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    path = cache_dir() / f"{key}.json"
    try:
        sim = _from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    _MEMORY[key] = sim
    return sim


def store(key: str, sim) -> None:
    _MEMORY[key] = sim
    try:
        path = cache_dir() / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, _to_json(sim))
    except (OSError, TunecostError):
        pass  # a read-only cache directory only costs speed


def clear_memory() -> None:
    _MEMORY.clear()
