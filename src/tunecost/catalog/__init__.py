"""Catalogs as data: GPUs (datasheet specs), prices (dated, sourced) and models (configs)."""

from tunecost.catalog.gpus import GPU, get_gpu, gpu_catalog, resolve_gpu_name
from tunecost.catalog.models import ModelSpec, model_catalog, resolve_model
from tunecost.catalog.prices import Price, price_catalog, prices_for

__all__ = [
    "GPU",
    "ModelSpec",
    "Price",
    "get_gpu",
    "gpu_catalog",
    "model_catalog",
    "price_catalog",
    "prices_for",
    "resolve_gpu_name",
    "resolve_model",
]
