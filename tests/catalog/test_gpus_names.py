"""GPU names as sources print them (nvidia-smi, torch.cuda.get_device_name, papers, benchmark tables) resolve to the
right catalog card, and names that could mean more than one card are errors naming the candidates."""

from __future__ import annotations

import csv
import re
from collections import defaultdict

import pytest

from tunecost.catalog.gpu_achieved import GPU_ACHIEVED_PATH, achieved_catalog
from tunecost.catalog.gpus import get_gpu, gpu_catalog, normalize_gpu_name, resolve_gpu_name
from tunecost.errors import TunecostError

SPELLINGS = [  # (as a source prints it, catalog name)
    # nvidia-smi / torch.cuda.get_device_name
    ("NVIDIA GeForce RTX 3090", "RTX3090-24GB"),
    ("NVIDIA GeForce RTX 3090 Ti", "RTX3090TI-24GB"),
    ("NVIDIA GeForce RTX 4080", "RTX4080-16GB"),
    ("NVIDIA GeForce RTX 4090", "RTX4090-24GB"),
    ("NVIDIA RTX A6000", "RTXA6000-48GB"),
    ("NVIDIA RTX A4000", "RTXA4000-16GB"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX6000ADA-48GB"),
    ("Tesla T4", "T4-16GB"),
    ("Tesla V100-SXM2-16GB", "V100-16GB-SXM2"),
    ("Tesla V100-SXM2-32GB", "V100-32GB-SXM2"),
    ("Tesla V100-PCIE-32GB", "V100-32GB-PCIE"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIE"),
    ("NVIDIA A800-SXM4-80GB", "A800-80GB-SXM"),
    ("NVIDIA A800 80GB PCIe", "A800-80GB-PCIE"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB-SXM"),
    ("NVIDIA H100 PCIe", "H100-80GB-PCIE"),
    ("NVIDIA H100 NVL", "H100-94GB-NVL"),
    ("NVIDIA H800", "H800-80GB-SXM"),
    ("NVIDIA GH200 480GB", "GH200-96GB"),
    ("NVIDIA L40S", "L40S-48GB"),
    ("NVIDIA L40", "L40-48GB"),
    ("NVIDIA L20", "L20-48GB"),
    ("NVIDIA A10G", "A10G-24GB"),
    ("NVIDIA GeForce RTX 3080 Ti", "RTX3080TI-12GB"),
    ("NVIDIA GeForce RTX 3070", "RTX3070-8GB"),
    ("NVIDIA GeForce RTX 4070", "RTX4070-12GB"),
    ("NVIDIA GeForce RTX 4070 Ti", "RTX4070TI-12GB"),
    ("RTX 3060 12GB", "RTX3060-12GB"),
    ("RTX 4060 Ti 16GB", "RTX4060TI-16GB"),
    ("H100 SXM5", "H100-80GB-SXM"),
    ("A100 40GB PCIe", "A100-40GB"),
    ("AMD Instinct MI300X", "MI300X-192GB"),
    ("AMD Instinct MI325X", "MI325X-256GB"),
    ("NVIDIA B200", "B200-180GB"),
    ("NVIDIA GeForce RTX 5090", "RTX5090-32GB"),
    ("NVIDIA GeForce RTX 2080 Ti", "RTX2080TI-11GB"),
    ("NVIDIA TITAN RTX", "TITANRTX-24GB"),
    ("NVIDIA A30", "A30-24GB"),
    ("NVIDIA RTX A5000", "RTXA5000-24GB"),
    ("NVIDIA H20", "H20-96GB"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTXPRO6000-96GB"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTXPRO6000-96GB"),
    ("NVIDIA GeForce RTX 4080 SUPER", "RTX4080SUPER-16GB"),
    ("NVIDIA GeForce RTX 4070 Ti SUPER", "RTX4070TISUPER-16GB"),
    ("NVIDIA GeForce RTX 4060", "RTX4060-8GB"),
    ("NVIDIA RTX A4500", "RTXA4500-20GB"),
    ("AMD Instinct MI250X/MI250", "MI250X-64GB"),  # torch's name for one GCD of either card
    ("AMD Instinct MI210", "MI210-64GB"),
    # short forms in papers, READMEs and benchmark tables
    ("GeForce RTX 4090", "RTX4090-24GB"),
    ("RTX 3090", "RTX3090-24GB"),
    ("rtx3090", "RTX3090-24GB"),
    ("3090", "RTX3090-24GB"),
    ("RTX-4090", "RTX4090-24GB"),
    ("A6000", "RTXA6000-48GB"),
    ("RTX-A6000", "RTXA6000-48GB"),
    ("RTX 6000 Ada Generation", "RTX6000ADA-48GB"),
    ("RTX 6000 Ada", "RTX6000ADA-48GB"),
    ("V100 32GB", "V100-32GB-SXM2"),  # form factor unstated: the SXM part, as a100/h100 do
    ("V100 16GB", "V100-16GB-SXM2"),
    ("A100 (80GB)", "A100-80GB-SXM"),
    ("A100-SXM4-80GB", "A100-80GB-SXM"),
    ("A100", "A100-80GB-SXM"),  # as before: the paper's A100 80GB
    ("h100", "H100-80GB-SXM"),
    ("T4", "T4-16GB"),
]


@pytest.mark.parametrize(("typed", "canonical"), SPELLINGS)
def test_source_spellings_resolve(typed: str, canonical: str) -> None:
    assert resolve_gpu_name(typed).gpu.name == canonical
    assert resolve_gpu_name(typed.upper()).gpu.name == canonical
    assert resolve_gpu_name(typed.lower()).gpu.name == canonical


AMBIGUOUS = [  # (name, every candidate the error must name)
    ("V100", ("V100-16GB-SXM2", "V100-32GB-SXM2", "V100-16GB-PCIE", "V100-32GB-PCIE")),  # 16 or 32 GB decides OOM
    ("Tesla V100-SXM2", ("V100-16GB-SXM2", "V100-32GB-SXM2")),
    ("V100-PCIE", ("V100-16GB-PCIE", "V100-32GB-PCIE")),
    ("GH200", ("GH200-96GB", "GH200-141GB")),
    ("RTX 6000", ("Quadro RTX 6000", "RTX6000ADA-48GB")),  # the Turing card is not the Ada card
    ("Quadro RTX 6000", ("Quadro RTX 6000", "RTX6000ADA-48GB")),
    ("NVIDIA GeForce RTX 3080", ("RTX 3080 12GB", "RTX3080-10GB")),  # nvidia-smi prints this for 10 and 12 GB
    ("NVIDIA GeForce RTX 3060", ("RTX 3060 8GB", "RTX3060-12GB")),
    ("NVIDIA GeForce RTX 4060 Ti", ("RTX 4060 Ti 8GB", "RTX4060TI-16GB")),
    ("NVIDIA GeForce RTX 2080", ("the RTX 2080 (8 GB", "RTX2080TI-11GB")),  # not the Ti by prefix
]


@pytest.mark.parametrize(("typed", "candidates"), AMBIGUOUS, ids=[a[0] for a in AMBIGUOUS])
def test_ambiguous_names_are_errors_naming_candidates(typed: str, candidates: tuple[str, ...]) -> None:
    with pytest.raises(TunecostError, match=f"^ambiguous GPU {re.escape(repr(typed))}") as info:
        resolve_gpu_name(typed)
    for candidate in candidates:
        assert candidate in str(info.value)


def test_turing_rtx_6000_never_resolves_to_the_ada_card() -> None:
    for typed in ("RTX 6000", "Quadro RTX 6000", "rtx6000", "NVIDIA Quadro RTX 6000"):
        with pytest.raises(TunecostError, match="Turing"):
            resolve_gpu_name(typed)


def test_other_cards_are_unknown_not_a_near_card() -> None:
    for typed in ("RTX 4070 SUPER", "Tesla V100S-PCIE-32GB", "RTX 3070 Ti", "RTX PRO 6000 Blackwell Max-Q"):
        with pytest.raises(TunecostError, match="^unknown GPU"):
            resolve_gpu_name(typed)


def test_normalized_aliases_point_at_one_card_unless_meant_to_be_ambiguous() -> None:
    owners: dict[str, set[str]] = defaultdict(set)
    for gpu in gpu_catalog().values():
        for alias in (gpu.name, *gpu.aliases):
            owners[normalize_gpu_name(alias)].add(gpu.name)
    shared = {key for key, names in owners.items() if len(names) > 1}
    assert shared == {"v100", "v100sxm2", "v100pcie", "gh200"}  # the ambiguous names above, on purpose


def test_bf16_support_follows_architecture() -> None:
    assert not get_gpu("T4").supports_bf16  # Turing
    assert not get_gpu("TITAN RTX").supports_bf16  # Turing
    assert not get_gpu("V100 32GB").supports_bf16  # Volta
    assert get_gpu("RTX3090").supports_bf16
    assert get_gpu("A100").supports_bf16


def test_vendor_column() -> None:
    assert get_gpu("MI300X").vendor == "AMD"
    assert {g.vendor for g in gpu_catalog().values()} == {"NVIDIA", "AMD"}


def test_every_catalog_gpu_has_achieved_rates() -> None:
    assert set(achieved_catalog()) == set(gpu_catalog())


def _achieved_rows() -> list[dict[str, str]]:
    lines = [line for line in GPU_ACHIEVED_PATH.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


@pytest.mark.parametrize("row", _achieved_rows(), ids=lambda r: r["name"])
def test_assumed_matmul_rates_follow_their_stated_arithmetic(row: dict[str, str]) -> None:
    # "assumed: datasheet P x E (...)": P is the catalog's bf16 peak and the value is P x E to within 0.1 TFLOP/s;
    # E is one of the measured efficiencies the data README cites (A100 PCIe 256.4/312, H100 SXM 792.1/989; for
    # CDNA2, one MI250X GCD 147.0/191.5; for GeForce cards, their generation's RTX 4090, 3090 or 5090)
    match = re.match(r"assumed: datasheet (?:FP16 )?([\d.]+) x ([\d.]+)", row["source_matmul"])
    if match is None:
        return
    peak, efficiency = float(match[1]), float(match[2])
    assert peak * 1e12 == pytest.approx(get_gpu(row["name"]).bf16_tensor_flops_per_s)
    # the A100 PCIe, H100 SXM, MI250X GCD, RTX 4090, RTX 3090 and RTX 5090 measured ones
    measured = (256.4 / 312, 792.1 / 989, 147.0 / 191.5, 178.5 / 165, 76.7 / 71.2, 236.0 / 209.5)
    assert efficiency in {round(e, 3) for e in measured}
    assert float(row["matmul_tflops"]) == pytest.approx(peak * efficiency, abs=0.1)


GEFORCE = re.compile(r"^RTX\d{4}")
# A GeForce card's datasheet rate is at its rated boost clock, which GPU Boost exceeds: measured torch.mm maxima of
# the RTX 3080 Ti, 3090, 4090 and 5090 are 8-13 % above it (catalog/data/README.md, gpu_achieved.csv).
GEFORCE_BOOST_HEADROOM = 1.15


@pytest.mark.parametrize("gpu", list(gpu_catalog().values()), ids=lambda g: g.name)
def test_achieved_never_exceeds_datasheet(gpu) -> None:
    rates = achieved_catalog()[gpu.name]
    headroom = GEFORCE_BOOST_HEADROOM if GEFORCE.match(gpu.name) else 1.0
    assert rates.matmul_flops_per_s <= headroom * gpu.bf16_tensor_flops_per_s
    assert rates.memory_bytes_per_s <= gpu.mem_bandwidth_bytes_per_s


def test_validate_rows_resolve_source_spellings_and_skip_ambiguous_ones() -> None:
    from tunecost.validate.mapping import catalog_gpu

    assert catalog_gpu("NVIDIA GeForce RTX 3090").name == "RTX3090-24GB"
    assert catalog_gpu("Tesla V100-SXM2-32GB").name == "V100-32GB-SXM2"
    assert catalog_gpu("RTX-A6000").name == "RTXA6000-48GB"
    assert catalog_gpu("V100") is None  # ambiguous: the row is skipped, not modelled on a guessed card
    assert catalog_gpu("RTX 6000") is None
