"""Dense float reference of a DeepSeek-V4 attention layer: the same math from a request's raw token sequence.

No caches, no metadata: fp32 projections of every token of the request, compressed entries pooled
from their windows, the indexer scored in float, and masked dense attention over ``[raw tokens |
compressed entries]``. Against the layer, the expected differences are the fp8 storage of the
window/compressed/indexer caches (a few percent), bf16 projections, and (C4A, when more than topk
entries exist) near-tied indexer scores that fp8 and float rank differently. With
``fp8_storage=True`` the keys and the indexer query take the caches' exact fp8 round trip, leaving
only the bf16 projections as a difference (a tighter check).
"""

from __future__ import annotations

import torch

from ..cache import compressor_coff
from ..constants import C4_RATIO, INDEXER_HEAD_DIM
from . import quant
from .indexer import indexer_q_rope_quant
from .rope_slots import apply_rope


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    normed = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    return normed if weight is None else normed * weight


# Layer vs this reference: fp8 keys and bf16 projections cost a few percent (measured 3-4 % relative error,
# per-token cosine above 0.995, with 4 and with 64 heads); a wrong slot, position or weight costs tens of percent.
MIN_COSINE = 0.99  # per token
MAX_RELATIVE_ERROR = 0.06  # Frobenius norm over all compared tokens
MAX_RELATIVE_ERROR_FP8_STORAGE = 0.03  # against ``fp8_storage=True`` (only the bf16 projections differ)


def agreement(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(smallest per-row cosine similarity, relative Frobenius error) of two ``[rows, hidden]`` outputs."""
    cosine = torch.nn.functional.cosine_similarity(actual.float(), expected.float(), dim=-1)
    return float(cosine.min()), float((actual.float() - expected).norm() / expected.norm())


def model1_round_trip(rows: torch.Tensor) -> torch.Tensor:
    """Rows ``[N, 512]`` as the fp8_ds_mla cache returns them."""
    return quant.model1_unpack(*quant.model1_pack(rows))


def indexer_round_trip(rows: torch.Tensor) -> torch.Tensor:
    """Rows ``[N, 128]`` as the indexer K cache returns them (codes times the power-of-two scale)."""
    codes, scales = quant.indexer_k_pack(rows)
    return quant.decode_e4m3(codes) * scales[:, None]


def _no_rounding(rows: torch.Tensor) -> torch.Tensor:
    return rows


def compressed_entries(x: torch.Tensor, weights: dict, prefix: str, ratio: int, head_dim: int, eps: float,
                       cos_sin: torch.Tensor) -> torch.Tensor:
    """fp32 ``[L // R, head_dim]``: entry c pools positions ``R*c + R - coff*R .. R*c + R - 1`` per channel
    (softmax of score + ape), the older group's rows from the first projection half, then RMSNorm and
    RoPE at ``c * R``."""
    length = x.shape[0]
    coff = compressor_coff(ratio)
    kv, score = (x @ weights[f"{prefix}wkv_wgate"].T).split(coff * head_dim, dim=-1)
    score = score + weights[f"{prefix}ape"][torch.arange(length) % ratio]
    count, window = length // ratio, coff * ratio
    rows = torch.arange(count)[:, None] * ratio + ratio - window + torch.arange(window)  # [count, window]
    valid = rows >= 0
    half = (torch.arange(window) >= ratio).long() if coff == 2 else torch.zeros(window, dtype=torch.long)
    columns = (half[:, None] * head_dim + torch.arange(head_dim)).expand(count, window, head_dim)
    kv_rows = kv[rows.clamp(min=0)].gather(-1, columns)
    score_rows = score[rows.clamp(min=0)].gather(-1, columns).masked_fill(~valid[..., None], float("-inf"))
    pooled = (torch.softmax(score_rows, dim=1) * kv_rows).sum(dim=1)
    normed = _rms(pooled, weights[f"{prefix}norm"], eps)
    return apply_rope(normed, torch.arange(count) * ratio, cos_sin)


def indexer_scores(layer, hidden: torch.Tensor, query_positions: torch.Tensor, fp8_storage: bool = False
                   ) -> torch.Tensor:
    """fp32 ``[Q, L // 4]`` lightning-indexer scores of a C4A ``layer``'s compressed entries for the tokens at
    ``query_positions`` of one request (inputs ``hidden [L, hidden_size]``); entries a query cannot see are -inf."""
    config = layer.config
    weights = {name: value.float().cpu() for name, value in layer.state_dict().items()}
    x, queries = hidden.float().cpu(), query_positions.long().cpu()
    qr = _rms((x[queries] @ weights["wqa_wkv"].T)[:, : config.q_lora_rank], weights["q_norm"], config.rms_norm_eps)
    return _indexer_scores(x, qr, weights, queries, config, layer.cos_sin_cache.cpu(), fp8_storage)


def _indexer_scores(x, qr, weights, queries, config, cos_sin, fp8_storage) -> torch.Tensor:
    """:func:`indexer_scores` from the fp32 inputs, weights and normed q latents of the queries."""
    heads, dim = config.index_n_heads, INDEXER_HEAD_DIM
    keys = compressed_entries(x, weights, "indexer.compressor.", C4_RATIO, dim, config.rms_norm_eps, cos_sin)
    q = (qr @ weights["indexer.wq_b"].T).view(-1, heads, dim)
    head_weights = x[queries] @ weights["indexer.weights_proj"].T
    if fp8_storage:
        q_fp8, head_weights = indexer_q_rope_quant(q, queries, cos_sin, head_weights, dim**-0.5, heads**-0.5)
        q, keys = q_fp8.float(), indexer_round_trip(keys)
    else:
        q, head_weights = apply_rope(q, queries, cos_sin), head_weights * dim**-0.5 * heads**-0.5
    scores = torch.einsum("qh,qhc->qc", head_weights, torch.relu(torch.einsum("qhd,cd->qhc", q, keys)))
    visible = torch.arange(keys.shape[0]) < ((queries + 1) // C4_RATIO)[:, None]
    return scores.masked_fill(~visible, float("-inf"))


def top_entries(scores: torch.Tensor, k: int) -> torch.Tensor:
    """bool ``[Q, count]``: each row's k best visible entries (all of them when it sees k or fewer)."""
    chosen = torch.zeros(scores.shape, dtype=torch.bool)
    if scores.shape[1]:
        chosen.scatter_(1, scores.topk(min(k, scores.shape[1]), dim=-1).indices, True)
    return chosen & (scores > float("-inf"))


def selection_mask(indices: torch.Tensor, count: int) -> torch.Tensor:
    """bool ``[Q, count]`` from int ``[Q, k]`` entry indices (-1 pads)."""
    indices = indices.long().cpu()
    chosen = torch.zeros(indices.shape[0], count + 1, dtype=torch.bool)
    chosen.scatter_(1, torch.where(indices >= 0, indices, count), True)
    return chosen[:, :count]


def dense_attention(layer, hidden: torch.Tensor, query_positions: torch.Tensor, fp8_storage: bool = False,
                    selection: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 ``[Q, hidden_size]`` outputs of ``layer`` (a :class:`dsv4.model.layer.DeepseekV4Attention`) for the tokens
    at ``query_positions`` of one request whose token inputs are ``hidden [L, hidden_size]`` (positions 0..L-1).

    A C4A layer attends the top-k of its float indexer scores, or, given ``selection`` (int ``[Q, k]`` entry
    indices, -1 pads: e.g. the kernels' choice), exactly those entries."""
    config, ratio = layer.config, layer.compress_ratio
    weights = {name: value.float().cpu() for name, value in layer.state_dict().items()}  # computed on the CPU
    cos_sin, eps = layer.cos_sin_cache.cpu(), config.rms_norm_eps
    stored = model1_round_trip if fp8_storage else _no_rounding
    x = hidden.float().cpu()
    length, queries = x.shape[0], query_positions.long().cpu()
    qr, kv = (x @ weights["wqa_wkv"].T).split([config.q_lora_rank, config.head_dim], dim=-1)
    qr, kv = _rms(qr, weights["q_norm"], eps), _rms(kv, weights["kv_norm"], eps)
    q = (qr[queries] @ weights["wq_b"].T).view(len(queries), config.num_attention_heads, config.head_dim)
    q = apply_rope(_rms(q, None, eps), queries, cos_sin)
    keys = stored(apply_rope(kv, torch.arange(length), cos_sin))
    raw = torch.arange(length)
    attended = (raw <= queries[:, None]) & (raw > queries[:, None] - config.sliding_window)
    if ratio > 1:
        entries = stored(compressed_entries(x, weights, "compressor.", ratio, config.head_dim, eps, cos_sin))
        count = entries.shape[0]
        if ratio == C4_RATIO and selection is not None:
            chosen = selection_mask(selection, count)
        elif ratio == C4_RATIO:
            scores = _indexer_scores(x, qr[queries], weights, queries, config, cos_sin, fp8_storage)
            chosen = top_entries(scores, config.index_topk)
        else:
            chosen = torch.arange(count) < ((queries + 1) // ratio)[:, None]
        keys, attended = torch.cat([keys, entries]), torch.cat([attended, chosen], dim=1)
    return attend_and_project(q, keys, attended, weights, config, queries, cos_sin).to(hidden.device)


def attend_and_project(q: torch.Tensor, keys: torch.Tensor, attended: torch.Tensor, weights: dict, config,
                       queries: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """fp32 ``[Q, hidden]``: masked softmax attention of q ``[Q, H, 512]`` over ``keys [K, 512]`` (``attended``
    bool ``[Q, K]``) with the sink, inverse RoPE at the query positions, grouped ``wo_a`` and ``wo_b``."""
    scores = torch.einsum("qhd,kd->qhk", q, keys) * config.head_dim**-0.5
    scores = scores.masked_fill(~attended[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("qhk,kd->qhd", torch.softmax(scores, dim=-1), keys)
    out = out / (1 + torch.exp(weights["attn_sink"] - lse))[..., None]
    out = apply_rope(out, queries, cos_sin, inverse=True)
    groups = config.o_groups
    grouped = out.reshape(len(queries), groups, -1)
    low_rank = torch.einsum("qgk,gok->qgo", grouped, weights["wo_a"].view(groups, config.o_lora_rank, -1))
    return low_rank.reshape(len(queries), -1) @ weights["wo_b"].T
