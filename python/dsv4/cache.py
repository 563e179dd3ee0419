"""Cache layouts: page-size arithmetic, allocation, exact quantize/dequantize helpers, conversions, block allocator.

Every cache is allocated as ``[num_blocks, ...]`` with a page stride (``stride(0)``) of the raw page size
rounded up: MODEL1, V32 and the indexer K cache to a multiple of 576 bytes, page-split V4.1 caches to a
multiple of 512 (as vLLM and SGLang pad them), per-token V4.1 caches not at all (as FlashMLA upstream).
Kernels always honour ``stride(0)``, so views into a larger pooled allocation work as well. Byte layouts
are specified in :mod:`dsv4.reference.quant`.

Records (``layout``): ``model1`` (584 B, DeepSeek-V4.0), ``v32`` (656 B, V3.2), ``v41_fp8`` (528 B) and
``v41_fp4`` (288 B, extra caches only) of DeepSeek-V4.1. Placements of the V4.1 records: ``page_split`` (a
page's data rows, then its scale rows; vLLM's and SGLang's) and ``per_token`` (each entry's scales after its
data; FlashMLA upstream's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .constants import (
    CACHE_ALIGNMENT,
    INDEXER_HEAD_DIM,
    INDEXER_K_BYTES_PER_ENTRY,
    INDEXER_K_FP4_BYTES_PER_ENTRY,
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_HEAD_DIM,
    V32_BYTES_PER_TOKEN,
    V32_HEAD_DIM,
    V41_FP4_BYTES_PER_TOKEN,
    V41_FP8_BYTES_PER_TOKEN,
    V41_HEAD_DIM,
    V41_PAGE_ALIGNMENT,
)
from .reference.quant import RECORDS, indexer_k_pack, indexer_key_pack
from .reference.quant import convert_placement as _reference_convert_placement

KV_LAYOUTS = {"model1": MODEL1_BYTES_PER_TOKEN, "v32": V32_BYTES_PER_TOKEN, "v41_fp8": V41_FP8_BYTES_PER_TOKEN,
              "v41_fp4": V41_FP4_BYTES_PER_TOKEN}
KV_HEAD_DIMS = {"model1": MODEL1_HEAD_DIM, "v32": V32_HEAD_DIM, "v41_fp8": V41_HEAD_DIM, "v41_fp4": V41_HEAD_DIM}
V41_LAYOUTS = ("v41_fp8", "v41_fp4")
PLACEMENTS = ("page_split", "per_token")
# FlashMLA's k_cache.shape[-1] -> the record it names
LAYOUT_OF_ENTRY_BYTES = {bytes_: layout for layout, bytes_ in KV_LAYOUTS.items()}
FP32_BYTES = 4
# Indexer K entries: key format -> bytes per entry (fp8: 128 e4m3 + fp32 scale; mxfp4: 64 B e2m1 + 4 UE8M0)
INDEXER_KEY_FORMATS = {"fp8": INDEXER_K_BYTES_PER_ENTRY, "mxfp4": INDEXER_K_FP4_BYTES_PER_ENTRY}
# DeepGEMM's kv_cache.shape[-1] -> the key format it names
INDEXER_KEY_FORMAT_OF_ENTRY_BYTES = {bytes_: name for name, bytes_ in INDEXER_KEY_FORMATS.items()}


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


def _check_layout(layout: str, placement: str = "page_split") -> None:
    if layout not in KV_LAYOUTS:
        raise ValueError(f"unknown KV layout {layout!r}; supported: {sorted(KV_LAYOUTS)}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; supported: {PLACEMENTS}")


def kv_page_bytes(block_size: int, layout: str = "model1", placement: str = "page_split") -> int:
    """Padded page bytes of a KV cache of ``layout`` records (MODEL1 584 B/token, V32 656, V4.1 fp8 528, V4.1 fp4
    288): V4.1 pages padded to a multiple of 512 bytes when page-split, unpadded when per-token; the others to 576."""
    _check_geometry(None, block_size)
    _check_layout(layout, placement)
    if layout in V41_LAYOUTS:
        alignment = V41_PAGE_ALIGNMENT if placement == "page_split" else 1
        return aligned_page_bytes(block_size, KV_LAYOUTS[layout], alignment)
    return aligned_page_bytes(block_size, KV_LAYOUTS[layout])


def _check_key_format(key_format: str) -> None:
    if key_format not in INDEXER_KEY_FORMATS:
        raise ValueError(f"unknown indexer key format {key_format!r}; supported: {sorted(INDEXER_KEY_FORMATS)}")


def indexer_k_page_bytes(block_size: int = 64, key_format: str = "fp8") -> int:
    """Padded page bytes of the indexer K cache (``fp8`` 132 B/entry, ``mxfp4`` 68 B/entry), padded alike."""
    _check_geometry(None, block_size)
    _check_key_format(key_format)
    return aligned_page_bytes(block_size, INDEXER_KEY_FORMATS[key_format])


def compressor_coff(compress_ratio: int) -> int:
    """Overlapping windows (2 projection halves) for ratio 4, a single window otherwise."""
    return 2 if compress_ratio == 4 else 1


def compressor_state_row_floats(head_dim: int, compress_ratio: int) -> int:
    """fp32 row ``[kv | score + ape]`` of ``2 * coff * head_dim`` floats."""
    return 2 * compressor_coff(compress_ratio) * head_dim


def compressor_state_page_bytes(block_size: int, head_dim: int, compress_ratio: int) -> int:
    return aligned_page_bytes(block_size, compressor_state_row_floats(head_dim, compress_ratio) * FP32_BYTES)


def allocate_kv_cache(num_blocks: int, block_size: int, layout: str = "model1", device=None,
                      placement: str = "page_split") -> torch.Tensor:
    """uint8 ``[num_blocks, page_bytes]`` cache of ``layout`` records in ``placement`` (zero-filled)."""
    _check_geometry(num_blocks, block_size)
    return torch.zeros(num_blocks, kv_page_bytes(block_size, layout, placement), dtype=torch.uint8, device=device)


def allocate_indexer_k_cache(num_blocks: int, block_size: int = 64, device=None,
                             key_format: str = "fp8") -> torch.Tensor:
    """uint8 ``[num_blocks, page_bytes]`` indexer K cache of ``key_format`` entries (zero-filled)."""
    _check_geometry(num_blocks, block_size)
    return torch.zeros(num_blocks, indexer_k_page_bytes(block_size, key_format), dtype=torch.uint8, device=device)


def allocate_compressor_state(
    num_blocks: int, block_size: int, head_dim: int, compress_ratio: int, device=None
) -> torch.Tensor:
    """fp32 ``[num_blocks, block_size, 2*coff*head_dim]`` state cache with a 576-byte-aligned page stride."""
    _check_geometry(num_blocks, block_size)
    row = compressor_state_row_floats(head_dim, compress_ratio)
    page_floats = compressor_state_page_bytes(block_size, head_dim, compress_ratio) // FP32_BYTES
    pages = torch.zeros(num_blocks, page_floats, dtype=torch.float32, device=device)
    return pages[:, : block_size * row].view(num_blocks, block_size, row)


def quantize_kv(kv: torch.Tensor, layout: str = "model1", rule: str = "flashmla") -> torch.Tensor:
    """Exact cache entries of rows ``kv`` as one token's bytes: data then scales (MODEL1 ``[N, 584]``, V32
    ``[N, 656]``, V4.1 fp8 ``[N, 528]``, V4.1 fp4 ``[N, 288]``). ``rule``: the V4.1 fp8 scale rule
    (``flashmla``, what the kernels write, or ``vllm``; :func:`dsv4.reference.quant.v41_fp8_pack`)."""
    _check_layout(layout)
    pack = RECORDS[layout][3]
    data, scales = pack(kv, rule) if layout == "v41_fp8" else pack(kv)
    return torch.cat([data, scales], dim=1)


def dequantize_kv(entries: torch.Tensor, layout: str = "model1") -> torch.Tensor:
    """float32 rows of entries produced by :func:`quantize_kv`."""
    _check_layout(layout)
    data_bytes = RECORDS[layout][1]
    return RECORDS[layout][4](entries[:, :data_bytes], entries[:, data_bytes:])


def convert_placement(cache: torch.Tensor, block_size: int, layout: str, src: str, dst: str) -> torch.Tensor:
    """A V4.1 cache's pages in the other placement (a byte permutation per page, on the cache's device): returns a
    fresh ``[num_blocks, kv_page_bytes(block_size, layout, dst)]`` uint8 cache."""
    _check_layout(layout, src)
    _check_layout(layout, dst)
    out = allocate_kv_cache(cache.shape[0], block_size, layout, cache.device, dst)
    pages = _page_bytes(cache)[:, : min(out.shape[1], _page_bytes(cache).shape[1])]
    padded = torch.zeros(cache.shape[0], max(out.shape[1], pages.shape[1]), dtype=torch.uint8, device=cache.device)
    padded[:, : pages.shape[1]] = pages
    converted = _reference_convert_placement(padded, block_size, layout, src, dst)
    out.copy_(converted[:, : out.shape[1]])
    return out


def convert_kv_cache(cache: torch.Tensor, block_size: int, src_layout: str, dst_layout: str,
                     src_placement: str = "page_split", dst_placement: str = "page_split") -> torch.Tensor:
    """Every entry of a cache re-quantized into another record (e.g. V4.0's 584-byte MODEL1 into V4.1's 528-byte fp8,
    or back), by the kernels of the cache's device: each entry is read to its exact bf16 values
    (``dequantize_kv_gather``) and written by ``quantize_kv_insert``. Returns a fresh cache with the same blocks.
    Values survive where the target record can hold them: MODEL1 -> V4.1 fp8 keeps the NoPE dims exactly and
    rounds the bf16 RoPE dims to e4m3; V4.1 fp8 -> MODEL1 keeps every value whose code the wider 64-dim tile still
    represents."""
    _check_layout(src_layout, src_placement)
    _check_layout(dst_layout, dst_placement)
    if KV_HEAD_DIMS[src_layout] != KV_HEAD_DIMS[dst_layout]:
        raise ValueError(f"records {src_layout} and {dst_layout} hold different head dims "
                         f"({KV_HEAD_DIMS[src_layout]} and {KV_HEAD_DIMS[dst_layout]})")
    from . import ops  # the kernels (dsv4.cache itself is importable without the extension)

    slots = torch.arange(cache.shape[0] * block_size, device=cache.device)
    rows = ops.dequantize_kv_gather(cache, slots, block_size, layout=src_layout, placement=src_placement)
    out = allocate_kv_cache(cache.shape[0], block_size, dst_layout, cache.device, dst_placement)
    ops.quantize_kv_insert(rows, slots, out, block_size, layout=dst_layout, placement=dst_placement)
    return out


def _page_bytes(cache: torch.Tensor) -> torch.Tensor:
    flat = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    return flat.reshape(flat.shape[0], -1)


def quantize_indexer_k(k: torch.Tensor, key_format: str = "fp8") -> tuple[torch.Tensor, torch.Tensor]:
    """Indexer K rows ``[N, 128]`` -> ``fp8``: (e4m3 codes uint8 ``[N, 128]``, power-of-two fp32 scales ``[N]``);
    ``mxfp4``: (e2m1 pairs uint8 ``[N, 64]``, UE8M0 bytes uint8 ``[N, 4]``). Values are bf16-rounded first."""
    if k.shape[-1] != INDEXER_HEAD_DIM:
        raise ValueError(f"indexer K rows must have {INDEXER_HEAD_DIM} dims, got {tuple(k.shape)}")
    _check_key_format(key_format)
    if key_format == "mxfp4":
        return indexer_key_pack(k, key_format)
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
