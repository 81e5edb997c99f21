"""Catalogs as data: GPUs (datasheet specs) and prices (dated, sourced); models are `tunecost.models.catalog`."""

from tunecost.catalog.gpus import GPU, get_gpu, gpu_catalog, resolve_gpu_name
from tunecost.catalog.prices import Price, price_catalog, prices_for

__all__ = [
    "GPU",
    "Price",
    "get_gpu",
    "gpu_catalog",
    "price_catalog",
    "prices_for",
    "resolve_gpu_name",
]
