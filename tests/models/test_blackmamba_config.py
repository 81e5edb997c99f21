"""BlackMamba config (Zyphra's config.json keys), the catalog entries, and parameter counts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import tunecost
from tunecost.errors import TunecostError
from tunecost.models.blackmamba import BlackMambaConfig, config_from_spec, count_parameters, tiny_blackmamba_config

CATALOG = Path(tunecost.__file__).parent / "catalog" / "data" / "models"

# The 2.8B model's config.json keys and values (Zyphra/BlackMamba-2.8B; the keys Zyphra's loader reads).
ZYPHRA_2_8B = {
    "num_layers": 36,
    "hidden_size": 1472,
    "state_size": 16,
    "conv_dimension": 4,
    "vocab_size": 50304,
    "expansion_factor": 2,
    "mamba_moe_layers": ["r", "8"] * 18,
    "ffn_hidden_size": 3872,
    "add_bias_linear": False,
    "swiglu": True,
    "max_sequence_length": 2048,
}


def test_from_dict_and_derived_sizes():
    cfg = BlackMambaConfig.from_dict(ZYPHRA_2_8B)
    assert (cfg.d_inner, cfg.dt_rank) == (2944, 92)  # 2 * 1472, ceil(1472 / 16)
    assert cfg.num_experts == 8 and cfg.experts_per_token == 1
    assert (cfg.num_mamba_layers, cfg.num_moe_layers) == (18, 18)
    assert cfg.layer_types[:3] == ("mamba", "moe", "mamba")
    assert cfg.fc1_output_size == 7744


def test_to_dict_round_trips_and_keeps_unknown_keys(tmp_path):
    raw = {**ZYPHRA_2_8B, "some_future_key": [1, 2]}
    cfg = BlackMambaConfig.from_dict(raw)
    out = cfg.to_dict()
    assert out["some_future_key"] == [1, 2] and out["mamba_moe_layers"] == ZYPHRA_2_8B["mamba_moe_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(out))
    assert BlackMambaConfig.from_json_file(path) == cfg
    assert cfg.with_experts_per_token(2).experts_per_token == 2


@pytest.mark.parametrize(
    "change,match",
    [
        ({"hidden_size": None}, "missing hidden_size"),
        ({"mamba_moe_layers": ["r", "8"]}, "one per layer"),
        ({"mamba_moe_layers": ["r", "r1"] * 18}, "unsupported mamba_moe_layers entry"),
        ({"mamba_moe_layers": ["r", "8"] * 17 + ["r", "4"]}, "share one expert count"),
        ({"experts_per_token": 9}, "experts_per_token must be in 1..8"),
        ({"hidden_size": "1472"}, "positive integer"),
        ({"mamba_moe_layers": "r8"}, "must be a list"),
        ({"swiglu": "false"}, "true or false"),
    ],
)
def test_bad_configs_are_user_errors(change, match):
    raw = {**ZYPHRA_2_8B, **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(TunecostError, match=match):
        BlackMambaConfig.from_dict(raw)


def test_unreadable_config_files_are_user_errors(tmp_path):
    with pytest.raises(TunecostError, match="no BlackMamba config"):
        BlackMambaConfig.from_json_file(tmp_path / "missing.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(TunecostError, match="not a readable JSON"):
        BlackMambaConfig.from_json_file(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(TunecostError, match="must be a JSON object"):
        BlackMambaConfig.from_json_file(bad)


def test_config_from_a_catalog_spec_keeps_the_layer_pattern_at_a_new_depth():
    spec = SimpleNamespace(name="blackmamba-2.8b", config=ZYPHRA_2_8B)
    cfg = config_from_spec(spec, experts_per_token=2, num_hidden_layers=4)
    assert cfg.num_layers == 4 and cfg.mamba_moe_layers == ("r", "8", "r", "8") and cfg.experts_per_token == 2
    assert config_from_spec(spec) == BlackMambaConfig.from_dict(ZYPHRA_2_8B)
    with pytest.raises(TunecostError, match="blackmamba-2.8b"):
        config_from_spec(spec, experts_per_token=9)


def test_tiny_preset():
    cfg = tiny_blackmamba_config()
    assert cfg.layer_types == ("mamba", "moe", "mamba", "moe") and cfg.num_experts == 8
    assert tiny_blackmamba_config(num_layers=6).mamba_moe_layers == ("r", "8") * 3


@pytest.mark.parametrize("name", ["blackmamba-2.8b", "blackmamba-1.5b"])
def test_catalog_entries_parse(name):
    entry = json.loads((CATALOG / f"{name}.json").read_text())
    assert entry["name"] == name and entry["family"] == "blackmamba" and entry["source"]
    cfg = BlackMambaConfig.from_dict(entry["config"])
    assert cfg.num_experts == 8
    if name == "blackmamba-2.8b":
        assert entry["config"] == ZYPHRA_2_8B


def test_parameter_counts_match_published_2_8b():
    """Zyphra's README names the model "BlackMamba 630M/2.8B" = (forward-pass params)/(total params);
    Xia et al. (IISWC 2024) Table I also lists 2.8B. Counted, not typed: the model built on the meta device."""
    cfg = BlackMambaConfig.from_dict(ZYPHRA_2_8B)
    total, active_top1 = count_parameters(cfg, experts_per_token=1)
    assert abs(total - 2.8e9) / 2.8e9 < 0.01
    assert abs(active_top1 - 630e6) / 630e6 < 0.01
    assert (round(total / 1e8) / 10, round(active_top1 / 1e7) * 10) == (2.8, 630)  # the published rounding
    _, active_top2 = count_parameters(cfg, experts_per_token=2)
    _, active_top8 = count_parameters(cfg, experts_per_token=8)
    per_expert = 1472 * 7744 + 3872 * 1472  # linear_fc1 + linear_fc2, no biases
    assert active_top2 - active_top1 == 18 * per_expert
    assert active_top8 == total


def test_parameter_counts_of_the_derived_1_5b_round_to_its_name():
    """The 1.5B catalog config is derived (see its source); it must at least reproduce "340M/1.5B"."""
    entry = json.loads((CATALOG / "blackmamba-1.5b.json").read_text())
    total, active = count_parameters(BlackMambaConfig.from_dict(entry["config"]))
    assert (round(total / 1e8) / 10, round(active / 1e7) * 10) == (1.5, 340)


def test_count_parameters_rejects_bad_top_k():
    with pytest.raises(TunecostError):
        count_parameters(tiny_blackmamba_config(), experts_per_token=0)
