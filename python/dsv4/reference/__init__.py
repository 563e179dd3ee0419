"""Pure-PyTorch references: the executable specification of every dsv4 op (slow, obviously right)."""

from . import attention, indexer, quant, writers

__all__ = ["attention", "indexer", "quant", "writers"]
