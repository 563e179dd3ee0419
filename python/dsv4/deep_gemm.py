"""DeepGEMM-compatible lightning-indexer API (``import dsv4.deep_gemm as deep_gemm``).

Same Python signatures and return conventions as DeepGEMM's ``fp8_mqa_logits``,
``fp8_paged_mqa_logits`` and ``get_paged_mqa_logits_metadata``, backed by ``torch.ops.dsv4``. The
paged KV cache is DeepGEMM's ``[num_blocks, block_kv, 1, head_dim + 4]`` uint8 view (``block_kv``
entries per page: their fp8 rows, then their fp32 scales; only ``stride(0)`` is free).
"""

from __future__ import annotations

import torch

from . import ops

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
    if max_seqlen_k <= 0:
        return logits
    # One extra -inf column stands for every key position past N.
    padded = torch.cat([logits, logits.new_full((logits.shape[0], 1), float("-inf"))], dim=1)
    columns = cu_seq_len_k_start.long()[:, None] + torch.arange(max_seqlen_k, device=q.device)
    return torch.gather(padded, 1, columns.clamp(0, logits.shape[1]))


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """Schedule of the paged logits: int32 ``[num_sms + 1, 2]``, row s = (query row, key segment) where
    worker s starts, splitting ``ceil(len / 256)`` segments per query row evenly (DeepGEMM's plan).

    The CPU kernel balances its own work and ignores it; the call is accepted for drop-in use.
    """
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
) -> torch.Tensor:
    """Paged decode logits.

    q e4m3 ``[B, next_n, H, 128]``; kv_cache ``[num_blocks, block_kv, 1, 132]`` uint8; weights fp32
    ``[B*next_n, H]``; context_lens int32 ``[B]`` or ``[B, next_n]``; block_table int32 ``[B, P]``;
    schedule_meta from :func:`get_paged_mqa_logits_metadata`. Returns fp32 ``[B*next_n, max_context_len]``.
    """
    if kv_cache.dim() != 4:
        raise ValueError(f"dsv4.deep_gemm.fp8_paged_mqa_logits: kv_cache must be [num_blocks, block_kv, 1, D + 4], "
                         f"got shape {list(kv_cache.shape)}")
    return ops.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, kv_cache.shape[1],
                                    max_context_len, clean_logits, schedule_meta)
