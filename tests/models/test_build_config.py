"""Building a transformers config leaves the catalog's config as it was (the simulation cache keys on it)."""

from __future__ import annotations

import json

from tunecost.models.build import hf_config
from tunecost.models.catalog import resolve_model


def test_hf_config_does_not_write_into_the_catalog() -> None:
    spec = resolve_model("meta-llama/Llama-3.2-1B")  # rope_scaling: transformers adds rope_theta to its dict
    before = json.dumps(spec.config, sort_keys=True)
    hf_config(spec)
    assert json.dumps(spec.config, sort_keys=True) == before
