"""`tunecost gpus`, `tunecost models`, `tunecost prices` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest

from tunecost.cli.main import app


def _ok_json(cli_runner, args: list[str]):
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# The documented fields of each catalog row in --json output.
JSON_FIELDS = {
    "gpus": "name aliases memory_gib memory_bytes mem_bandwidth_bytes_per_s bf16_tensor_flops_per_s fp32_flops_per_s "
    "as_of sources supports_bf16 cuda_memory_gib usable_memory_bytes fp8_tensor_flops_per_s supports_fp8",
    "models": "name family hub_id layers hidden_size vocab_size num_experts experts_per_token total_params "
    "active_params published_total_params source as_of",
}


@pytest.mark.parametrize("command", sorted(JSON_FIELDS))
def test_catalog_json_rows_have_every_field(cli_runner, command: str) -> None:
    rows = _ok_json(cli_runner, [command, "--json"])
    assert rows and all(set(JSON_FIELDS[command].split()) <= set(r) for r in rows)


def test_gpus_json(cli_runner) -> None:
    by_name = {r["name"]: r for r in _ok_json(cli_runner, ["gpus", "--json"])}
    a40 = by_name["A40-48GB"]
    assert a40["memory_gib"] == 48 and a40["memory_bytes"] == 48 * 2**30
    assert "a40" in a40["aliases"]
    assert by_name["H100-80GB-SXM"]["bf16_tensor_flops_per_s"] == pytest.approx(989e12)  # gpus.csv
    assert by_name["H100-80GB-SXM"]["supports_bf16"] and not by_name["T4-16GB"]["supports_bf16"]  # Turing
    assert by_name["H100-80GB-SXM"]["fp8_tensor_flops_per_s"] == pytest.approx(1979e12)  # gpus.csv
    assert by_name["H100-80GB-SXM"]["supports_fp8"] and not by_name["A40-48GB"]["supports_fp8"]  # Ampere


def test_gpus_table(cli_runner) -> None:
    result = cli_runner.invoke(app, ["gpus"])
    assert result.exit_code == 0
    assert "A40-48GB" in result.stdout and "H200-141GB" in result.stdout
    assert "RTX3090-24GB" in result.stdout and "MI300X-192GB" in result.stdout
    assert "(FP16: no bf16)" in result.stdout  # T4 and V100 rows say what their BF16 column holds


def test_models_json(cli_runner) -> None:
    by_name = {r["name"]: r for r in _ok_json(cli_runner, ["models", "--json"])}
    mixtral = by_name["mixtral-8x7b"]
    # Mixtral of experts: 46.7 B total, 12.9 B per token (within 1 %)
    assert mixtral["total_params"] == pytest.approx(46.7e9, rel=0.01)
    assert mixtral["active_params"] == pytest.approx(12.9e9, rel=0.01)
    assert (mixtral["num_experts"], mixtral["experts_per_token"]) == (8, 2)
    assert by_name["llama-3.1-8b"]["active_params"] == by_name["llama-3.1-8b"]["total_params"]


def test_prices_json_and_filters(cli_runner) -> None:
    rows = _ok_json(cli_runner, ["prices", "--json"])
    assert all({"provider", "gpu", "usd_per_gpu_hour", "date", "source_url"} <= set(r) for r in rows)
    paper = _ok_json(cli_runner, ["prices", "--provider", "paper-2024", "--json"])
    assert {r["gpu"]: r["usd_per_gpu_hour"] for r in paper} == {
        "A40-48GB": 0.79,
        "A100-80GB-SXM": 1.67,
        "H100-80GB-SXM": 2.1,
    }  # Table IV
    h100 = _ok_json(cli_runner, ["prices", "--gpu", "h100", "--json"])
    assert {r["gpu"] for r in h100} == {"H100-80GB-SXM"}
    assert [r["usd_per_gpu_hour"] for r in h100] == sorted(r["usd_per_gpu_hour"] for r in h100)


def test_prices_file_overrides_and_extends(cli_runner, write_file) -> None:
    path = write_file(
        "p.csv",
        "provider,gpu,usd_per_gpu_hour,date,source_url\n"
        "paper-2024,A40,0.5,2025-01-02,https://example.com/a\n"
        "myco,A40-48GB,0.42,2025-02,https://example.com/b\n",
    )
    rows = _ok_json(cli_runner, ["prices", "--gpu", "A40", "--prices", str(path), "--json"])
    got = {r["provider"]: (r["usd_per_gpu_hour"], r["date"]) for r in rows}
    assert got["paper-2024"] == (0.5, "2025-01-02")
    assert got["myco"] == (0.42, "2025-02")


def test_unknown_gpu_and_provider(cli_error) -> None:
    line = cli_error(["prices", "--gpu", "TPU-v5e"])
    assert line.startswith("error: unknown GPU 'TPU-v5e'.") and "Valid choices:" in line and "A40-48GB" in line
    line = cli_error(["prices", "--provider", "nocloud"])
    assert "unknown provider 'nocloud'" in line and "paper-2024" in line
    line = cli_error(["prices", "--gpu", "V100"])
    assert "ambiguous GPU 'V100': matches V100-16GB-SXM2, V100-32GB-SXM2, V100-16GB-PCIE, V100-32GB-PCIE" in line


def test_bad_price_file_names_row(cli_error, write_file) -> None:
    path = write_file(
        "p.csv",
        "provider,gpu,usd_per_gpu_hour,date,source_url\n"
        "myco,A40,0.5,2025-01-02,https://example.com/a\n"
        "myco,L4,cheap,2025-01-02,https://example.com/a\n",
    )
    line = cli_error(["prices", "--prices", str(path)])
    assert "row 2: column 'usd_per_gpu_hour' is not a number: 'cheap'" in line


def test_gpus_json_usable_memory(cli_runner) -> None:
    """`usable_memory_bytes` is the total CUDA reports where the catalog has it (the A40's ECC-on printout), else
    the datasheet figure."""
    by_name = {r["name"]: r for r in _ok_json(cli_runner, ["gpus", "--json"])}
    a40 = by_name["A40-48GB"]
    assert a40["cuda_memory_gib"] == pytest.approx(45403 / 1024, abs=1e-3)  # deviceQuery: 45403 MBytes
    assert a40["usable_memory_bytes"] == round(a40["cuda_memory_gib"] * 2**30) < a40["memory_bytes"]
    assert "deviceQuery" in a40["sources"]["cuda_memory"]
    h200 = by_name["H200-141GB"]
    assert h200["cuda_memory_gib"] is None and h200["usable_memory_bytes"] == h200["memory_bytes"]
