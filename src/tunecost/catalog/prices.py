"""The price catalog: $ per GPU-hour per provider, each row dated and sourced.

Sources and derivations: docs/prices.md, section `tunecost.catalog.prices`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.catalog.gpus import gpu_catalog, resolve_gpu_name
from tunecost.errors import TunecostError, unknown_name_error

PRICE_CATALOG_PATH = Path(__file__).parent / "data" / "prices.csv"
_DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")
OWNED_PROVIDER = "owned"  # a provider name (any case) that marks the user's own GPUs


@dataclass(frozen=True, kw_only=True)
class Price:
    provider: str
    gpu: str  # canonical GPU name from the GPU catalog
    usd_per_gpu_hour: float
    date: str  # ISO date the source recorded the price
    source_url: str
    notes: str = ""
    gpus_per_unit: int = 1  # >1: rented only as whole nodes of this many GPUs

    @property
    def usd_per_unit_hour(self) -> float:
        """$ per hour of what the provider rents: one GPU, or one node."""
        return self.usd_per_gpu_hour * self.gpus_per_unit

    @property
    def owned(self) -> bool:
        """The user's own GPUs: provider "owned" (any case), or a price of exactly 0 $/GPU-hour."""
        return self.provider.lower() == OWNED_PROVIDER or self.usd_per_gpu_hour == 0


def load_prices(path: Path = PRICE_CATALOG_PATH) -> list[Price]:
    required = ("provider", "gpu", "usd_per_gpu_hour", "date", "source_url")
    prices = []
    for i, row in read_catalog_csv(path, required):
        usd = parse_float(path, i, "usd_per_gpu_hour", row["usd_per_gpu_hour"])
        if usd < 0:
            raise TunecostError(f"{path}: row {i}: usd_per_gpu_hour must be >= 0 (0: owned hardware), got {usd}")
        usd = abs(usd)  # -0 is 0
        if not _DATE.match(row["date"]):
            raise TunecostError(f"{path}: row {i}: date must be YYYY-MM-DD (or YYYY-MM), got {row['date']!r}")
        if not row["source_url"]:
            raise TunecostError(f"{path}: row {i}: every price needs a source_url")
        if not row["provider"]:
            raise TunecostError(f"{path}: row {i}: empty provider")
        unit = row.get("gpus_per_unit", "") or "1"
        if not unit.isdigit() or int(unit) < 1:
            raise TunecostError(f"{path}: row {i}: gpus_per_unit must be a whole number >= 1 (or blank), got {unit!r}")
        try:
            gpu = resolve_gpu_name(row["gpu"]).gpu.name
        except TunecostError as exc:
            raise TunecostError(f"{path}: row {i}: {exc}") from None
        prices.append(
            Price(
                provider=row["provider"],
                gpu=gpu,
                usd_per_gpu_hour=usd,
                date=row["date"],
                source_url=row["source_url"],
                notes=row.get("notes", ""),
                gpus_per_unit=int(unit),
            )
        )
    return prices


@lru_cache(maxsize=1)
def _builtin_prices() -> tuple[Price, ...]:
    return tuple(load_prices())


def price_catalog(extra: Path | None = None) -> list[Price]:
    """The built-in prices, with rows from `extra` overriding the same (provider, gpu, gpus_per_unit) and adding
    new ones."""
    merged = {(p.provider.lower(), p.gpu, p.gpus_per_unit): p for p in _builtin_prices()}
    if extra is not None:
        for p in load_prices(Path(extra)):
            merged[(p.provider.lower(), p.gpu, p.gpus_per_unit)] = p
    return list(merged.values())


def providers(prices: list[Price]) -> list[str]:
    return sorted({p.provider for p in prices})


def prices_for(
    gpu_name: str, prices: list[Price], provider: str | None = None, *, whole_nodes: bool = False
) -> list[Price]:
    """Prices of one GPU (canonical name), optionally from one provider (an unknown provider is an error),
    cheapest per GPU-hour first; node-priced rows only with `whole_nodes`."""
    wanted = None if provider is None else provider.lower()
    if provider is not None and wanted not in {p.provider.lower() for p in prices}:
        raise unknown_name_error("provider", provider, providers(prices))
    return sorted(
        (
            p
            for p in prices
            if p.gpu == gpu_name
            and (wanted is None or p.provider.lower() == wanted)  # "owned" and "Owned" rows are one provider
            and (whole_nodes or p.gpus_per_unit == 1)
        ),
        key=lambda p: p.usd_per_gpu_hour,
    )


def price_label(price: Price) -> str:
    """How a table names the row's provider: "owned" for the user's own GPUs (with their running cost when it is
    above 0, e.g. "owned ($0.12/GPU-h electricity)"), the provider's name otherwise."""
    if not price.owned:
        return price.provider
    usd = price.usd_per_gpu_hour
    if usd == 0:
        return OWNED_PROVIDER
    shown = f"{usd:.2f}" if usd >= 0.005 else f"{usd:.2g}"  # a cost under half a cent is not shown as $0.00
    return f"{OWNED_PROVIDER} (${shown}/GPU-h electricity)"


def billed_gpus(num_gpus: int, price: Price) -> int:
    """GPUs paid for when `num_gpus` are used at `price`: whole nodes for a node-priced row."""
    return -(-num_gpus // price.gpus_per_unit) * price.gpus_per_unit


def cheapest_for(num_gpus: int, prices: list[Price]) -> Price | None:
    """The price with the lowest hourly bill for `num_gpus` GPUs (per-GPU rows win ties)."""
    if not prices:
        return None
    return min(prices, key=lambda p: (billed_gpus(num_gpus, p) * p.usd_per_gpu_hour, p.gpus_per_unit))


def cheapest_price(gpu: str, *, provider: str | None = None, prices_file: Path | None = None) -> Price:
    """The cheapest catalog price of `gpu` (any name or alias), from `provider` if given; `prices_file` overrides
    or extends the catalog. No price is a `TunecostError`."""
    gpu_name = resolve_gpu_name(gpu).gpu.name
    found = prices_for(gpu_name, price_catalog(prices_file), provider)
    if not found:
        raise TunecostError(f"no price for {gpu_name}" + (f" from {provider}" if provider else "") + " in the catalog")
    return found[0]


__all__ = [
    "OWNED_PROVIDER",
    "Price",
    "billed_gpus",
    "cheapest_for",
    "cheapest_price",
    "gpu_catalog",
    "load_prices",
    "price_catalog",
    "price_label",
    "prices_for",
    "providers",
]
