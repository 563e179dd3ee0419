"""Reference lightning indexer: the q RoPE + fp8 quant, fp8 MQA logits (paged decode and ragged prefill) and the
fused prefill top-k.

Pure torch, float32 math on exactly decoded fp8 values. These functions are the specification
of ``torch.ops.dsv4.indexer_q_rope_quant``, ``fp8_paged_mqa_logits``, ``fp8_mqa_logits`` and
``fp8_paged_mqa_topk``; the ``*_op`` adapters (argument checks + schema argument order) stand in for a missing
native kernel (ROCm).

Logits: ``logit[r, t] = kscale_t * sum_h w[r, h] * relu(<q[r, h, :], k_t>)``. Positions outside a
row's valid range, and keys whose page is missing from the cache, are -inf (also with
``clean_logits=False``, where the contract leaves them unspecified).

The fused top-k selects exactly as ``topk.topk_transform`` (whose docstring defines the order) over these logits.
"""

from __future__ import annotations

import torch

from ..constants import INDEXER_HEAD_DIM, INDEXER_K_BYTES_PER_ENTRY
from . import quant
from .checks import (
    INDEX_DTYPES,
    check,
    check_dtype,
    check_paged_cache,
    check_shape,
    check_tensor,
)
from .rope_slots import apply_rope
from .topk import topk_transform

# Largest [rows x heads x keys] fp32 block of head dot products held at once (bounds memory on long contexts).
DOT_BLOCK_ELEMENTS = 1 << 24
_SCALE_BYTES = INDEXER_K_BYTES_PER_ENTRY - INDEXER_HEAD_DIM
_NEG_INF = float("-inf")


def weighted_relu_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor):
    """fp32 ``[R, N]`` = ``k_scale[n] * sum_h weights[r, h] * relu(<q[r, h], k[n]>)``; q ``[R, H, D]``, k ``[N, D]``.

    Rows are processed in blocks of at most DOT_BLOCK_ELEMENTS head dot products.
    """
    rows, heads, dim = q.shape
    out = torch.empty(rows, k.shape[0], dtype=torch.float32)
    step = max(1, DOT_BLOCK_ELEMENTS // max(1, heads * k.shape[0]))
    for r0 in range(0, rows, step):
        block = q[r0 : r0 + step]
        dots = (block.reshape(-1, dim) @ k.T).view(block.shape[0], heads, k.shape[0]).clamp_min(0)
        out[r0 : r0 + step] = torch.bmm(weights[r0 : r0 + step, None, :], dots)[:, 0] * k_scale
    return out


def _row_context_lens(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """[B, next_n] int64 lengths; 1-D lens give MTP row j of a request ``ctx - next_n + j + 1`` entries."""
    lens = context_lens.long()
    if lens.dim() == 2:
        return lens
    return lens[:, None] - next_n + 1 + torch.arange(next_n)


def _read_indexer_keys(pages: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor, block_size: int,
                       key_format: str = "fp8"):
    """Decoded fp32 keys ``[n, 128]`` and scales ``[n]`` of entries (blocks[i], offsets[i]) (all in the cache); mxfp4
    keys are decoded whole with scale 1."""
    data_bytes, scale_bytes = quant.check_key_format(key_format)
    off = offsets[:, None]
    code_cols = off * data_bytes + torch.arange(data_bytes)
    scale_cols = block_size * data_bytes + scale_bytes * off + torch.arange(scale_bytes)
    return quant.indexer_key_unpack(pages[blocks[:, None], code_cols], pages[blocks[:, None], scale_cols], key_format)


def decode_query(q: torch.Tensor, q_scale: torch.Tensor | None) -> torch.Tensor:
    """fp32 query values: e4m3 q as is (its scale is in the weights), mxfp4 q (e2m1 pairs) times its UE8M0 bytes."""
    if q_scale is None:
        return q.float()
    return quant.mxfp4_unpack(q.view(torch.uint8), q_scale.view(torch.uint8))


def fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    max_context_len: int,
    clean_logits: bool = True,
    *,
    q_scale: torch.Tensor | None = None,
    key_format: str = "fp8",
) -> torch.Tensor:
    """fp32 ``[B*next_n, max_context_len]`` logits of q e4m3 ``[B, next_n, H, 128]`` (or mxfp4: e2m1 pairs uint8
    ``[B, next_n, H, 64]`` with UE8M0 bytes ``q_scale [B, next_n, H, 4]``) over the paged indexer K cache of
    ``key_format`` (``fp8`` 132 B or ``mxfp4`` 68 B entries).

    Row ``b*next_n + j`` covers positions ``[0, len)`` with len from ``context_lens`` (``[B]``: causal MTP
    rule, ``[B, next_n]``: as given), clamped to ``[0, max_context_len]``; position t reads entry
    ``t % block_size`` of page ``block_table[b, t // block_size]``. Missing pages give -inf.
    """
    del clean_logits  # the reference always writes -inf outside the valid range
    batch, next_n, heads, _ = q.shape
    lens = _row_context_lens(context_lens, next_n).clamp(0, max_context_len)
    pages = quant.cache_pages(kv_cache)
    table = block_table.long()
    q_rows = decode_query(q, q_scale)
    w_rows = weights.float().reshape(batch, next_n, heads)
    logits = torch.full((batch, next_n, max_context_len), _NEG_INF, dtype=torch.float32)
    for b in range(batch):
        positions = torch.arange(int(lens[b].max()) if next_n else 0)
        page_index = positions // block_size
        in_table = page_index < table.shape[1]
        blocks = torch.full_like(positions, -1)
        blocks[in_table] = table[b, page_index[in_table]]
        present = (blocks >= 0) & (blocks < pages.shape[0])
        positions, blocks = positions[present], blocks[present]
        keys, scales = _read_indexer_keys(pages, blocks, positions % block_size, block_size, key_format)
        scores = weighted_relu_logits(q_rows[b], keys, scales, w_rows[b])
        inside = positions[None, :] < lens[b, :, None]
        logits[b, :, positions] = torch.where(inside, scores, _NEG_INF)
    return logits.view(batch * next_n, max_context_len)


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
    """fp32 ``[M, N]`` ragged logits of q e4m3 ``[M, H, D]`` (or mxfp4 pairs ``[M, H, D/2]`` with UE8M0 ``q_scale
    [M, H, D/32]``) against k e4m3 ``[N, D]`` (scales ``k_scale`` fp32 ``[N]``), or with ``key_format="mxfp4"`` k
    e2m1 pairs uint8 ``[N, D/2]`` and ``k_scale`` UE8M0 uint8 ``[N, D/32]``.

    Row i is defined on ``ks[i] <= j < ke[i]`` (clamped to ``[0, N)``) and -inf elsewhere.
    """
    del clean_logits  # the reference always writes -inf outside [ks, ke)
    quant.check_key_format(key_format)
    if key_format == "mxfp4":
        keys, key_scales = quant.mxfp4_unpack(k.view(torch.uint8), k_scale.view(torch.uint8)), torch.ones(k.shape[0])
    else:
        keys, key_scales = k.float(), k_scale.float()
    scores = weighted_relu_logits(decode_query(q, q_scale), keys, key_scales, weights.float())
    cols = torch.arange(k.shape[0])
    inside = (cols >= ks.long()[:, None]) & (cols < ke.long()[:, None])
    return torch.where(inside, scores, _NEG_INF)


def fp8_paged_mqa_topk(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    lengths: torch.Tensor,
    block_table: torch.Tensor,
    row_requests: torch.Tensor,
    block_size: int,
    k: int,
    *,
    q_scale: torch.Tensor | None = None,
    key_format: str = "fp8",
) -> torch.Tensor:
    """int32 ``[T, k]``: the top-k of each row's paged logits, exactly ``topk_transform`` of
    ``fp8_paged_mqa_logits`` where row t (q ``[T, H, 128]``, or mxfp4 ``[T, H, 64]`` with ``q_scale [T, H, 4]``)
    sees ``lengths[t]`` entries through ``block_table[row_requests[t]]``."""
    tables = block_table[row_requests.long()]
    width = int(lengths.max().clamp(min=0)) if lengths.numel() else 0
    scale = None if q_scale is None else q_scale.unsqueeze(1)
    logits = fp8_paged_mqa_logits(q.unsqueeze(1), kv_cache, weights, lengths, tables, block_size, width,
                                  q_scale=scale, key_format=key_format)
    return topk_transform(logits, lengths, k)[0]


# ---- schema adapters (CPU kernels for now): check, compute, return fresh tensors or write in place ----


def fp8_paged_mqa_logits_op(q, kv_cache, weights, context_lens, block_table, block_size, max_context_len,
                            clean_logits, schedule_meta=None):
    op = "fp8_paged_mqa_logits"
    check_tensor(op, "q", q, (torch.float8_e4m3fn,), (None, None, None, INDEXER_HEAD_DIM))
    batch, next_n, heads, _ = q.shape
    check(heads > 0, op, "q", "have at least one head (dimension 2)", f"shape {list(q.shape)}")
    check_paged_cache(op, "kv_cache", kv_cache, block_size, INDEXER_K_BYTES_PER_ENTRY)
    check_tensor(op, "weights", weights, (torch.float32,), (batch * next_n, heads))
    check_dtype(op, "context_lens", context_lens, INDEX_DTYPES)
    lens_shape = (batch,) if context_lens.dim() == 1 else (batch, next_n)
    check_shape(op, "context_lens", context_lens, lens_shape)
    check_tensor(op, "block_table", block_table, INDEX_DTYPES, (batch, None))
    check(max_context_len >= 0, op, "max_context_len", "be >= 0", max_context_len)
    return fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, block_size, max_context_len,
                                clean_logits)


def fp8_mqa_logits_op(q, k, k_scale, weights, ks, ke, clean_logits):
    op = "fp8_mqa_logits"
    check_tensor(op, "q", q, (torch.float8_e4m3fn,), (None, None, None))
    rows, heads, dim = q.shape
    check(heads > 0, op, "q", "have at least one head (dimension 1)", f"shape {list(q.shape)}")
    check_tensor(op, "k", k, (torch.float8_e4m3fn,), (None, dim))
    check_tensor(op, "k_scale", k_scale, (torch.float32,), (k.shape[0],))
    check_tensor(op, "weights", weights, (torch.float32,), (rows, heads))
    check_tensor(op, "ks", ks, INDEX_DTYPES, (rows,))
    check_tensor(op, "ke", ke, INDEX_DTYPES, (rows,))
    return fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits)


def rotated_query(q: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """fp32 q with RoPE on its last dims, those rounded to bf16 (the NoPE dims keep q's values): what both query
    quantizations start from."""
    rotated = apply_rope(q, positions, cos_sin_cache)
    rope_dim = cos_sin_cache.shape[1]
    return torch.cat([rotated[..., :-rope_dim], quant.round_bf16(rotated[..., -rope_dim:])], dim=-1)


def indexer_q_rope_quant(
    q: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    weights: torch.Tensor,
    softmax_scale: float,
    head_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_fp8 ``[T, H, 128]`` float8_e4m3fn, weights_out ``[T, H]`` fp32).

    RoPE on the last 64 dims, rounded to bf16 (the NoPE half keeps q's values); per (t, h) scale
    ``2^ceil(log2(max(amax, 1e-4) / 448))``; ``weights_out = weights * scale * softmax_scale * head_scale``.
    """
    values = rotated_query(q, positions, cos_sin_cache)
    scale = quant.indexer_scale(values)
    q_fp8 = quant.encode_e4m3(values / scale.unsqueeze(-1)).view(torch.float8_e4m3fn)
    weights_out = weights.float() * scale * softmax_scale * head_scale
    return q_fp8, weights_out


def indexer_q_rope_quant_mxfp4(
    q: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    weights: torch.Tensor,
    softmax_scale: float,
    head_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q codes uint8 ``[T, H, 64]``, UE8M0 bytes uint8 ``[T, H, 4]``, weights_out fp32 ``[T, H]``).

    The same RoPE and bf16 rounding of the RoPE dims as :func:`indexer_q_rope_quant`, then each head's 128 values
    packed by :func:`dsv4.reference.quant.mxfp4_pack` (the NoPE dims as given: bf16 and fp16 inputs are exact);
    ``weights_out = weights * softmax_scale * head_scale`` (the per-block scales travel with q).
    """
    values = rotated_query(q, positions, cos_sin_cache)
    codes, scales = quant.mxfp4_pack(values)
    return codes, scales, weights.float() * softmax_scale * head_scale


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
    """DeepSeek-V4.1's index key, written in place into ``kv_cache`` (pages of ``key_format`` entries).

    For each token t with a valid slot (``0 <= slot < num_blocks * block_size``) and ``(positions[t] + 1) %
    compress_ratio == 0``: ``k = rms_norm(k_pre[t]) * norm_weight`` in fp32, ``(x * inv_rms) * w`` with ``inv_rms =
    fp32(1 / sqrt(mean(x^2) + eps))`` taken in float64 (the sum of squares of bf16 inputs is then exact, so every
    summation order agrees), rounded to bf16; GPT-J RoPE of dims [64, 128) at position ``(p // R) * R``, rounded
    to bf16; then quantized (fp8: :func:`dsv4.reference.quant.indexer_k_pack`; mxfp4:
    :func:`dsv4.reference.quant.mxfp4_pack`) into the slot's entry. Other tokens write nothing.
    """
    quant.check_key_format(key_format)
    pos = positions.long()
    slots = slot_mapping.long()
    pages = quant.cache_pages(kv_cache)
    write = ((pos + 1) % compress_ratio == 0) & quant.valid_slots(slots, pages.shape[0], block_size)
    x = k_pre.float()[write]
    inv_rms = (1.0 / torch.sqrt(x.double().square().sum(dim=-1, keepdim=True) / x.shape[-1] + eps)).float()
    normed = quant.round_bf16(x * inv_rms * norm_weight.float())
    rotated = quant.round_bf16(apply_rope(normed, pos[write] // compress_ratio * compress_ratio, cos_sin_cache))
    data, scales = quant.indexer_key_pack(rotated, key_format)
    quant.indexer_key_write(kv_cache, slots[write], block_size, data, scales, key_format)
