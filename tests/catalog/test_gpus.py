"""The GPU catalog (data/gpus.csv): schema, the figures the paper uses, name resolution."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tunecost.catalog.gpus import GPU, fp8_gpu_names, get_gpu, gpu_catalog, load_gpus, resolve_gpu_name
from tunecost.errors import TunecostError

REQUIRED_GPUS = (  # the catalog holds at least these
    "A40-48GB",
    "A100-40GB",
    "A100-80GB-SXM",
    "A100-80GB-PCIE",
    "H100-80GB-SXM",
    "H100-80GB-PCIE",
    "H200-141GB",
    "L40S-48GB",
    "L4-24GB",
    "A10G-24GB",
    "RTX4090-24GB",
)


def test_required_gpus_present() -> None:
    assert set(REQUIRED_GPUS) <= set(gpu_catalog())


@pytest.mark.parametrize("gpu", list(gpu_catalog().values()), ids=lambda g: g.name)
def test_every_gpu_row_is_complete(gpu: GPU) -> None:
    assert gpu.memory_gib > 0
    assert gpu.mem_bandwidth_bytes_per_s > 1e11  # every listed card has > 100 GB/s
    assert gpu.bf16_tensor_flops_per_s > 1e13
    assert gpu.fp32_flops_per_s > 1e12
    assert gpu.bf16_tensor_flops_per_s > gpu.fp32_flops_per_s  # tensor cores beat plain FP32
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", gpu.as_of)
    # a source for each figure (the memory column shares its source with bandwidth)
    for key in ("memory_bandwidth", "bf16", "fp32"):
        assert gpu.sources.get(key, "").strip(), f"{gpu.name}: no source for {key}"
    assert gpu.aliases, f"{gpu.name}: no alias"


def test_paper_gpu_memory() -> None:
    # §V-A: "A40, A100-40GB, A100-80GB and H100 with memory capacities of 48GB, 40GB, 80GB, and 80GB"
    assert [get_gpu(n).memory_gib for n in ("A40", "A100-40GB", "A100-80GB", "H100")] == [48, 40, 80, 80]


def test_memory_bytes_is_gib() -> None:
    assert get_gpu("A40").memory_bytes == 48 * 2**30


def test_units_are_base_units() -> None:
    a40 = get_gpu("A40")  # gpus.csv: 0.696 TB/s, 149.7 BF16 TFLOP/s, 37.4 FP32 TFLOP/s
    assert a40.mem_bandwidth_bytes_per_s == pytest.approx(0.696e12)
    assert a40.bf16_tensor_flops_per_s == pytest.approx(149.7e12)
    assert a40.fp32_flops_per_s == pytest.approx(37.4e12)


@pytest.mark.parametrize(
    ("typed", "canonical", "via_alias"),
    [
        ("h100", "H100-80GB-SXM", True),  # `h100` is the SXM part
        ("H100", "H100-80GB-SXM", True),
        ("A40", "A40-48GB", True),
        ("a40-48gb", "A40-48GB", False),
        ("  A40-48GB ", "A40-48GB", False),
        ("A100", "A100-80GB-SXM", True),
        ("h100-pcie", "H100-80GB-PCIE", True),
        ("RTX4090", "RTX4090-24GB", True),
        # the catalog's words in another order, an SXM generation, a memory type
        ("H200-SXM-141GB", "H200-141GB", True),
        ("B200-SXM-180GB", "B200-180GB", True),
        ("H100-SXM5-80GB", "H100-80GB-SXM", True),
        ("NVIDIA H100 80GB HBM3", "H100-80GB-SXM", True),
    ],
)
def test_names_resolve_case_insensitively(typed: str, canonical: str, via_alias: bool) -> None:
    resolved = resolve_gpu_name(typed)
    assert resolved.gpu.name == canonical
    assert (resolved.via_alias is not None) == via_alias


def test_ambiguous_prefix_lists_matches() -> None:
    # "RTX30" starts three catalog names; punctuation is ignored, so "h100-80gb-" is now the alias h100-80gb
    with pytest.raises(
        TunecostError, match=r"ambiguous GPU 'RTX30': matches RTX3090-24GB, RTX3090TI-24GB, RTX3080-10GB"
    ):
        resolve_gpu_name("RTX30")
    assert resolve_gpu_name("h100-80gb-").gpu.name == "H100-80GB-SXM"


def test_a_prefix_that_cuts_a_model_number_short_is_no_name() -> None:
    """An "H80" is not the H800, "B20" not the B200, "A3" not the A30; "mi300" still names the MI300X, and the H20 is
    its own card, not the H200."""
    for name in ("H80", "NVIDIA H80", "B20", "A3", "RTX 508"):
        with pytest.raises(TunecostError, match="unknown GPU"):
            resolve_gpu_name(name)
    assert resolve_gpu_name("mi300").gpu.name == "MI300X-192GB"
    assert resolve_gpu_name("NVIDIA H20").gpu.name == "H20-96GB"


def test_ambiguous_alias_lists_matches() -> None:
    a = dataclasses.replace(get_gpu("A40"), name="X1", aliases=("x",))  # two entries that share one alias
    b = dataclasses.replace(a, name="X2")
    with pytest.raises(TunecostError, match="ambiguous GPU 'X': matches X1, X2"):
        resolve_gpu_name("X", {"X1": a, "X2": b})


def test_unknown_gpu_lists_valid_names() -> None:
    with pytest.raises(TunecostError) as info:
        resolve_gpu_name("TPU-v5e")
    message = str(info.value)
    assert message.startswith("unknown GPU 'TPU-v5e'.")
    for name in REQUIRED_GPUS:
        assert name in message
    assert "\n" not in message


def test_unknown_gpu_did_you_mean() -> None:
    with pytest.raises(TunecostError, match="Did you mean 'L40S-48GB'"):
        resolve_gpu_name("L40S-49GB")


def test_unique_prefix_resolves_and_says_so() -> None:
    resolved = resolve_gpu_name("mi300")  # only MI300X-192GB starts with it
    assert resolved.gpu.name == "MI300X-192GB"
    assert resolved.via_alias == "mi300"


def test_a_card_outside_the_catalog_is_not_taken_for_one_whose_name_it_begins() -> None:
    """The RTX 2080 (8 GB) is not the RTX 2080 Ti: its name is an error naming both, never the Ti."""
    for name in ("RTX 2080", "NVIDIA GeForce RTX 2080"):
        with pytest.raises(TunecostError, match="the RTX 2080 .8 GB, not in the catalog., RTX2080TI-11GB"):
            resolve_gpu_name(name)
    assert resolve_gpu_name("NVIDIA GeForce RTX 2080 Ti").gpu.name == "RTX2080TI-11GB"


def test_the_l40_and_the_l40s_are_two_cards() -> None:
    """The L40 runs bf16 with FP32 accumulate at half the L40S's rate; nvidia-smi names resolve to each."""
    l40, l40s = resolve_gpu_name("NVIDIA L40").gpu, resolve_gpu_name("NVIDIA L40S").gpu
    assert (l40.name, l40s.name) == ("L40-48GB", "L40S-48GB")
    assert l40s.bf16_tensor_flops_per_s == pytest.approx(2 * l40.bf16_tensor_flops_per_s, rel=0.01)


def test_the_a10_and_the_a10g_are_two_cards() -> None:
    a10, a10g = resolve_gpu_name("NVIDIA A10").gpu, resolve_gpu_name("NVIDIA A10G").gpu
    assert (a10.name, a10g.name) == ("A10-24GB", "A10G-24GB")
    assert a10.memory_gib == a10g.memory_gib == 24 and a10.bf16_tensor_flops_per_s > a10g.bf16_tensor_flops_per_s


def test_bad_gpu_file_names_row(tmp_path) -> None:
    path = tmp_path / "gpus.csv"
    path.write_text(
        "name,aliases,memory_gib,mem_bandwidth_tb_s,bf16_tensor_tflops,fp32_tflops,as_of\n"
        "G1,g1,48,1,100,10,2026-01-01\nG2,g2,lots,1,100,10,2026-01-01\n"
    )
    with pytest.raises(TunecostError, match=r"row 2: column 'memory_gib' is not a number: 'lots'"):
        load_gpus(path)
    path.write_text("name,aliases,memory_gib\nG1,g1,48\n")
    with pytest.raises(TunecostError, match=r"missing column\(s\) mem_bandwidth_tb_s, bf16_tensor_tflops"):
        load_gpus(path)


def test_cuda_memory_is_below_the_datasheet_and_sourced() -> None:
    """Where the catalog stores the total CUDA reports, it is the usable memory: never above the datasheet figure,
    each with its source; elsewhere the usable memory is the datasheet figure."""
    with_cuda = [g for g in gpu_catalog().values() if g.cuda_memory_gib is not None]
    assert with_cuda
    for gpu in gpu_catalog().values():
        if gpu.cuda_memory_gib is None:
            assert gpu.usable_memory_bytes == gpu.memory_bytes and "datasheet figure" in gpu.usable_memory_note()
            continue
        assert 0.9 * gpu.memory_gib < gpu.cuda_memory_gib <= gpu.memory_gib, gpu.name
        assert gpu.usable_memory_bytes == round(gpu.cuda_memory_gib * 2**30) < gpu.memory_bytes
        assert gpu.sources.get("cuda_memory", "").strip(), f"{gpu.name}: no source for cuda_memory_gib"
        assert "the total CUDA reports" in gpu.usable_memory_note()


def test_bad_cuda_memory_names_row(tmp_path) -> None:
    path = tmp_path / "gpus.csv"
    head = "name,aliases,memory_gib,mem_bandwidth_tb_s,bf16_tensor_tflops,fp32_tflops,as_of,cuda_memory_gib"
    path.write_text(f"{head},source_cuda_memory\nG1,g1,48,1,100,10,2026-01-01,,\nG2,g2,48,1,100,10,2026-01-01,49,x\n")
    with pytest.raises(TunecostError, match=r"row 2: cuda_memory_gib 49 must be > 0 and at most memory_gib 48"):
        load_gpus(path)
    path.write_text(f"{head}\nG1,g1,48,1,100,10,2026-01-01,45\n")
    with pytest.raises(TunecostError, match=r"row 1: cuda_memory_gib 45 has no source_cuda_memory"):
        load_gpus(path)
    path.write_text(f"{head},source_cuda_memory\nG1,g1,48,1,100,10,2026-01-01,45,deviceQuery\n")
    assert load_gpus(path)["G1"].usable_memory_bytes == 45 * 2**30


FP8_ARCHITECTURES = {"Hopper", "Ada", "Blackwell", "CDNA3", "CDNA4"}


def test_fp8_rate_where_the_architecture_has_fp8_tensor_cores() -> None:
    """Every Hopper, Ada, Blackwell and CDNA3/4 card has a dense FP8 rate with its source and date, twice its bf16
    rate (the datasheets' ratio); older cards (Ampere, Volta, Turing, CDNA2) have none."""
    for gpu in gpu_catalog().values():
        if gpu.architecture not in FP8_ARCHITECTURES:
            assert not gpu.supports_fp8 and gpu.fp8_tensor_flops_per_s is None, gpu.name
            continue
        assert gpu.supports_fp8 and gpu.fp8_tensor_flops_per_s is not None, gpu.name
        ratio = gpu.fp8_tensor_flops_per_s / gpu.bf16_tensor_flops_per_s
        assert 1.95 < ratio < 2.05, (gpu.name, ratio)
        assert gpu.sources.get("fp8", "").strip(), f"{gpu.name}: no source for fp8_tensor_tflops"
    assert get_gpu("H100").fp8_tensor_flops_per_s == pytest.approx(1979e12)  # gpus.csv: stas00 TFLOPS table


def test_bad_fp8_rate_names_row(tmp_path) -> None:
    path = tmp_path / "gpus.csv"
    head = "name,aliases,memory_gib,mem_bandwidth_tb_s,bf16_tensor_tflops,fp32_tflops,as_of,fp8_tensor_tflops"
    path.write_text(f"{head}\nG1,g1,48,1,100,10,2026-01-01,200\n")
    with pytest.raises(TunecostError, match=r"row 1: fp8_tensor_tflops 200 has no source_fp8"):
        load_gpus(path)
    path.write_text(f"{head},source_fp8\nG1,g1,48,1,100,10,2026-01-01,,\nG2,g2,48,1,100,10,2026-01-01,200,sheet\n")
    gpus = load_gpus(path)
    assert gpus["G1"].fp8_tensor_flops_per_s is None and gpus["G2"].fp8_tensor_flops_per_s == 200e12


def test_every_gpu_means_every_fp8_gpu() -> None:
    every = fp8_gpu_names("tensorwise", list(gpu_catalog()), every=True)
    assert "H100-80GB-SXM" in every and "A100-80GB-SXM" not in every
    assert fp8_gpu_names("none", ["A40"]) == ["A40"]
