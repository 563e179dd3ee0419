"""Typed wrappers of ``torch.ops.dsv4.*`` with their fake (meta) kernels.

Conventions used by every op:
- Paged caches are byte tensors (uint8, int8 or float8_e4m3fn) of shape ``[num_blocks, ...]``
  whose trailing dims are contiguous; only ``stride(0)`` (the page stride) is free, so 2-D
  ``[num_blocks, page_bytes]`` views and FlashMLA's ``[num_blocks, block_size, 1, bytes]`` views
  both work. ``block_size`` is the number of entries per page.
- Slot ids are ``physical_block * block_size + offset``; -1 means "skip". Writers raise on any
  other value outside the cache; readers treat it as invalid.
- Index tensors may be int32 or int64. RoPE tables are fp32 ``[max_position, 64]`` with cos in
  the first 32 columns and sin in the last 32 (GPT-J interleaved pairs).
"""

from __future__ import annotations

import torch

from .constants import INDEXER_HEAD_DIM, MODEL1_HEAD_DIM, V32_HEAD_DIM
from .reference import OP_IMPLS

_ops = torch.ops.dsv4

# Ops whose CPU kernel is missing in this build run their reference (none today; reported by build_info()).
REFERENCE_BACKED_CPU_OPS = frozenset(
    name for name in OP_IMPLS if not torch._C._dispatch_has_kernel_for_dispatch_key(f"dsv4::{name}", "CPU")
)

def _check_same_device(op: str, arg_names: tuple[str, ...], args: tuple, kwargs: dict) -> None:
    """Fake kernels enforce what the real ones do: every tensor argument on one device."""
    named = dict(zip(arg_names, args, strict=False))
    named.update(kwargs)
    tensors = [(name, value) for name, value in named.items() if isinstance(value, torch.Tensor)]
    for name, value in tensors[1:]:
        if value.device != tensors[0][1].device:
            raise RuntimeError(
                f"dsv4::{op}: argument '{name}' must be on the same device as '{tensors[0][0]}' "
                f"({tensors[0][1].device}), got {value.device}"
            )


def _fake(op: str):
    """Registers ``fn`` as the fake (meta) kernel of dsv4::op (``name`` or ``name.overload``), behind the device
    check: shapes and dtypes only. Each op's fake sits right after its wrapper."""

    name, _, overload = op.partition(".")
    arg_names = tuple(a.name for a in getattr(getattr(_ops, name), overload or "default")._schema.arguments)

    def register(fn):
        def fake(*args, **kwargs):
            _check_same_device(name, arg_names, args, kwargs)  # the op's name, as the kernels' messages say it
            return fn(*args, **kwargs)

        torch.library.register_fake(f"dsv4::{op}")(fake)
        return fn

    return register


def _fake_writes_only(op: str) -> None:
    """The fake kernel of an op that only writes into its arguments (returns nothing)."""
    _fake(op)(lambda *args, **kwargs: None)


# ---------------------------------------------------------------------------------------------
# KV-cache writers and helpers
# ---------------------------------------------------------------------------------------------


def qnorm_rope_kv_insert(
    q: torch.Tensor,
    kv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache: torch.Tensor,
    block_size: int,
    eps: float = 1e-6,
    *,
    padded_heads: int | None = None,
    q_out: torch.Tensor | None = None,
    q_norm: bool = True,
    layout: str = "model1",
    placement: str = "page_split",
) -> torch.Tensor:
    """Per-head weight-free RMSNorm (``q_norm``; DeepSeek-V4.1 has none) + RoPE of q; RoPE + quantize + insert of kv.

    q: bf16/fp16/fp32 ``[T, H, 512]`` (last dim contiguous). kv: same dtype ``[>= T_ins, 512]``.
    positions: ``[T]``. slot_mapping: ``[T_ins]`` (T_ins <= T) SWA-cache slots, -1 skips.
    kv_cache: pages of the ``layout`` record (``model1`` 584 B, ``v41_fp8`` 528 B, ``v41_fp4`` 288 B per entry;
    V4.1 in ``placement`` ``page_split`` or ``per_token``). Returns q_out ``[T, padded_heads, 512]`` (heads
    past H are exactly 0); pass ``q_out`` to write into a preallocated contiguous buffer.
    """
    if q_out is None:
        heads = q.shape[1] if padded_heads is None else padded_heads
        q_out = q.new_empty(q.shape[0], heads, q.shape[2])
    _ops.qnorm_rope_kv_insert.layout(q, kv, positions, cos_sin_cache, slot_mapping, kv_cache, block_size, eps, q_out,
                                     q_norm, layout, placement)
    return q_out


_fake_writes_only("qnorm_rope_kv_insert")
_fake_writes_only("qnorm_rope_kv_insert.layout")


MXFP4_Q_BYTES = INDEXER_HEAD_DIM // 2  # e2m1 codes of one indexer head, two per byte
MXFP4_Q_SCALE_BYTES = INDEXER_HEAD_DIM // 32  # its UE8M0 bytes, one per 32 dims

def indexer_q_rope_quant(
    q: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    weights: torch.Tensor,
    softmax_scale: float = INDEXER_HEAD_DIM**-0.5,
    head_scale: float | None = None,
    *,
    q_fp8: torch.Tensor | None = None,
    weights_out: torch.Tensor | None = None,
    query_format: str = "fp8",
    q_scale_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indexer q: RoPE on dims [64, 128) (rounded to bf16), then quantized in ``query_format``.

    q: bf16/fp16/fp32 ``[T, H, 128]``; weights fp32 ``[T, H]``; head_scale defaults to ``H ** -0.5``.
    ``fp8`` (per-(token, head) power-of-two e4m3): returns ``(q_fp8 [T, H, 128] float8_e4m3fn, weights_out [T, H]
    fp32)`` with ``weights_out = weights * q_scale * softmax_scale * head_scale``.
    ``mxfp4`` (DeepSeek-V4.1; e2m1 with a UE8M0 byte per 32 dims, :func:`dsv4.reference.quant.mxfp4_pack`): returns
    the 3-tuple ``(q codes uint8 [T, H, 64], q scale bytes uint8 [T, H, 4], weights_out)`` with ``weights_out =
    weights * softmax_scale * head_scale`` (the scales travel with q, as the logits ops' ``q_scale``). Only this
    format returns three values, so fp8 callers keep their 2-tuple; ``q_fp8`` / ``q_scale_out`` take preallocated
    contiguous outputs.
    """
    if head_scale is None:
        head_scale = q.shape[1] ** -0.5
    if weights_out is None:
        weights_out = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if query_format == "fp8" and q_scale_out is None:
        if q_fp8 is None:
            q_fp8 = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
        _ops.indexer_q_rope_quant(q, positions, cos_sin_cache, weights, softmax_scale, head_scale, q_fp8, weights_out)
        return q_fp8, weights_out
    mxfp4 = query_format == "mxfp4"
    if q_fp8 is None:
        q_fp8 = torch.empty((*q.shape[:2], MXFP4_Q_BYTES if mxfp4 else q.shape[2]),
                            dtype=torch.uint8 if mxfp4 else torch.float8_e4m3fn, device=q.device)
    if q_scale_out is None and mxfp4:
        q_scale_out = torch.empty((*q.shape[:2], MXFP4_Q_SCALE_BYTES), dtype=torch.uint8, device=q.device)
    _ops.indexer_q_rope_quant.format(q, positions, cos_sin_cache, weights, softmax_scale, head_scale, q_fp8,
                                     weights_out, query_format, q_scale_out)
    return (q_fp8, q_scale_out, weights_out) if mxfp4 else (q_fp8, weights_out)


_fake_writes_only("indexer_q_rope_quant")
_fake_writes_only("indexer_q_rope_quant.format")


def indexer_k_norm_rope_store(
    k_pre: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    compress_ratio: int,
    key_format: str = "fp8",
) -> None:
    """DeepSeek-V4.1's index key into the indexer K cache (``key_format`` ``fp8``: 132 B entries, ``mxfp4``: 68 B).

    k_pre bf16 ``[T, 128]`` (last dim contiguous, any row stride); positions, slot_mapping ``[T]`` (-1 skips);
    norm_weight fp32 ``[128]``. Token t writes only where ``(positions[t] + 1) % compress_ratio == 0``: RMSNorm
    times norm_weight (fp32, rounded to bf16), RoPE of dims [64, 128) at ``(p // R) * R`` (rounded to bf16), then
    the key quantized at ``slot_mapping[t]``. Contract: :func:`dsv4.reference.indexer.indexer_k_norm_rope_store`.
    """
    _ops.indexer_k_norm_rope_store(k_pre, positions, cos_sin_cache, norm_weight, eps, kv_cache, slot_mapping,
                                   block_size, compress_ratio, key_format)


_fake_writes_only("indexer_k_norm_rope_store")


def save_partial_states(
    kv: torch.Tensor,
    score: torch.Tensor,
    ape: torch.Tensor,
    positions: torch.Tensor,
    state_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Compressor state rows: ``state[slot] = [kv[t] | score[t] + ape[positions[t] % R]]``.

    kv, score: fp32 ``[T, W]`` (last dim contiguous); ape: fp32 ``[R, W]``; state_cache: fp32
    ``[num_blocks, block_size, 2W]`` (rows contiguous, block and row strides free).
    """
    _ops.save_partial_states(kv, score, ape, positions, state_cache, slot_mapping)


_fake_writes_only("save_partial_states")


def compress_norm_rope_store(
    state_cache: torch.Tensor,
    gather_slots: torch.Tensor,
    positions: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    block_size: int,
    compress_ratio: int,
    *,
    layout: str = "model1",
    placement: str = "page_split",
    latent_out: torch.Tensor | None = None,
) -> None:
    """Compressed MLA entry (head 512) into a ``layout`` cache (``model1``, ``v41_fp8`` or ``v41_fp4`` in
    ``placement``), for tokens with ``(p+1) % R == 0``.

    gather_slots ``[T, coff*R]``: state slots of positions ``p-coff*R+1 .. p`` (-1 invalid); row w
    uses projection half ``w // R``. Per channel softmax-pool over valid rows, RMSNorm with
    ``rms_norm_weight`` fp32 ``[512]``, RoPE at ``(p // R) * R``, quantize at
    ``kv_slot_mapping[t]``. A token with no valid window row writes nothing. ``latent_out`` (bf16
    ``[T, 512]``, optional) receives each written entry after the RMSNorm and before the RoPE, rounded to
    bf16 (V4.1's indexer keys are projected from it); its other rows keep their values.
    """
    _ops.compress_norm_rope_store.layout(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                         rms_norm_eps, cos_sin_cache, kv_cache, block_size, compress_ratio, layout,
                                         placement, latent_out)


_fake_writes_only("compress_norm_rope_store")
_fake_writes_only("compress_norm_rope_store.layout")


def compress_norm_rope_store_indexer(
    state_cache: torch.Tensor,
    gather_slots: torch.Tensor,
    positions: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    block_size: int,
    compress_ratio: int,
) -> None:
    """As :func:`compress_norm_rope_store` for the indexer (head 128) into the 132 B/entry cache."""
    _ops.compress_norm_rope_store_indexer(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                          rms_norm_eps, cos_sin_cache, kv_cache, block_size, compress_ratio)


_fake_writes_only("compress_norm_rope_store_indexer")


def quantize_kv_insert(
    kv: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache: torch.Tensor,
    block_size: int,
    *,
    layout: str = "auto",
    placement: str = "page_split",
) -> None:
    """Quantize rows of kv (bf16-rounded first) into a ``layout`` cache; no RoPE applied. ``auto``: MODEL1 for
    ``[T, 512]``, V32 for ``[T, 576]``; ``v41_fp8`` / ``v41_fp4`` take ``[T, 512]`` in either ``placement``."""
    _ops.quantize_kv_insert.layout(kv, slot_mapping, kv_cache, block_size, layout, placement)


_fake_writes_only("quantize_kv_insert")
_fake_writes_only("quantize_kv_insert.layout")


def dequantize_kv_gather(
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    block_size: int,
    head_dim: int = MODEL1_HEAD_DIM,
    *,
    layout: str | None = None,
    placement: str = "page_split",
) -> torch.Tensor:
    """bf16 ``[*slots.shape, dims]`` rows read from a cache; invalid slots give 0. Without ``layout``, head_dim
    names the record (512: MODEL1, 576: V32); ``layout`` names any record (``v41_fp8`` and ``v41_fp4`` in
    ``placement``) and its dims."""
    if layout is None:
        return _ops.dequantize_kv_gather(kv_cache, slots, block_size, head_dim)
    return _ops.dequantize_kv_gather.layout(kv_cache, slots, block_size, layout, placement)


@_fake("dequantize_kv_gather")
def _dequantize_kv_gather_fake(kv_cache, slots, block_size, head_dim):
    return slots.new_empty((*slots.shape, head_dim), dtype=torch.bfloat16)


@_fake("dequantize_kv_gather.layout")
def _dequantize_kv_gather_layout_fake(kv_cache, slots, block_size, layout, placement):
    return slots.new_empty((*slots.shape, V32_HEAD_DIM if layout == "v32" else MODEL1_HEAD_DIM), dtype=torch.bfloat16)


def indexer_k_quant_insert(
    k: torch.Tensor, slot_mapping: torch.Tensor, kv_cache: torch.Tensor, block_size: int, key_format: str = "fp8"
) -> None:
    """Indexer K ``[T, 128]`` -> bf16-rounded, then ``fp8`` (power-of-two e4m3 + fp32 scale, 132 B/entry cache) or
    ``mxfp4`` (e2m1 + a UE8M0 byte per 32 dims, 68 B/entry cache)."""
    if key_format == "fp8":
        _ops.indexer_k_quant_insert(k, slot_mapping, kv_cache, block_size)
    else:
        _ops.indexer_k_quant_insert.format(k, slot_mapping, kv_cache, block_size, key_format)


_fake_writes_only("indexer_k_quant_insert")
_fake_writes_only("indexer_k_quant_insert.format")


def map_local_to_global_slots(
    local_indices: torch.Tensor, req_ids: torch.Tensor, block_table: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``slot = block_table[req_ids[r], local // bs] * bs + local % bs``; -1 where unmapped.

    local_indices ``[rows, cols]`` (int32/int64, negative = invalid), req_ids ``[rows]``,
    block_table ``[num_reqs, max_blocks]``. Output has local_indices' dtype.
    """
    return _ops.map_local_to_global_slots(local_indices, req_ids, block_table, block_size)


@_fake("map_local_to_global_slots")
def _map_local_to_global_slots_fake(local_indices, req_ids, block_table, block_size):
    return torch.empty_like(local_indices, memory_format=torch.contiguous_format)


def inverse_rope(
    o: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Undo the GPT-J RoPE on the last ``cos_sin_cache.shape[1]`` dims of o ``[T, H, D]``.

    Returns ``out`` (contiguous, dtype ``out_dtype`` or o's dtype).
    """
    if out is None:
        out = torch.empty(o.shape, dtype=out_dtype or o.dtype, device=o.device)
    _ops.inverse_rope(o, positions, cos_sin_cache, out)
    return out


_fake_writes_only("inverse_rope")


# ---------------------------------------------------------------------------------------------
# Lightning indexer
# ---------------------------------------------------------------------------------------------


def fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    max_context_len: int,
    clean_logits: bool = True,
    schedule_meta: torch.Tensor | None = None,
    *,
    q_scale: torch.Tensor | None = None,
    key_format: str = "fp8",
) -> torch.Tensor:
    """DeepGEMM paged MQA logits over the indexer K cache.

    ``key_format``: the cache's entries (``fp8`` 132 B, ``mxfp4`` 68 B). ``q_scale``: mxfp4 queries (q uint8 e2m1
    pairs ``[B, next_n, H, 64]``, q_scale uint8 UE8M0 ``[B, next_n, H, 4]``; weights then carry no q scale).

    q: float8_e4m3fn ``[B, next_n, H, 128]``; weights fp32 ``[B*next_n, H]``; context_lens
    ``[B]`` or ``[B, next_n]`` (with ``[B]``, row j of a request sees ``ctx - next_n + j + 1``
    entries); block_table ``[B, P]``. Returns fp32 ``[B*next_n, max_context_len]`` with
    ``logit[r, t] = kscale_t * sum_h w[r,h] * relu(<q[r,h], k_t>)`` on the valid range and -inf
    elsewhere when ``clean_logits`` (undefined elsewhere otherwise).
    """
    if q_scale is None and key_format == "fp8":
        return _ops.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, block_size,
                                         max_context_len, clean_logits, schedule_meta)
    return _ops.fp8_paged_mqa_logits.format(q, kv_cache, weights, context_lens, block_table, block_size,
                                            max_context_len, clean_logits, schedule_meta, q_scale, key_format)


@_fake("fp8_paged_mqa_logits")
def _fp8_paged_mqa_logits_fake(q, kv_cache, weights, context_lens, block_table, block_size, max_context_len,
                               clean_logits, schedule_meta=None):
    return q.new_empty((q.shape[0] * q.shape[1], max_context_len), dtype=torch.float32)


@_fake("fp8_paged_mqa_logits.format")
def _fp8_paged_mqa_logits_format_fake(q, kv_cache, weights, context_lens, block_table, block_size, max_context_len,
                                      clean_logits, schedule_meta, q_scale, key_format):
    return q.new_empty((q.shape[0] * q.shape[1], max_context_len), dtype=torch.float32)


def fp8_mqa_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    clean_logits: bool = True,
    *,
    q_scale: torch.Tensor | None = None,
    key_format: str = "fp8",
) -> torch.Tensor:
    """DeepGEMM ragged MQA logits: q e4m3 ``[M, H, D]``, k e4m3 ``[N, D]``, k_scale fp32 ``[N]``,
    weights fp32 ``[M, H]``, ``[ks, ke)`` int32 ``[M]`` per row. Returns fp32 ``[M, N]``.

    ``key_format="mxfp4"``: k uint8 e2m1 pairs ``[N, D/2]``, k_scale uint8 UE8M0 ``[N, D/32]``. ``q_scale``: mxfp4
    queries (q uint8 ``[M, H, D/2]``, q_scale uint8 ``[M, H, D/32]``, last dims contiguous)."""
    if q_scale is None and key_format == "fp8":
        return _ops.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits)
    return _ops.fp8_mqa_logits.format(q, k, k_scale, weights, ks, ke, clean_logits, q_scale, key_format)


@_fake("fp8_mqa_logits")
def _fp8_mqa_logits_fake(q, k, k_scale, weights, ks, ke, clean_logits):
    return q.new_empty((q.shape[0], k.shape[0]), dtype=torch.float32)


@_fake("fp8_mqa_logits.format")
def _fp8_mqa_logits_format_fake(q, k, k_scale, weights, ks, ke, clean_logits, q_scale, key_format):
    return q.new_empty((q.shape[0], k.shape[0]), dtype=torch.float32)


def topk_transform(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    k: int = 512,
    *,
    row_starts: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    page_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row top-k of fp32 scores ``[rows, S]`` over ``[start, start + length)``.

    Rows with length <= k give ``0..L-1`` then -1; longer rows give the k best, sorted by score
    descending, ties by lower index, -inf/NaN never chosen over finite values. Indices are
    relative to the row start. With ``page_table [rows, P]`` also returns slot ids
    ``page_table[r, i // page_size] * page_size + i % page_size`` (-1 preserved). int32 outputs.
    """
    raw = torch.empty(scores.shape[0], k, dtype=torch.int32, device=scores.device)
    slots = None
    if page_table is not None:
        if page_size is None:
            raise ValueError("dsv4.ops.topk_transform: page_size is required with page_table")
        slots = torch.empty_like(raw)
    _ops.topk_transform(scores, lengths, row_starts, page_table, page_size or 0, raw, slots)
    return raw, slots


_fake_writes_only("topk_transform")


def fp8_paged_mqa_topk(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    lengths: torch.Tensor,
    block_table: torch.Tensor,
    row_requests: torch.Tensor,
    block_size: int,
    k: int = 512,
    *,
    out: torch.Tensor | None = None,
    q_scale: torch.Tensor | None = None,
    key_format: str = "fp8",
) -> torch.Tensor:
    """Fused indexer for prefill: per-row top-k of the paged MQA logits, never materialising them.

    ``key_format`` / ``q_scale``: as :func:`fp8_paged_mqa_logits` (mxfp4 q ``[T, H, 64]``, q_scale ``[T, H, 4]``).

    q float8_e4m3fn ``[T, H, 128]``; weights fp32 ``[T, H]``; row t scores entries ``[0, lengths[t])``
    of the indexer K cache through ``block_table[row_requests[t]]``. Returns int32 ``[T, k]``, exactly
    ``topk_transform(fp8_paged_mqa_logits(...), lengths, k)[0]``: rows with length <= k give
    ``0..L-1`` then -1; longer rows the k best by score, ties by lower index. Extra memory is
    O(threads x rows-per-block x longest row), not O(T x context).
    """
    if out is None:
        out = torch.empty(q.shape[0], k, dtype=torch.int32, device=q.device)
    if q_scale is None and key_format == "fp8":
        _ops.fp8_paged_mqa_topk(q, kv_cache, weights, lengths, block_table, row_requests, block_size, out)
    else:
        _ops.fp8_paged_mqa_topk.format(q, kv_cache, weights, lengths, block_table, row_requests, block_size, out,
                                       q_scale, key_format)
    return out


_fake_writes_only("fp8_paged_mqa_topk")
_fake_writes_only("fp8_paged_mqa_topk.format")


# ---------------------------------------------------------------------------------------------
# Sparse MLA attention
# ---------------------------------------------------------------------------------------------


def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    block_size: int,
    *,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    extra_block_size: int = 0,
    head_dim_v: int = 512,
    sm_scale: float | None = None,
    tile_scheduler_metadata: torch.Tensor | None = None,
    num_splits: torch.Tensor | None = None,
    layout: str = "auto",
    extra_layout: str = "auto",
    placement: str = "page_split",
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA sparse decode over fp8 caches: one softmax over the main and extra index sets, plus the sink.

    Contract (shapes, validity of entries, out and lse, NaN and empty rules, the sink, the records):
    :func:`dsv4.reference.sparse_mla.sparse_mla_decode`, which this matches.
    ``layout`` / ``extra_layout``: the records of the two caches (``auto``: MODEL1 for d_qk 512, V32 for 576; the
    extra set's defaults to the main set's); DeepSeek-V4.1 pairs a ``v41_fp8`` main cache with a ``v41_fp8`` or
    ``v41_fp4`` extra cache, both in ``placement`` (``page_split`` as vLLM writes them, or ``per_token``).
    ``tile_scheduler_metadata`` / ``num_splits``: a plan from :func:`sparse_mla_decode_schedule` for these
    lengths (CUDA plans on the device when they are None; the CPU ignores them).
    """
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    return _ops.sparse_mla_decode.layout(q, kv_cache, indices, topk_length, attn_sink, extra_kv_cache, extra_indices,
                                         extra_topk_length, block_size, extra_block_size, head_dim_v, scale,
                                         tile_scheduler_metadata, num_splits, layout, extra_layout, placement)


def _sparse_mla_decode_fake(q, kv_cache, indices, topk_length, attn_sink, extra_kv_cache, extra_indices,
                            extra_topk_length, block_size, extra_block_size, head_dim_v, sm_scale,
                            tile_scheduler_metadata=None, num_splits=None, *records):
    b, s_q, h_q, _ = q.shape
    out = q.new_empty((b, s_q, h_q, head_dim_v), dtype=torch.bfloat16)
    lse = q.new_empty((b, h_q, s_q), dtype=torch.float32)
    return out, lse


_fake("sparse_mla_decode")(_sparse_mla_decode_fake)
_fake("sparse_mla_decode.layout")(_sparse_mla_decode_fake)


def sparse_mla_decode_schedule(
    q: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split plan of a sparse decode (FlashMLA's tile scheduler), computed on q's device.

    Every request's entries (main set rounded up to 64-entry blocks, then the extra set) are cut into
    ``num_parts`` partitions of about equal cost, one persistent CTA group each on CUDA. Where the batch is
    large enough that whole requests balance as well at full lengths, every request stays one piece and no
    combine step runs (a rule of the shapes alone). Returns
    ``tile_scheduler_metadata`` int32 ``[num_parts, 8]`` and ``num_splits`` int32 ``[b + 1]``; valid for
    sparse_mla_decode calls with the same shapes and lengths (no host synchronisation: CUDA-graph safe). As
    with FlashMLA, a plan made for other lengths gives unspecified outputs (never an access outside the tensors).
    """
    return _ops.sparse_mla_decode_schedule(q, indices, topk_length, extra_indices, extra_topk_length)


@_fake("sparse_mla_decode_schedule")
def _sparse_mla_decode_schedule_fake(q, indices, topk_length, extra_indices, extra_topk_length):
    parts = decode_schedule_parts(q.device, q.shape[1], q.shape[2])
    return (q.new_empty((parts, 8), dtype=torch.int32), q.new_empty((q.shape[0] + 1,), dtype=torch.int32))


def decode_schedule_parts(device: torch.device, s_q: int, h_q: int) -> int:
    """Partitions of a decode plan on device: SMs on CUDA, intra-op threads on the CPU, per (s_q, 64 heads)."""
    units = (torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda"
             else torch.get_num_threads())
    return _ops._sparse_mla_decode_partitions(units, s_q, h_q)


def sparse_mla_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    head_dim_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA sparse prefill on bf16 kv ``[s_kv, 1, d_qk]``: q ``[s_q, h_q, d_qk]``, indices
    ``[s_q, 1, topk]`` (invalid: < 0 or >= s_kv or at/past ``topk_length[s]``). Returns out bf16
    ``[s_q, h_q, head_dim_v]``, max_logits and natural-log lse fp32 ``[s_q, h_q]`` (no valid index:
    out 0, max_logits -inf, lse +inf; a NaN score: all three NaN)."""
    return _ops.sparse_mla_prefill(q, kv, indices, sm_scale, head_dim_v, attn_sink, topk_length)


@_fake("sparse_mla_prefill")
def _sparse_mla_prefill_fake(q, kv, indices, sm_scale, head_dim_v, attn_sink, topk_length):
    s_q, h_q, _ = q.shape
    out = q.new_empty((s_q, h_q, head_dim_v), dtype=torch.bfloat16)
    return out, q.new_empty((s_q, h_q), dtype=torch.float32), q.new_empty((s_q, h_q), dtype=torch.float32)


PREFILL_ROUTES = ("decode", "gather")


def sparse_mla_prefill_from_cache(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    block_size: int,
    *,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    extra_block_size: int = 0,
    sm_scale: float | None = None,
    layout: str = "auto",
    extra_layout: str = "auto",
    placement: str = "page_split",
    route: str = "decode",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse prefill straight from fp8 caches: q ``[s_q, h_q, d_qk]``, indices (and extra_indices) ``[s_q, topk]``
    slot ids, lengths ``[s_q]``; returns out bf16 ``[s_q, h_q, 512]`` and lse fp32 ``[s_q, h_q]`` (the decode
    contract with one query per token).

    ``route="decode"``: every token is a decode request of one query (:func:`sparse_mla_decode`); the CPU kernel
    dequantizes each attended row into a small staging block as it goes, so no bf16 copy of the attended set
    exists. ``route="gather"``: the distinct attended rows are dequantized to bf16 (:func:`dequantize_kv_gather`),
    then :func:`sparse_mla_prefill` attends over them (FlashMLA's prefill takes bf16 rows only; this is how
    engines feed it from fp8 caches).
    """
    if route not in PREFILL_ROUTES:
        raise ValueError(f"sparse_mla_prefill_from_cache: route must be one of {PREFILL_ROUTES}, got {route!r}")
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    extra = extra_kv_cache is not None
    if route == "decode":
        out, lse = sparse_mla_decode(
            q[:, None], kv_cache, indices[:, None], block_size, topk_length=topk_length, attn_sink=attn_sink,
            extra_kv_cache=extra_kv_cache, extra_indices=extra_indices[:, None] if extra else None,
            extra_topk_length=extra_topk_length, extra_block_size=extra_block_size, sm_scale=scale, layout=layout,
            extra_layout=extra_layout, placement=placement)
        return out[:, 0], lse[:, :, 0]
    from .reference.sparse_mla import decode_records  # noqa: PLC0415 (names the records as the decode does)

    main_layout, extra_layout_ = decode_records(q.shape[-1], layout, extra_layout)
    sets = [(kv_cache, indices, topk_length, block_size, main_layout)]
    if extra:
        sets.append((extra_kv_cache, extra_indices, extra_topk_length, extra_block_size, extra_layout_))
    rows, ids, first = [], [], 0
    for cache, idx, lengths, bs, record in sets:
        capacity = cache.shape[0] * bs
        valid = (idx >= 0) & (idx < capacity)
        if lengths is not None:
            valid &= torch.arange(idx.shape[-1], device=idx.device) < lengths.to(idx.device).long()[:, None]
        slots, inverse = torch.unique(torch.where(valid, idx.long(), -1), return_inverse=True)
        rows.append(dequantize_kv_gather(cache, slots, bs, layout=record, placement=placement))
        ids.append(torch.where(valid, inverse + first, -1))  # slot -1 (if present) becomes an all-zero row, unused
        first += slots.numel()
    out, _, lse = sparse_mla_prefill(q, torch.cat(rows)[:, None], torch.cat(ids, -1)[:, None].to(torch.int32), scale,
                                     HEAD_DIM_V, attn_sink)
    return out, lse


HEAD_DIM_V = 512


def _register_reference_cpu_kernels() -> None:
    """Ops without a native CPU kernel run their reference on the CPU (visible in build_info())."""
    lib = torch.library.Library("dsv4", "IMPL")
    for name in REFERENCE_BACKED_CPU_OPS:
        lib.impl(name, OP_IMPLS[name], "CPU")
    _LIBRARIES.append(lib)


_LIBRARIES: list[torch.library.Library] = []  # keeps the Python registrations alive
_register_reference_cpu_kernels()
