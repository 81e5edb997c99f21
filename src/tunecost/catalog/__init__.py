"""Catalogs as data: GPUs (datasheet specs), prices (dated, sourced) and models (configs), one module each."""
