"""Pure-PyTorch references: the executable specification of every dsv4 op (slow, obviously right)."""

from . import attention, compressor, indexer, layer, quant, writers

__all__ = ["attention", "compressor", "indexer", "layer", "quant", "writers"]
