"""Reference sparse MLA attention: FlashMLA sparse decode over fp8 caches and sparse prefill over bf16 kv.

Pure torch, float32 math on exactly dequantized cache rows. These functions are the specification
of ``torch.ops.dsv4.sparse_mla_decode`` and ``sparse_mla_prefill``; the ``*_op`` adapters (argument
checks + schema argument order) stand in as their CPU kernels wherever the native ones are not registered.

Per query token and head, over its valid entries J (duplicates count twice):
``s_j = sm_scale * <q, k_j>``, ``lse = ln sum_j exp(s_j)``, ``out = sum_j exp(s_j - lse) * k_j[:head_dim_v]``,
then ``out *= 1 / (1 + exp(sink_h - lse))`` (the returned lse never includes the sink). An empty J
gives out exactly 0, lse +inf (and max_logits -inf in prefill).
"""

from __future__ import annotations

import torch

from ..constants import (
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_HEAD_DIM,
    V32_BYTES_PER_TOKEN,
    V32_HEAD_DIM,
)
from . import quant
from .checks import (
    INDEX_DTYPES,
    check,
    check_dim,
    check_dtype,
    check_optional,
    check_paged_cache,
    check_positive,
    check_tensor,
)

HEAD_DIM_V = MODEL1_HEAD_DIM  # both layouts attend with V = the first 512 dims of the row
MAX_HEADS = 128
# Largest [tokens x entries x d_qk] fp32 block of gathered keys held at once (bounds memory on big batches).
GATHER_BLOCK_ELEMENTS = 1 << 24
# d_qk -> (reference row reader, bytes per cache entry) of the records a head dim alone names ("auto").
CACHE_LAYOUTS = {
    MODEL1_HEAD_DIM: (quant.model1_read, MODEL1_BYTES_PER_TOKEN),
    V32_HEAD_DIM: (quant.v32_read, V32_BYTES_PER_TOKEN),
}
# (main, extra) records a decode may pair.
RECORD_PAIRS = (("model1", "model1"), ("v32", "v32"), ("v41_fp8", "v41_fp8"), ("v41_fp8", "v41_fp4"))


def decode_records(d_qk: int, layout: str = "auto", extra_layout: str = "auto") -> tuple[str, str]:
    """The (main, extra) records of a decode: ``auto`` gives MODEL1 for d_qk 512 and V32 for 576, the extra set's
    the main set's; raises ValueError for a pair outside :data:`RECORD_PAIRS` or a head dim the record lacks."""
    main = ("model1" if d_qk == MODEL1_HEAD_DIM else "v32") if layout == "auto" else layout
    extra = main if extra_layout == "auto" else extra_layout
    if (main, extra) not in RECORD_PAIRS:
        raise ValueError(f"records (layout, extra_layout) = ({main}, {extra}) are not a supported pair; "
                         f"supported: {RECORD_PAIRS}")
    if quant.RECORDS[main][0] != d_qk:
        raise ValueError(f"q head dim {d_qk} does not match the {main} record ({quant.RECORDS[main][0]} dims)")
    return main, extra


def attend(q, rows, row_ids, valid, sm_scale, head_dim_v, attn_sink=None):
    """Sparse softmax attention of q fp32 ``[T, h, d]`` over ``rows[row_ids[t, n]]`` where ``valid[t, n]``.

    rows: fp32 ``[R, d]`` (K and, in its first head_dim_v dims, V). Returns fp32 out ``[T, h, head_dim_v]``,
    max_logits ``[T, h]`` and lse ``[T, h]`` with the module's conventions for sinks and empty sets.
    """
    tokens, heads, dim = q.shape
    entries = row_ids.shape[1]
    out = torch.zeros(tokens, heads, head_dim_v)
    max_logits = torch.full((tokens, heads), float("-inf"))
    lse = torch.full((tokens, heads), float("inf"))
    # Row 0 of the table is a zero pad that invalid entries point at (they are masked anyway).
    table = torch.cat([rows.new_zeros(1, dim), rows.float()])
    ids = torch.where(valid, row_ids.long() + 1, 0)
    step = max(1, GATHER_BLOCK_ELEMENTS // max(1, entries * dim))
    for t0 in range(0, tokens if entries else 0, step):
        chunk = slice(t0, t0 + step)
        keys = table[ids[chunk]]
        ok = valid[chunk, None, :]
        scores = (sm_scale * torch.bmm(q[chunk], keys.transpose(1, 2))).masked_fill(~ok, float("-inf"))
        empty = ~ok.any(-1)
        chunk_lse = torch.logsumexp(scores, -1)
        probs = torch.exp(scores - torch.where(empty, 0.0, chunk_lse)[..., None])
        chunk_out = torch.bmm(probs, keys[..., :head_dim_v])
        if attn_sink is not None:
            sink_factor = 1 / (1 + torch.exp(attn_sink.float() - chunk_lse))
            chunk_out *= torch.where(empty, 1.0, sink_factor)[..., None]
        out[chunk] = chunk_out
        max_logits[chunk] = scores.amax(-1)
        lse[chunk] = torch.where(empty, float("inf"), chunk_lse)
    return out, max_logits, lse


def _cache_table(cache, indices, lengths, block_size, layout, placement):
    """Valid mask ``[b, s_q, topk]``, the distinct valid slots' rows (each read once) and each entry's row id."""
    capacity = cache.shape[0] * block_size
    valid = (indices >= 0) & (indices < capacity)
    if lengths is not None:
        valid &= torch.arange(indices.shape[-1]) < lengths.long()[:, None, None]
    slots, inverse = torch.unique(indices[valid].long(), return_inverse=True)
    rows = quant.read_records(cache, slots, block_size, layout, placement)
    row_ids = torch.zeros(indices.shape, dtype=torch.int64)
    row_ids[valid] = inverse
    return valid, rows, row_ids


def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    block_size: int,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    extra_block_size: int = 0,
    head_dim_v: int = HEAD_DIM_V,
    sm_scale: float | None = None,
    layout: str = "auto",
    extra_layout: str = "auto",
    placement: str = "page_split",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract of sparse MLA decode (every other description of it points here).

    q bf16 ``[b, s_q, h_q, d_qk]``, h_q 1 to 128. The caches hold the records ``layout`` and ``extra_layout``
    (:func:`decode_records`: by default d_qk 512 reads MODEL1 caches, 576 V32 caches; DeepSeek-V4.1 pairs a
    ``v41_fp8`` main cache with a ``v41_fp8`` or ``v41_fp4`` extra cache, both in ``placement``). indices
    int32 / int64 ``[b, s_q, topk]`` are global slots ``block * block_size + offset``; an entry is invalid (skipped)
    when -1, outside ``[0, num_blocks * block_size)`` or at a column >= ``topk_length[b]``; a slot listed twice counts
    twice. The extra set (the same rules with the extra_* arguments, its own cache and block size) joins the same
    softmax. Scores are ``sm_scale * <q, k>`` (default ``d_qk ** -0.5``) over the full d_qk; values are the first
    head_dim_v (512) dims of each entry.
    Returns out bf16 ``[b, s_q, h_q, head_dim_v]`` and the natural-log lse fp32 ``[b, h_q, s_q]`` without the sink.
    A query with no valid entry gives out 0 and lse +inf; a NaN score (NaN in q or in an attended row) gives NaN out
    and lse for its heads. ``attn_sink`` fp32 ``[h_q]`` scales out by ``1 / (1 + exp(sink - lse))`` (+inf gives 0,
    -inf no change).
    """
    batch, s_q, heads, d_qk = q.shape
    scale = d_qk**-0.5 if sm_scale is None else sm_scale
    main_layout, extra_layout = decode_records(d_qk, layout, extra_layout)
    sets = [(kv_cache, indices, topk_length, block_size, main_layout)]
    if extra_kv_cache is not None:
        sets.append((extra_kv_cache, extra_indices, extra_topk_length, extra_block_size, extra_layout))
    masks, tables, ids = [], [], []
    for cache, idx, lengths, bs, record in sets:
        valid, rows, row_ids = _cache_table(cache, idx, lengths, bs, record, placement)
        masks.append(valid)
        ids.append(row_ids + sum(t.shape[0] for t in tables))
        tables.append(rows)
    tokens, entries = batch * s_q, sum(m.shape[-1] for m in masks)
    out, _, lse = attend(q.float().reshape(tokens, heads, d_qk), torch.cat(tables),
                         torch.cat(ids, -1).reshape(tokens, entries), torch.cat(masks, -1).reshape(tokens, entries),
                         scale, head_dim_v, attn_sink)
    lse = lse.reshape(batch, s_q, heads).transpose(1, 2).contiguous()
    return out.to(torch.bfloat16).reshape(batch, s_q, heads, head_dim_v), lse


def sparse_mla_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    head_dim_v: int = HEAD_DIM_V,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out bf16 ``[s_q, h_q, head_dim_v]``, max_logits and lse fp32 ``[s_q, h_q]`` of q bf16 ``[s_q, h_q, d_qk]``.

    kv bf16 ``[s_kv, 1, d_qk]``; indices ``[s_q, 1, topk]`` rows of kv, invalid when outside ``[0, s_kv)``
    or at column >= ``topk_length[s]``.
    """
    idx = indices[:, 0].long()
    valid = (idx >= 0) & (idx < kv.shape[0])
    if topk_length is not None:
        valid &= torch.arange(idx.shape[-1]) < topk_length.long()[:, None]
    out, max_logits, lse = attend(q.float(), kv[:, 0].float(), idx, valid, sm_scale, head_dim_v, attn_sink)
    return out.to(torch.bfloat16), max_logits, lse


# ---- schema adapters (CPU kernels for now): check, then compute fresh outputs ----


def _check_query(op: str, q: torch.Tensor, rank: int, head_dim_v: int) -> None:
    check_dtype(op, "q", q, (torch.bfloat16,))
    check_dim(op, "q", q, rank)
    check(q.shape[-1] in CACHE_LAYOUTS, op, "q", f"have head dim d_qk in {tuple(CACHE_LAYOUTS)}",
          f"shape {list(q.shape)}")
    check(1 <= q.shape[-2] <= MAX_HEADS, op, "q", f"have 1 to {MAX_HEADS} heads (dimension {rank - 2})",
          f"shape {list(q.shape)}")
    check(head_dim_v == HEAD_DIM_V, op, "head_dim_v", f"be {HEAD_DIM_V}", head_dim_v)


def _check_indices(op: str, name: str, indices: torch.Tensor, shape, min_topk: int) -> None:
    check_tensor(op, name, indices, INDEX_DTYPES, shape)
    check(indices.shape[-1] >= min_topk, op, name, f"have at least {min_topk} columns", f"shape {list(indices.shape)}")


def sparse_mla_decode_op(q, kv_cache, indices, topk_length, attn_sink, extra_kv_cache, extra_indices,
                         extra_topk_length, block_size, extra_block_size, head_dim_v, sm_scale,
                         tile_scheduler_metadata=None, num_splits=None):
    op = "sparse_mla_decode"
    _check_query(op, q, 4, head_dim_v)
    batch, s_q, heads, d_qk = q.shape
    entry_bytes = CACHE_LAYOUTS[d_qk][1]
    check_paged_cache(op, "kv_cache", kv_cache, block_size, entry_bytes)
    _check_indices(op, "indices", indices, (batch, s_q, None), 1)
    check_optional(op, "topk_length", topk_length, INDEX_DTYPES, (batch,))
    check_optional(op, "attn_sink", attn_sink, (torch.float32,), (heads,))
    extra_state = "extra_kv_cache " + ("absent" if extra_kv_cache is None else "given")
    check((extra_kv_cache is None) == (extra_indices is None), op, "extra_indices",
          "be given exactly when extra_kv_cache is", extra_state)
    if extra_kv_cache is not None:
        check_positive(op, "extra_block_size", extra_block_size)
        check_paged_cache(op, "extra_kv_cache", extra_kv_cache, extra_block_size, entry_bytes, "extra_block_size")
        _check_indices(op, "extra_indices", extra_indices, (batch, s_q, None), 0)
    check(extra_topk_length is None or extra_indices is not None, op, "extra_topk_length",
          "be None without extra_indices", "a tensor")
    check_optional(op, "extra_topk_length", extra_topk_length, INDEX_DTYPES, (batch,))
    return sparse_mla_decode(q, kv_cache, indices, block_size, topk_length, attn_sink, extra_kv_cache, extra_indices,
                             extra_topk_length, extra_block_size, head_dim_v, sm_scale)


def sparse_mla_prefill_op(q, kv, indices, sm_scale, head_dim_v, attn_sink, topk_length):
    op = "sparse_mla_prefill"
    _check_query(op, q, 3, head_dim_v)
    s_q, heads, d_qk = q.shape
    check_tensor(op, "kv", kv, (torch.bfloat16,), (None, 1, d_qk))
    _check_indices(op, "indices", indices, (s_q, 1, None), 1)
    check_optional(op, "attn_sink", attn_sink, (torch.float32,), (heads,))
    check_optional(op, "topk_length", topk_length, INDEX_DTYPES, (s_q,))
    return sparse_mla_prefill(q, kv, indices, sm_scale, head_dim_v, attn_sink, topk_length)
