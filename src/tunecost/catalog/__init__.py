"""Catalogs as data: GPUs (datasheet specs) and prices (dated, sourced), one module each; models are
`tunecost.models.catalog`."""
