"""FlashMLA-compatible sparse attention API (``import dsv4.flash_mla as flash_mla``).

Same Python signatures and return conventions as FlashMLA's ``get_mla_metadata``, ``FlashMLASchedMeta``,
``flash_mla_with_kvcache`` (sparse decode) and ``flash_mla_sparse_fwd`` (sparse prefill), backed by
``torch.ops.dsv4.sparse_mla_decode`` / ``sparse_mla_prefill``. KV caches are FlashMLA's 4-D byte views
``[num_blocks, page_block_size, 1, bytes_per_token]``; as FlashMLA does, the last dimension names the record:
584 bytes MODEL1 (DeepSeek-V4.0, d_qk 512), 656 V32 (d_qk 576), 528 V4.1 fp8 and 288 V4.1 fp4 (extra cache only,
beside a 528-byte main cache). The V4.1 records are read in FlashMLA upstream's per-token placement (each entry's
scales after its data) unless ``kv_placement="page_split"`` (a page's data rows, then its scale rows: what vLLM,
SGLang and FlashMLA's 2026-09-10 release write). Only ``stride(0)`` is free. Dense (non-sparse) attention is not
implemented.

As in FlashMLA, a schedule object records its configuration on first use and every later call with it must
have the same configuration; otherwise :class:`ScheduleMismatchError` (an ``AssertionError``, what
FlashMLA's asserts raise, and a ``ValueError``) is raised. On CUDA the first call also plans the split of the
work on the device (``dsv4.ops.sparse_mla_decode_schedule``) and later calls reuse that plan, as FlashMLA's do:
like FlashMLA's, a plan is valid for the lengths it was made with (one decode step). The CPU kernels balance
their own work, so there the plan tensors stay None; only the configuration is checked.
"""

from __future__ import annotations

import dataclasses

import torch

from . import ops
from .cache import LAYOUT_OF_ENTRY_BYTES

HEAD_DIM_V = 512
KV_PLACEMENTS = ("per_token", "page_split")  # FlashMLA upstream's V4.1 placement first: the default
SPARSE_ONLY = "dsv4.flash_mla implements FlashMLA's sparse attention only (pass indices)"


class ScheduleMismatchError(AssertionError, ValueError):
    """A FlashMLASchedMeta reused with a configuration other than the one it was planned for."""


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's schedule object: planned by the first ``flash_mla_with_kvcache`` call that uses it."""

    @dataclasses.dataclass(frozen=True)
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: int | None
        extra_page_block_size: int | None
        extra_topk: int | None

    have_initialized: bool = False
    config: Config | None = None
    tile_scheduler_metadata: torch.Tensor | None = None  # int32 [num_sm_parts, 8] on GPUs; None on CPU
    num_splits: torch.Tensor | None = None  # int32 [b + 1] on GPUs; None on CPU


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """A fresh, unplanned schedule object and None (the arguments are ignored, as in FlashMLA)."""
    return FlashMLASchedMeta(), None


def _check_schedule(sched_meta: FlashMLASchedMeta, config: FlashMLASchedMeta.Config) -> None:
    if not sched_meta.have_initialized:
        sched_meta.have_initialized = True
        sched_meta.config = config
        return
    for field in dataclasses.fields(config):
        planned, given = getattr(sched_meta.config, field.name), getattr(config, field.name)
        if planned != given:
            raise ScheduleMismatchError(
                f"flash_mla_with_kvcache: sched_meta was planned for {field.name}={planned}, got {given}; a "
                f"schedule object must be used with the same configuration in every call (create a new one with "
                f"get_mla_metadata)")


def _kv_cache_view(name: str, cache: torch.Tensor) -> int:
    """Page size of a FlashMLA 4-D cache view ``[num_blocks, page_block_size, 1, bytes]``."""
    if cache.dim() != 4 or cache.shape[2] != 1:
        raise ValueError(f"flash_mla_with_kvcache: {name} must be [num_blocks, page_block_size, 1, bytes_per_token] "
                         f"(h_k = 1), got shape {list(cache.shape)}")
    return cache.shape[1]


def _record(name: str, cache: torch.Tensor) -> str:
    """The record a FlashMLA cache view holds, from its last dimension."""
    record = LAYOUT_OF_ENTRY_BYTES.get(cache.shape[-1])
    if record is None:
        raise ValueError(f"flash_mla_with_kvcache: {name} bytes_per_token (last dimension) must be one of "
                         f"{sorted(LAYOUT_OF_ENTRY_BYTES)} (584 MODEL1, 656 V32, 528 V4.1 fp8, 288 V4.1 fp4), "
                         f"got {cache.shape[-1]}")
    return record


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    kv_placement: str = "per_token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA sparse decode: one softmax over the main and extra index sets, plus the sink.

    k_cache / extra_k_cache: fp8 caches ``[num_blocks, page_block_size, 1, bytes_per_token]`` (the page block size
    comes from dimension 1, the record from dimension 3: 584, 656, 528 or 288 bytes; pairs (584, 584), (656, 656),
    (528, 528), (528, 288)); ``kv_placement``: where the V4.1 records keep their scales (``per_token``, FlashMLA
    upstream's, or ``page_split``, vLLM's); indices / extra_indices_in_kvcache: slot ids
    ``block * page_block_size + offset``.
    block_table and cache_seqlens are ignored in sparse mode (may be None); out, when given, receives the output.
    Everything else (shapes, which entries are skipped, out and lse, the sink, NaN and empty rules):
    :func:`dsv4.reference.sparse_mla.sparse_mla_decode`, the one contract of this op.
    """
    if not isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        raise TypeError(f"flash_mla_with_kvcache: tile_scheduler_metadata must be the FlashMLASchedMeta from "
                        f"get_mla_metadata, got {type(tile_scheduler_metadata).__name__}")
    if num_splits is not None:
        raise ValueError("flash_mla_with_kvcache: num_splits must be None (the schedule object holds the plan)")
    if indices is None:
        raise NotImplementedError(f"flash_mla_with_kvcache: dense attention is not implemented; {SPARSE_ONLY}")
    if causal:
        raise ValueError("flash_mla_with_kvcache: causal must be False when sparse attention is enabled")
    if not is_fp8_kvcache:
        raise ValueError("flash_mla_with_kvcache: is_fp8_kvcache must be True when sparse attention is enabled")
    if kv_placement not in KV_PLACEMENTS:
        raise ValueError(f"flash_mla_with_kvcache: kv_placement must be one of {KV_PLACEMENTS}, got {kv_placement!r}")
    extra_given = extra_k_cache is not None
    config = FlashMLASchedMeta.Config(
        b=q.shape[0], s_q=q.shape[1], h_q=q.shape[2], page_block_size=_kv_cache_view("k_cache", k_cache),
        h_k=k_cache.shape[2], causal=causal, is_fp8_kvcache=is_fp8_kvcache, topk=indices.shape[-1],
        extra_page_block_size=_kv_cache_view("extra_k_cache", extra_k_cache) if extra_given else None,
        extra_topk=extra_indices_in_kvcache.shape[-1] if extra_indices_in_kvcache is not None else None)
    layout = _record("k_cache", k_cache)
    extra_layout = _record("extra_k_cache", extra_k_cache) if extra_given else layout
    sched = tile_scheduler_metadata
    _check_schedule(sched, config)
    if q.device.type != "cpu" and sched.tile_scheduler_metadata is None:
        sched.tile_scheduler_metadata, sched.num_splits = ops.sparse_mla_decode_schedule(
            q, indices, topk_length, extra_indices_in_kvcache, extra_topk_length)
    result, lse = ops.sparse_mla_decode(
        q, k_cache, indices, config.page_block_size, topk_length=topk_length, attn_sink=attn_sink,
        extra_kv_cache=extra_k_cache, extra_indices=extra_indices_in_kvcache, extra_topk_length=extra_topk_length,
        extra_block_size=config.extra_page_block_size or 0, head_dim_v=head_dim_v, sm_scale=softmax_scale,
        tile_scheduler_metadata=sched.tile_scheduler_metadata, num_splits=sched.num_splits, layout=layout,
        extra_layout=extra_layout, placement=kv_placement)
    if out is None:
        return result, lse
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ValueError(f"flash_mla_with_kvcache: out must be bf16 {list(result.shape)}, got {out.dtype} "
                         f"{list(out.shape)}")
    out.copy_(result)
    return out, lse


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = HEAD_DIM_V,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA sparse prefill on bf16 kv.

    q: bf16 ``[s_q, h_q, d_qk]``; kv: bf16 ``[s_kv, 1, d_qk]``; indices: int32 (or int64) ``[s_q, 1, topk]``
    rows of kv (< 0, >= s_kv and columns at or past ``topk_length[s]`` (int ``[s_q]``) are skipped);
    attn_sink: fp32 ``[h_q]``. Returns out bf16 ``[s_q, h_q, d_v]``, max_logits and natural-log lse fp32
    ``[s_q, h_q]`` (a row with no valid index: out 0, max_logits -inf, lse +inf; a NaN score: all three NaN).
    """
    return ops.sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
