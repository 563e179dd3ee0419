"""Dense float reference of a DeepSeek-V4.1 attention layer, from the raw token inputs of its source layers.

A V4.1 layer reads caches other layers wrote: its compressed entries (and the indexer keys) come from its kv
source's compressor over that layer's inputs, its selection from its index source. So each function here takes
the layer objects and the inputs of the layers involved. No caches, no metadata: fp32 projections, entries
pooled in float, keys from the float latent, masked dense attention over ``[raw tokens | compressed entries]``.
Against the layer the expected differences are the fp8 storage of the caches and the bf16 projections (the
tolerances of :mod:`.layer`).
"""

from __future__ import annotations

import torch

from ..constants import INDEXER_HEAD_DIM
from ..metadata import LayerType
from . import indexer as reference_indexer
from . import quant
from .layer import _rms, attend_and_project, selection_mask
from .rope_slots import apply_rope


def _weights(layer) -> dict[str, torch.Tensor]:
    return {name: value.float().cpu() for name, value in layer.state_dict().items()}


def compressed_latents(source, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 ``[L // R, 512]`` normed entries of a kv-source layer before their RoPE: ratio 1 the RMSNorm of each
    projected row; ratio 2 the per-channel softmax (over the pair's gate scores) of positions ``2c, 2c + 1``."""
    weights, ratio, dim = _weights(source), source.compress_ratio, source.config.head_dim
    projected = hidden.float().cpu() @ weights["compressor.wkv_wgate"].T
    if ratio == 1:
        pooled = projected
    else:
        count = projected.shape[0] // ratio
        kv, score = projected[: count * ratio].split(dim, dim=-1)
        kv, score = kv.view(count, ratio, dim), score.view(count, ratio, dim)
        pooled = (torch.softmax(score, dim=1) * kv).sum(dim=1)
    return _rms(pooled, weights["compressor.norm"], source.config.rms_norm_eps)


def compressed_entries(source, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 ``[L // R, 512]`` compressed entries: the latents rotated at ``c * R``."""
    latents = compressed_latents(source, hidden)
    positions = torch.arange(latents.shape[0]) * source.compress_ratio
    return apply_rope(latents, positions, source.cos_sin_cache.cpu())


def index_keys(source, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 ``[L // R, 128]`` indexer keys: ``k_norm(wk(latent))`` rotated (dims 64..127) at ``c * R``."""
    weights = _weights(source)
    latents = compressed_latents(source, hidden)
    keys = _rms(latents @ weights["indexer.wk"].T, weights["indexer.k_norm"], source.config.rms_norm_eps)
    return apply_rope(keys, torch.arange(keys.shape[0]) * source.compress_ratio, source.cos_sin_cache.cpu())


def _stored_keys(keys: torch.Tensor, key_format: str) -> torch.Tensor:
    """Keys as the indexer K cache of ``key_format`` returns them (bf16 rounding, then the format's round trip)."""
    rounded = keys.bfloat16().float()
    if key_format == "mxfp4":
        return quant.mxfp4_unpack(*quant.mxfp4_pack(rounded))
    codes, scales = quant.indexer_k_pack(rounded)
    return quant.decode_e4m3(codes) * scales[:, None]


def _stored_queries(q, queries, cos_sin, head_weights, key_format) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotated queries as the kernels quantize them, head weights with the scales the kernels fold in)."""
    dim, heads = q.shape[-1], q.shape[1]
    if key_format == "mxfp4":
        codes, scales, weights = reference_indexer.indexer_q_rope_quant_mxfp4(q, queries, cos_sin, head_weights,
                                                                            dim**-0.5, heads**-0.5)
        return reference_indexer.decode_query(codes, scales), weights
    q_fp8, weights = reference_indexer.indexer_q_rope_quant(q, queries, cos_sin, head_weights, dim**-0.5,
                                                            heads**-0.5)
    return q_fp8.float(), weights


def indexer_scores(index_layer, index_hidden: torch.Tensor, source, source_hidden: torch.Tensor,
                   query_positions: torch.Tensor, allowed: torch.Tensor | None = None,
                   stored: bool = False) -> torch.Tensor:
    """fp32 ``[Q, L // R]`` indexer scores of an index-source layer over its kv source's keys for the tokens at
    ``query_positions``; entries a query cannot see, or outside ``allowed`` (bool ``[Q, L // R]``), are -inf.
    ``stored``: keys and queries take the exact round trip of the layer's key format (fp8 or MXFP4), leaving only
    the bf16 projections as a difference (MXFP4 ranks near-tied entries too coarsely for a float comparison)."""
    config, weights = index_layer.config, _weights(index_layer)
    heads, dim, eps = config.index_n_heads, INDEXER_HEAD_DIM, config.rms_norm_eps
    x, queries = index_hidden.float().cpu(), query_positions.long().cpu()
    cos_sin = index_layer.cos_sin_cache.cpu()
    qr = _rms((x[queries] @ weights["wqa_wkv"].T)[:, : config.q_lora_rank], weights["q_norm"], eps)
    q = (qr @ weights["indexer.wq_b"].T).view(-1, heads, dim)
    head_weights = x[queries] @ weights["indexer.weights_proj"].T
    keys = index_keys(source, source_hidden)
    if stored:
        q, head_weights = _stored_queries(q, queries, cos_sin, head_weights, config.index_key_format)
        keys = _stored_keys(keys, config.index_key_format)
    else:
        q, head_weights = apply_rope(q, queries, cos_sin), head_weights * dim**-0.5 * heads**-0.5
    scores = torch.einsum("qh,qhc->qc", head_weights, torch.relu(torch.einsum("qhd,cd->qhc", q, keys)))
    visible = torch.arange(keys.shape[0]) < ((queries + 1) // index_layer.compress_ratio)[:, None]
    if allowed is not None:
        visible &= allowed
    return scores.masked_fill(~visible, float("-inf"))


def record_round_trip(rows: torch.Tensor, layout: str) -> torch.Tensor:
    """Rows ``[N, 512]`` as a cache of the V4.1 ``layout`` returns them (bf16 rounding, then the record's codes)."""
    pack, unpack = quant.RECORDS[layout][3:5]
    return unpack(*pack(rows.bfloat16().float()))


def dense_attention(layer, hidden: torch.Tensor, query_positions: torch.Tensor, source=None,
                    source_hidden: torch.Tensor | None = None, selection: torch.Tensor | None = None,
                    stored: bool = False) -> torch.Tensor:
    """fp32 ``[Q, hidden_size]`` outputs of a :class:`dsv4.model.layer_v41.DeepseekV41Attention` for the tokens at
    ``query_positions`` of one request (inputs ``hidden [L, hidden_size]``, positions 0..L-1). A compressed layer
    needs its kv ``source`` layer with that layer's inputs and the ``selection`` it attends (int ``[Q, k]`` entry
    indices, -1 pads: e.g. the kernels' choice, checked on its own against :func:`indexer_scores`). ``stored``:
    window keys and compressed entries take the exact round trip of the configuration's records (the fp4
    compressed record costs several percent on its own), leaving the bf16 projections as the difference."""
    config, weights = layer.config, _weights(layer)
    cos_sin, eps = layer.cos_sin_cache.cpu(), config.rms_norm_eps
    x = hidden.float().cpu()
    length, queries = x.shape[0], query_positions.long().cpu()
    qr, kv = (x @ weights["wqa_wkv"].T).split([config.q_lora_rank, config.head_dim], dim=-1)
    qr, kv = _rms(qr, weights["q_norm"], eps), _rms(kv, weights["kv_norm"], eps)
    q = (qr[queries] @ weights["wq_b"].T).view(len(queries), config.num_attention_heads, config.head_dim)
    q = apply_rope(q, queries, cos_sin)  # V4.1: no per-head RMSNorm of q
    keys = apply_rope(kv, torch.arange(length), cos_sin)
    if stored:
        keys = record_round_trip(keys, config.cache_record("window"))
    raw = torch.arange(length)
    attended = (raw <= queries[:, None]) & (raw > queries[:, None] - config.sliding_window)
    if layer.layer_type is not LayerType.SWA_ONLY:
        if source is None or source_hidden is None or selection is None:
            raise ValueError("dense_attention: a compressed V4.1 layer needs its kv source, that layer's inputs and "
                             "the selection it attends")
        entries = compressed_entries(source, source_hidden)
        if stored:
            entries = record_round_trip(entries, config.cache_record("compressed"))
        keys = torch.cat([keys, entries])
        attended = torch.cat([attended, selection_mask(selection, entries.shape[0])], dim=1)
    return attend_and_project(q, keys, attended, weights, config, queries, cos_sin).to(hidden.device)
