"""DeepGEMM-compatible lightning-indexer API (``import dsv4.deep_gemm as deep_gemm``).

Same Python signatures and return conventions as DeepGEMM's ``fp8_mqa_logits``,
``fp8_paged_mqa_logits`` and ``get_paged_mqa_logits_metadata``, backed by ``torch.ops.dsv4``. The
paged KV cache is DeepGEMM's ``[num_blocks, block_kv, 1, head_dim + 4]`` uint8 view (``block_kv``
entries per page: their fp8 rows, then their fp32 scales; only ``stride(0)`` is free).

DeepGEMM's newer unified names ``fp8_fp4_mqa_logits`` and ``fp8_fp4_paged_mqa_logits`` take ``q = (values,
scales or None)``: e4m3 values with None, or MXFP4 (DeepSeek-V4.1) packed e2m1 values (uint8 or int8, two per
byte) with their UE8M0 scales, either DeepGEMM's packed int32 (one word of four bytes per head or key) or one
uint8 per 32 dims. The paged cache's last dim names its key format: 132 (fp8) or 68 (mxfp4: 64 code bytes, then
4 scale bytes, per entry, in the same page-split layout).
"""

from __future__ import annotations

import torch

from . import ops
from .cache import INDEXER_KEY_FORMAT_OF_ENTRY_BYTES

SPLIT_KV = 256  # keys per scheduled segment (DeepGEMM's decode split)


def fp8_mqa_logits(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seq_len_k_start: torch.Tensor,
    cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
) -> torch.Tensor:
    """Ragged prefill logits.

    q e4m3 ``[M, H, D]``; kv = (k e4m3 ``[N, D]``, k_scale fp32 ``[N]``); weights fp32 ``[M, H]``;
    ``[cu_seq_len_k_start[i], cu_seq_len_k_end[i])`` int32 ``[M]`` is row i's key range. Returns fp32
    ``[M, N]`` (``logit = sum_h w[i,h] * relu(<q[i,h], k_j> * k_scale_j)``, -inf outside the range when
    ``clean_logits``); with ``max_seqlen_k > 0`` returns ``[M, max_seqlen_k]`` whose column c is key
    ``start[i] + c`` (``clean_logits`` must then be False, as in DeepGEMM).
    """
    k, k_scale = kv
    if max_seqlen_k > 0 and clean_logits:
        raise ValueError("dsv4.deep_gemm.fp8_mqa_logits: clean_logits must be False with max_seqlen_k > 0")
    logits = ops.fp8_mqa_logits(q, k, k_scale, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits)
    return _compressed_columns(logits, cu_seq_len_k_start, max_seqlen_k)


def _compressed_columns(logits: torch.Tensor, starts: torch.Tensor, max_seqlen_k: int) -> torch.Tensor:
    """Full ``[M, N]`` logits, or with ``max_seqlen_k > 0`` ``[M, max_seqlen_k]`` whose column c is key start + c."""
    if max_seqlen_k <= 0:
        return logits
    # One extra -inf column stands for every key position past N.
    padded = torch.cat([logits, logits.new_full((logits.shape[0], 1), float("-inf"))], dim=1)
    columns = starts.long()[:, None] + torch.arange(max_seqlen_k, device=logits.device)
    return torch.gather(padded, 1, columns.clamp(0, logits.shape[1]))


def _check_indices(fn: str, indices: torch.Tensor | None, rows: int, next_n: int = 1) -> None:
    """DeepGEMM's varlen ``indices``: int32 ``[rows]``, the request of each query row (a request's rows are
    consecutive, next_n is 1). DeepGEMM's kernels use it only to share key loads between a request's rows; every
    row still reads its own block-table row and length, so the logits do not depend on it and the CPU kernels,
    which need no such hint, validate it and go on."""
    if indices is None:
        return
    if indices.dtype != torch.int32 or indices.dim() != 1 or indices.shape[0] != rows:
        raise ValueError(f"dsv4.deep_gemm.{fn}: indices must be int32 [{rows}] (the request of each query row), got "
                         f"{str(indices.dtype).removeprefix('torch.')} {list(indices.shape)}")
    if next_n != 1:
        raise ValueError(f"dsv4.deep_gemm.{fn}: indices (varlen rows) need next_n 1, got q with next_n {next_n}")


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: torch.Tensor | None = None) -> torch.Tensor:
    """Schedule of the paged logits: int32 ``[num_sms + 1, 2]``, row s = (query row, key segment) where
    worker s starts, splitting ``ceil(len / 256)`` segments per query row evenly (DeepGEMM's plan).

    The CPU kernel balances its own work and ignores it; the call is accepted for drop-in use. ``indices``
    (varlen rows, see :func:`fp8_fp4_paged_mqa_logits`) is validated; the plan is per query row either way.
    """
    _check_indices("get_paged_mqa_logits_metadata", indices, context_lens.shape[0])
    if block_kv <= 0 or num_sms <= 0:
        raise ValueError(f"dsv4.deep_gemm.get_paged_mqa_logits_metadata: block_kv and num_sms must be positive, "
                         f"got {block_kv} and {num_sms}")
    lens = context_lens.reshape(-1).long().clamp(min=0).cpu()
    segments = (lens + SPLIT_KV - 1) // SPLIT_KV
    ends = torch.cumsum(segments, 0)
    starts = ends - segments
    total = int(ends[-1]) if lens.numel() else 0
    firsts = torch.arange(num_sms + 1) * total // num_sms  # segment where worker s starts
    rows = torch.searchsorted(ends, firsts, right=True)
    # A worker past the last row starts at segment `total`: its offset is 0.
    offsets = firsts - torch.cat([starts, torch.tensor([total])])[rows]
    return torch.stack([rows, offsets], dim=1).to(torch.int32).to(context_lens.device)


def fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged decode logits.

    q e4m3 ``[B, next_n, H, 128]``; kv_cache ``[num_blocks, block_kv, 1, 132]`` uint8; weights fp32
    ``[B*next_n, H]``; context_lens int32 ``[B]`` or ``[B, next_n]``; block_table int32 ``[B, P]``;
    schedule_meta from :func:`get_paged_mqa_logits_metadata`. Returns fp32 ``[B*next_n, max_context_len]``.
    ``indices``: varlen rows, as :func:`fp8_fp4_paged_mqa_logits`.
    """
    _check_indices("fp8_paged_mqa_logits", indices, q.shape[0], q.shape[1] if q.dim() == 4 else 1)
    if kv_cache.dim() != 4:
        raise ValueError(f"dsv4.deep_gemm.fp8_paged_mqa_logits: kv_cache must be [num_blocks, block_kv, 1, D + 4], "
                         f"got shape {list(kv_cache.shape)}")
    return ops.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, kv_cache.shape[1],
                                    max_context_len, clean_logits, schedule_meta)


def _packed_fp4(fn: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """MXFP4 codes as uint8 bytes (DeepGEMM passes them as int8, uint8 or a packed-fp4 dtype)."""
    if t.element_size() != 1 or t.dtype == torch.float8_e4m3fn:
        raise ValueError(f"dsv4.deep_gemm.{fn}: {name} must hold packed e2m1 bytes (uint8 or int8), got "
                         f"{str(t.dtype).removeprefix('torch.')}")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _ue8m0_bytes(fn: str, name: str, sf: torch.Tensor, lead: tuple, dim: int) -> torch.Tensor:
    """UE8M0 scales as uint8 ``[*lead, dim / 32]``: DeepGEMM's packed int32 ``[*lead]`` (byte j of each word is the
    scale of dims 32j .. 32j + 31; words padded past dim / 32) or uint8 ``[*lead, dim / 32]`` as is."""
    blocks = dim // 32
    if sf.dtype == torch.int32 and tuple(sf.shape) == tuple(lead):
        return sf.contiguous().view(torch.uint8).reshape(*lead, 4)[..., :blocks]
    if sf.dtype == torch.uint8 and tuple(sf.shape) == (*lead, blocks):
        return sf
    raise ValueError(f"dsv4.deep_gemm.{fn}: {name} must be packed int32 {list(lead)} or uint8 "
                     f"{[*lead, blocks]} UE8M0 scales, got {str(sf.dtype).removeprefix('torch.')} {list(sf.shape)}")


def _split_q(fn: str, q) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values, scale bytes or None) of DeepGEMM's ``q = (values, scales or None)``."""
    if not isinstance(q, (tuple, list)) or len(q) != 2:
        raise ValueError(f"dsv4.deep_gemm.{fn}: q must be a pair (values, scales or None), got {type(q).__name__}")
    values, scales = q
    if scales is None:
        return values, None
    values = _packed_fp4(fn, "q values", values)
    return values, _ue8m0_bytes(fn, "q scales", scales, tuple(values.shape[:-1]), 2 * values.shape[-1])


def fp8_fp4_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seq_len_k_start: torch.Tensor,
    cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
    logits_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Ragged prefill logits over fp8 or MXFP4 keys with fp8 or MXFP4 queries (DeepGEMM's unified API).

    q = (e4m3 ``[M, H, D]``, None) or (packed e2m1 ``[M, H, D/2]``, UE8M0 scales); kv = (e4m3 ``[N, D]``, fp32
    ``[N]``) or (packed e2m1 ``[N, D/2]``, UE8M0 scales). Otherwise as :func:`fp8_mqa_logits`; ``logits_dtype``
    float32 or bfloat16 (the fp32 logits rounded).
    """
    fn = "fp8_fp4_mqa_logits"
    if max_seqlen_k > 0 and clean_logits:
        raise ValueError(f"dsv4.deep_gemm.{fn}: clean_logits must be False with max_seqlen_k > 0")
    values, q_scale = _split_q(fn, q)
    k, k_scale = kv
    dim = values.shape[-1] * (1 if q_scale is None else 2)
    key_format = "fp8" if k.dtype == torch.float8_e4m3fn else "mxfp4"
    if key_format == "mxfp4":
        k = _packed_fp4(fn, "kv values", k)
        k_scale = _ue8m0_bytes(fn, "kv scales", k_scale, (k.shape[0],), dim)
    logits = ops.fp8_mqa_logits(values, k, k_scale, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                                q_scale=q_scale, key_format=key_format)
    return _logits_dtype(fn, _compressed_columns(logits, cu_seq_len_k_start, max_seqlen_k), logits_dtype)


def _logits_dtype(fn: str, logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dsv4.deep_gemm.{fn}: logits_dtype must be float32 or bfloat16, got {dtype}")
    return logits if dtype == torch.float32 else logits.to(dtype)


def fp8_fp4_paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    logits_dtype: torch.dtype = torch.float32,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged decode logits over an fp8 or MXFP4 indexer cache (DeepGEMM's unified API).

    q = (e4m3 ``[B, next_n, H, 128]``, None) or (packed e2m1 ``[B, next_n, H, 64]``, UE8M0 scales: packed int32
    ``[B, next_n, H]`` or uint8 ``[B, next_n, H, 4]``); kv_cache ``[num_blocks, block_kv, 1, 132 or 68]`` uint8
    (the last dim names the key format). ``indices``: varlen rows (next_n 1, one block-table row and length per
    query row) with the request of each row, int32 ``[B]``; validated, and it does not change the logits (see
    ``_check_indices``). Otherwise as :func:`fp8_paged_mqa_logits`.
    """
    fn = "fp8_fp4_paged_mqa_logits"
    values, q_scale = _split_q(fn, q)
    if kv_cache.dim() != 4 or kv_cache.shape[-1] not in INDEXER_KEY_FORMAT_OF_ENTRY_BYTES:
        raise ValueError(f"dsv4.deep_gemm.{fn}: kv_cache must be [num_blocks, block_kv, 1, 132 (fp8) or 68 (mxfp4)], "
                         f"got shape {list(kv_cache.shape)}")
    _check_indices(fn, indices, values.shape[0], values.shape[1] if values.dim() == 4 else 1)
    logits = ops.fp8_paged_mqa_logits(values, kv_cache, weights, context_lens, block_table, kv_cache.shape[1],
                                      max_context_len, clean_logits, schedule_meta, q_scale=q_scale,
                                      key_format=INDEXER_KEY_FORMAT_OF_ENTRY_BYTES[kv_cache.shape[-1]])
    return _logits_dtype(fn, logits, logits_dtype)
