"""Cache layouts: page-size arithmetic, allocation, exact quantize/dequantize helpers, block allocator.

Every cache is allocated as ``[num_blocks, ...]`` whose page stride (``stride(0)``) is the raw page
size rounded up to a multiple of 576 bytes; kernels always honour ``stride(0)``, so views into a
larger pooled allocation work as well. Byte layouts are specified in :mod:`dsv4.reference.quant`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .constants import (
    CACHE_ALIGNMENT,
    INDEXER_HEAD_DIM,
    INDEXER_K_BYTES_PER_ENTRY,
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_HEAD_DIM,
    V32_BYTES_PER_TOKEN,
    V32_HEAD_DIM,
)
from .reference.quant import (
    indexer_k_pack,
    model1_pack,
    model1_unpack,
    v32_pack,
    v32_unpack,
)

KV_LAYOUTS = {"model1": MODEL1_BYTES_PER_TOKEN, "v32": V32_BYTES_PER_TOKEN}
KV_HEAD_DIMS = {"model1": MODEL1_HEAD_DIM, "v32": V32_HEAD_DIM}
FP32_BYTES = 4


def aligned_page_bytes(entries_per_page: int, bytes_per_entry: int, alignment: int = CACHE_ALIGNMENT) -> int:
    """Raw page size rounded up to a multiple of ``alignment`` bytes."""
    if entries_per_page <= 0 or bytes_per_entry <= 0:
        raise ValueError(f"page geometry must be positive, got {entries_per_page} x {bytes_per_entry} bytes")
    return math.ceil(entries_per_page * bytes_per_entry / alignment) * alignment


def _check_geometry(num_blocks: int | None, block_size: int) -> None:
    """Names the argument a cache allocation cannot take (before torch would say it in its own words)."""
    if num_blocks is not None and (not isinstance(num_blocks, int) or num_blocks < 0):
        raise ValueError(f"num_blocks must be an int >= 0, got {num_blocks!r}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size (tokens per page) must be an int >= 1, got {block_size!r}")


def kv_page_bytes(block_size: int, layout: str = "model1") -> int:
    """Padded page bytes of a MODEL1 (584 B/token) or V32 (656 B/token) KV cache."""
    _check_geometry(None, block_size)
    if layout not in KV_LAYOUTS:
        raise ValueError(f"unknown KV layout {layout!r}; supported: {sorted(KV_LAYOUTS)}")
    return aligned_page_bytes(block_size, KV_LAYOUTS[layout])


def indexer_k_page_bytes(block_size: int = 64) -> int:
    """Padded page bytes of the indexer K cache (132 B/entry)."""
    _check_geometry(None, block_size)
    return aligned_page_bytes(block_size, INDEXER_K_BYTES_PER_ENTRY)


def compressor_coff(compress_ratio: int) -> int:
    """Overlapping windows (2 projection halves) for ratio 4, a single window otherwise."""
    return 2 if compress_ratio == 4 else 1


def compressor_state_row_floats(head_dim: int, compress_ratio: int) -> int:
    """fp32 row ``[kv | score + ape]`` of ``2 * coff * head_dim`` floats."""
    return 2 * compressor_coff(compress_ratio) * head_dim


def compressor_state_page_bytes(block_size: int, head_dim: int, compress_ratio: int) -> int:
    return aligned_page_bytes(block_size, compressor_state_row_floats(head_dim, compress_ratio) * FP32_BYTES)


def allocate_kv_cache(num_blocks: int, block_size: int, layout: str = "model1", device=None) -> torch.Tensor:
    """uint8 ``[num_blocks, page_bytes]`` MODEL1 or V32 cache (zero-filled)."""
    _check_geometry(num_blocks, block_size)
    return torch.zeros(num_blocks, kv_page_bytes(block_size, layout), dtype=torch.uint8, device=device)


def allocate_indexer_k_cache(num_blocks: int, block_size: int = 64, device=None) -> torch.Tensor:
    """uint8 ``[num_blocks, page_bytes]`` indexer K cache (zero-filled)."""
    _check_geometry(num_blocks, block_size)
    return torch.zeros(num_blocks, indexer_k_page_bytes(block_size), dtype=torch.uint8, device=device)


def allocate_compressor_state(
    num_blocks: int, block_size: int, head_dim: int, compress_ratio: int, device=None
) -> torch.Tensor:
    """fp32 ``[num_blocks, block_size, 2*coff*head_dim]`` state cache with a 576-byte-aligned page stride."""
    _check_geometry(num_blocks, block_size)
    row = compressor_state_row_floats(head_dim, compress_ratio)
    page_floats = compressor_state_page_bytes(block_size, head_dim, compress_ratio) // FP32_BYTES
    pages = torch.zeros(num_blocks, page_floats, dtype=torch.float32, device=device)
    return pages[:, : block_size * row].view(num_blocks, block_size, row)


def quantize_kv(kv: torch.Tensor, layout: str = "model1") -> torch.Tensor:
    """Exact cache entries of rows ``kv``: MODEL1 -> ``[N, 584]`` (576 data + 8 scale bytes as stored
    for one token), V32 -> ``[N, 656]``."""
    if layout == "model1":
        data, scales = model1_pack(kv)
        return torch.cat([data, scales], dim=1)
    if layout == "v32":
        return v32_pack(kv)
    raise ValueError(f"unknown KV layout {layout!r}; supported: {sorted(KV_LAYOUTS)}")


def dequantize_kv(entries: torch.Tensor, layout: str = "model1") -> torch.Tensor:
    """float32 rows of entries produced by :func:`quantize_kv`."""
    if layout == "model1":
        data_bytes = MODEL1_BYTES_PER_TOKEN - 8
        return model1_unpack(entries[:, :data_bytes], entries[:, data_bytes:])
    if layout == "v32":
        return v32_unpack(entries)
    raise ValueError(f"unknown KV layout {layout!r}; supported: {sorted(KV_LAYOUTS)}")


def quantize_indexer_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indexer K rows ``[N, 128]`` -> (e4m3 codes uint8 ``[N, 128]``, power-of-two fp32 scales ``[N]``)."""
    if k.shape[-1] != INDEXER_HEAD_DIM:
        raise ValueError(f"indexer K rows must have {INDEXER_HEAD_DIM} dims, got {tuple(k.shape)}")
    return indexer_k_pack(k)


@dataclass
class BlockAllocator:
    """A free-list page allocator with one block table per request (slot = block * block_size + offset)."""

    num_blocks: int
    block_size: int
    _free: list[int] = field(init=False)
    _tables: dict[int, list[int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._free = list(range(self.num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def ensure_capacity(self, request_id: int, num_tokens: int) -> list[int]:
        """Grows the request's table to hold ``num_tokens`` entries; returns the table."""
        table = self._tables.setdefault(request_id, [])
        needed = math.ceil(num_tokens / self.block_size) - len(table)
        if needed > len(self._free):
            raise RuntimeError(f"out of cache blocks: request {request_id} needs {needed}, {len(self._free)} free")
        table.extend(self._free.pop() for _ in range(max(needed, 0)))
        return table

    def free(self, request_id: int) -> None:
        self._free.extend(reversed(self._tables.pop(request_id, [])))

    def block_table(self, request_ids: list[int], max_blocks: int | None = None) -> torch.Tensor:
        """int32 ``[len(request_ids), max_blocks]``, padded with -1."""
        tables = [self._tables.get(r, []) for r in request_ids]
        width = max_blocks if max_blocks is not None else max((len(t) for t in tables), default=0)
        out = torch.full((len(request_ids), width), -1, dtype=torch.int32)
        for i, table in enumerate(tables):
            out[i, : min(len(table), width)] = torch.tensor(table[:width], dtype=torch.int32)
        return out

    def slot_mapping(self, request_id: int, positions: torch.Tensor) -> torch.Tensor:
        """int64 slots of the request's entries at ``positions`` (-1 where no block is allocated)."""
        table = torch.tensor(self._tables.get(request_id, []), dtype=torch.int64)
        block = positions.long() // self.block_size
        ok = (positions >= 0) & (block < table.numel())
        pages = table[block.clamp(0, max(table.numel() - 1, 0))] if table.numel() else torch.zeros_like(block)
        return torch.where(ok, pages * self.block_size + positions.long() % self.block_size, -1)
