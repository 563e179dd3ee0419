"""Reference DeepSeek-V4 attention layer composed of the dsv4 ops and metadata builders.

Per step (T tokens, CPU flow of the reference notes, section 4.2):
1. ``qr, kv = x @ wqa_wkv``; RMSNorm both; ``q = qr @ wq_b`` as ``[T, H, 512]``.
2. ``qnorm_rope_kv_insert``: per-head RMSNorm + RoPE of q; RoPE + fp8 insert of kv into the window cache.
3. C4A: the indexer (its compressor into the indexer K cache, then q RoPE/quant, paged logits and top-k,
   or the short-context fill ``0 .. n-1`` when ``max_seq_len // 4 <= topk``); C4A/C128A: the main
   compressor (``save_partial_states`` + ``compress_norm_rope_store``).
4. ``sparse_mla_decode``: window slots as the main set, compressed slots (C4A top-k through
   ``map_local_to_global_slots``, C128A all entries) as the extra set, one softmax with the sink.
5. ``inverse_rope``, grouped ``wo_a`` (``o_groups`` groups of heads), ``wo_b``.

Weights are random with a seed or loaded from a state dict (:meth:`torch.nn.Module.load_state_dict`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import ops
from ..cache import compressor_coff
from ..constants import C4_RATIO, INDEXER_HEAD_DIM, SWA_BLOCK_SIZE
from ..metadata import LayerType, all_compressed_local_indices, compress_ratio_of, layer_type_for_ratio
from ..rope import rope_cos_sin_cache
from .attention_step import StepMetadata
from .cache_manager import CacheGroup, LayerCaches, PagedCacheManager, ScheduledBatch
from .config import DeepseekV4AttentionConfig
from .timing import NULL_TIMER

__all__ = ["DeepseekV4Attention", "PagedCacheManager", "ScheduledBatch", "rms_norm"]

NORM_WEIGHT_SPREAD = 0.2  # random RMSNorm weights lie in [0.9, 1.1]
APE_STD = 0.5  # random compressor position embeddings (shift the pooling softmax per group slot)
SINK_MEAN, SINK_STD = 4.0, 2.0  # random sinks near the typical log-sum-exp, so they visibly matter


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in fp32, returned in x's dtype (weight-free when weight is None)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + eps)
    return (normed if weight is None else normed * weight.float()).to(x.dtype)


def check_layer_inputs(layer, hidden_states: torch.Tensor, step: StepMetadata, caches: LayerCaches) -> None:
    """The step's token rows of the layer's hidden size, and caches of the layer's type."""
    if hidden_states.shape != (step.num_tokens, layer.config.hidden_size):
        raise ValueError(f"layer {layer.layer_id}: hidden_states must be [{step.num_tokens}, "
                         f"{layer.config.hidden_size}], got {list(hidden_states.shape)}")
    if caches.layer_type is not layer.layer_type:
        raise ValueError(f"layer {layer.layer_id} is {layer.layer_type.value}, its caches are "
                         f"{caches.layer_type.value}")


def project_inputs(layer, x: torch.Tensor, timer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(normed q latent ``qr``, normed ``kv`` ``[T, 512]``, q ``[T, H, 512]``) of a layer's inputs."""
    config = layer.config
    with timer("projections"):
        qr, kv = F.linear(x, layer.wqa_wkv).split([config.q_lora_rank, config.head_dim], dim=-1)
        qr = rms_norm(qr, layer.q_norm, config.rms_norm_eps)
        kv = rms_norm(kv, layer.kv_norm, config.rms_norm_eps)
        q = F.linear(qr, layer.wq_b).view(x.shape[0], config.num_attention_heads, config.head_dim)
    return qr, kv, q


def output_projection(layer, out: torch.Tensor, positions: torch.Tensor, timer) -> torch.Tensor:
    """Attention output ``[T, H, 512]`` -> bf16 ``[T, hidden]``: inverse RoPE, grouped ``wo_a``, ``wo_b``."""
    config, tokens = layer.config, out.shape[0]
    with timer("inverse_rope"):
        out = ops.inverse_rope(out, positions, layer.cos_sin_cache)
    with timer("o_proj"):
        groups = config.o_groups
        grouped = out.view(tokens, groups, -1).transpose(0, 1)
        low_rank = torch.bmm(grouped, layer.wo_a.view(groups, config.o_lora_rank, -1).transpose(1, 2))
        return F.linear(low_rank.transpose(0, 1).reshape(tokens, -1), layer.wo_b)


def global_slots(local: torch.Tensor, meta, compress_ratio: int, timer) -> torch.Tensor | None:
    """Global slots of request-local compressed entries ``[T, n]`` through the compressed group's table (None for
    n = 0)."""
    if local.shape[1] == 0:
        return None
    with timer("map_local_to_global_slots"):
        return ops.map_local_to_global_slots(local, meta.req_id_per_token, meta.block_table,
                                             meta.block_size // compress_ratio)


def attend(layer, q: torch.Tensor, step: StepMetadata, caches: LayerCaches, compressed: torch.Tensor | None,
           timer) -> torch.Tensor:
    """bf16 ``[T, H, 512]``: one softmax over the window (main set) and the ``compressed`` slots (extra set), in the
    caches' records."""
    swa = step.swa
    window = torch.cat([swa.decode_swa_indices, swa.prefill_swa_indices])
    window_lens = torch.cat([swa.decode_swa_lens, swa.prefill_swa_lens])
    extra = {} if compressed is None else {
        "extra_kv_cache": caches.compressed, "extra_indices": compressed.unsqueeze(1),
        "extra_block_size": caches.compressed_block_size, "extra_layout": caches.compressed_layout}
    with timer("sparse_mla_decode"):
        out, _ = ops.sparse_mla_decode(q.unsqueeze(1), caches.swa, window, SWA_BLOCK_SIZE, topk_length=window_lens,
                                       attn_sink=layer.attn_sink, sm_scale=layer.config.head_dim**-0.5,
                                       layout=caches.window_layout, **extra)
    return out[:, 0]


def attention_buffers(layer: torch.nn.Module, config: DeepseekV4AttentionConfig, device) -> None:
    """The weights every attention layer has: q/kv projections and norms, q up-projection, sinks, grouped output."""
    heads, dim, groups = config.num_attention_heads, config.head_dim, config.o_groups
    _buffers(layer, {
        "wqa_wkv": ((config.q_lora_rank + dim, config.hidden_size), torch.bfloat16),
        "q_norm": ((config.q_lora_rank,), torch.float32),
        "kv_norm": ((dim,), torch.float32),
        "wq_b": ((heads * dim, config.q_lora_rank), torch.bfloat16),
        "attn_sink": ((heads,), torch.float32),
        "wo_a": ((groups * config.o_lora_rank, heads // groups * dim), torch.bfloat16),
        "wo_b": ((config.hidden_size, groups * config.o_lora_rank), torch.bfloat16),
    }, device)


def layer_rope_table(config: DeepseekV4AttentionConfig, compressed: bool, max_model_len: int, device) -> torch.Tensor:
    """A layer's RoPE table: compressed layers use compress_rope_theta with the YaRN scaling, window-only ones
    rope_theta without."""
    theta = config.compress_rope_theta if compressed else config.rope_theta
    return rope_cos_sin_cache(max_model_len, config.qk_rope_head_dim, theta,
                              config.rope_scaling if compressed else None).to(device)


@torch.no_grad()
def randomize_weights(layer: torch.nn.Module, seed: int) -> None:
    """Deterministic random weights: linear maps ~ N(0, 1/fan_in), norms near 1, sinks near a typical lse."""
    generator = torch.Generator().manual_seed(seed)
    for name, buffer in layer.named_buffers():
        leaf = name.rsplit(".", 1)[-1]
        values = torch.empty(buffer.shape, dtype=buffer.dtype)  # drawn on the CPU: the same weights on any device
        if leaf in ("norm", "q_norm", "kv_norm", "k_norm"):
            values.uniform_(1 - NORM_WEIGHT_SPREAD / 2, 1 + NORM_WEIGHT_SPREAD / 2, generator=generator)
        elif leaf == "ape":
            values.normal_(0.0, APE_STD, generator=generator)
        elif leaf == "attn_sink":
            values.normal_(SINK_MEAN, SINK_STD, generator=generator)
        else:
            values.normal_(0.0, buffer.shape[1] ** -0.5, generator=generator)
        buffer.copy_(values)


def _buffers(module: torch.nn.Module, specs: dict[str, tuple[tuple[int, ...], torch.dtype]], device) -> None:
    for name, (shape, dtype) in specs.items():
        module.register_buffer(name, torch.empty(shape, dtype=dtype, device=device))


class Compressor(torch.nn.Module):
    """Projection to ``[kv | gate score]`` (``coff * head_dim`` each), position embedding, output norm."""

    def __init__(self, hidden_size: int, head_dim: int, compress_ratio: int, device) -> None:
        super().__init__()
        self.compress_ratio = compress_ratio
        self.width = compressor_coff(compress_ratio) * head_dim
        _buffers(self, {"wkv_wgate": ((2 * self.width, hidden_size), torch.bfloat16),
                        "ape": ((compress_ratio, self.width), torch.float32),
                        "norm": ((head_dim,), torch.float32)}, device)


class Indexer(torch.nn.Module):
    """Lightning indexer of a C4A layer: query projection, per-head weights, its own head-128 compressor."""

    def __init__(self, config: DeepseekV4AttentionConfig, device) -> None:
        super().__init__()
        heads = config.index_n_heads
        _buffers(self, {"wq_b": ((heads * INDEXER_HEAD_DIM, config.q_lora_rank), torch.bfloat16),
                        "weights_proj": ((heads, config.hidden_size), torch.bfloat16)}, device)
        self.compressor = Compressor(config.hidden_size, INDEXER_HEAD_DIM, C4_RATIO, device)


class DeepseekV4Attention(torch.nn.Module):
    """One DeepSeek-V4 attention layer (``config.compress_ratios[layer_id]`` decides its type)."""

    def __init__(self, config: DeepseekV4AttentionConfig, layer_id: int, *, max_model_len: int,
                 max_num_batched_tokens: int, seed: int = 0, state_dict: dict | None = None,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.config, self.layer_id = config, layer_id
        self.layer_type = layer_type_for_ratio(config.compress_ratios[layer_id])
        self.compress_ratio = compress_ratio_of(self.layer_type)
        dim = config.head_dim
        attention_buffers(self, config, device)
        self.compressor = (Compressor(config.hidden_size, dim, self.compress_ratio, device)
                           if self.layer_type is not LayerType.SWA_ONLY else None)
        self.indexer = Indexer(config, device) if self.layer_type is LayerType.C4A else None
        if state_dict is None:
            self.randomize(seed)
        else:
            self.load_state_dict(state_dict)
        self.cos_sin_cache = layer_rope_table(config, self.layer_type is not LayerType.SWA_ONLY, max_model_len, device)
        self.topk_indices_buffer = (torch.full((max_num_batched_tokens, config.index_topk), -1, dtype=torch.int32,
                                               device=device) if self.indexer is not None else None)

    def randomize(self, seed: int) -> None:
        randomize_weights(self, seed)

    def forward(self, hidden_states: torch.Tensor, step: StepMetadata, caches: LayerCaches,
                timer=NULL_TIMER) -> torch.Tensor:
        """bf16 ``[T, hidden]`` -> bf16 ``[T, hidden]`` for the step's tokens; writes this layer's caches."""
        check_layer_inputs(self, hidden_states, step, caches)
        config, x, positions = self.config, hidden_states, step.positions
        qr, kv, q = project_inputs(self, x, timer)
        with timer("qnorm_rope_kv_insert"):
            q = ops.qnorm_rope_kv_insert(q, kv, positions, self.cos_sin_cache, step.swa.slot_mapping, caches.swa,
                                         SWA_BLOCK_SIZE, config.rms_norm_eps)
        if self.indexer is not None:
            self._index(x, qr, step, caches, timer)
        if self.compressor is not None:
            self._compress(x, positions, self.compressor, caches.compressor_state, step.compressor[self._state_group],
                           step.compressed[self.layer_type].slot_mapping, caches.compressed,
                           caches.compressed_block_size, ops.compress_norm_rope_store, timer)
        return output_projection(self, self._attend(q, step, caches, timer), positions, timer)

    @property
    def _state_group(self) -> CacheGroup:
        return CacheGroup.C4_STATE if self.layer_type is LayerType.C4A else CacheGroup.C128_STATE

    def _compress(self, x, positions, compressor: Compressor, state_cache, state_meta, target_slots, target_cache,
                  target_block_size, store, timer) -> None:
        """State rows of every token, then the entries completed in this step into the target cache."""
        with timer("projections"):
            kv, score = F.linear(x, compressor.wkv_wgate).float().split(compressor.width, dim=-1)
        with timer("save_partial_states"):
            ops.save_partial_states(kv, score, compressor.ape, positions, state_cache, state_meta.slot_mapping)
        with timer(store.__name__):
            store(state_cache, state_meta.window_slots, positions, target_slots, compressor.norm,
                  self.config.rms_norm_eps, self.cos_sin_cache, target_cache, target_block_size,
                  compressor.compress_ratio)

    def _index(self, x, qr, step: StepMetadata, caches: LayerCaches, timer) -> None:
        """Fills the top-k buffer rows of the step with request-local compressed indices (-1 padded)."""
        meta, ratio, topk = step.indexer, self.compress_ratio, self.config.index_topk
        positions, tokens, heads = step.positions, step.num_tokens, self.config.index_n_heads
        short_context = meta.max_seq_len // ratio <= topk  # every token sees at most topk entries: take them all
        if not short_context:
            with timer("projections"):
                index_q = F.linear(qr, self.indexer.wq_b).view(tokens, heads, INDEXER_HEAD_DIM)
                weights = F.linear(x, self.indexer.weights_proj).float()
            with timer("indexer_q_rope_quant"):
                q_fp8, weights = ops.indexer_q_rope_quant(index_q, positions, self.cos_sin_cache, weights,
                                                          INDEXER_HEAD_DIM**-0.5, heads**-0.5)
        self._compress(x, positions, self.indexer.compressor, caches.indexer_state,
                       step.compressor[CacheGroup.C4_INDEXER_STATE], meta.slot_mapping, caches.indexer_k,
                       caches.compressed_block_size, ops.compress_norm_rope_store_indexer, timer)
        rows = self.topk_indices_buffer[:tokens]
        if short_context:
            with timer("short_context_fill"):
                rows.copy_(all_compressed_local_indices(positions, ratio, topk))
            return
        rows.fill_(-1)
        most_entries = meta.max_seq_len // ratio
        if meta.decode is not None:
            if meta.decode.seq_lens.shape[1] != 1 or meta.num_decode_tokens != meta.num_decodes:
                raise ValueError("the CPU indexer takes one query token per decode request (no speculative decode)")
            decode = slice(0, meta.num_decode_tokens)
            self._select(q_fp8[decode], weights[decode], meta.decode.seq_lens[:, 0], meta.decode.block_table,
                         most_entries, rows[decode], caches, timer)
        for chunk in meta.prefill.chunks if meta.prefill is not None else ():
            span = slice(chunk.token_start, chunk.token_end)
            requests = step.compressed[LayerType.C4A].req_id_per_token[span] - chunk.req_start
            with timer("fp8_paged_mqa_topk"):  # fused: no [tokens x context] logits in prefill
                ops.fp8_paged_mqa_topk(q_fp8[span], caches.indexer_k, weights[span],
                                       chunk.cu_seqlen_ke - chunk.cu_seqlen_ks, chunk.block_table, requests,
                                       caches.compressed_block_size, topk, out=rows[span])

    def _select(self, q_fp8, weights, context_lens, page_table, most_entries, out, caches, timer) -> None:
        """Paged logits over each token's ``context_lens`` entries, then its top-k into ``out``."""
        with timer("fp8_paged_mqa_logits"):
            logits = ops.fp8_paged_mqa_logits(q_fp8.unsqueeze(1), caches.indexer_k, weights, context_lens, page_table,
                                              caches.compressed_block_size, most_entries, clean_logits=False)
        with timer("topk_transform"):
            raw, _ = ops.topk_transform(logits, context_lens, self.config.index_topk)
            out.copy_(raw)

    def _compressed_slots(self, step: StepMetadata, timer) -> torch.Tensor | None:
        """Global slots ``[T, n]`` of the compressed entries each token attends (None when no token has any).

        Columns are cut to the most entries any token of the step can see (valid entries form a prefix).
        """
        if self.layer_type is LayerType.SWA_ONLY:
            return None
        meta = step.compressed[self.layer_type]
        most_entries = meta.max_seq_len // self.compress_ratio
        if self.layer_type is LayerType.C4A:
            local = self.topk_indices_buffer[: step.num_tokens, : min(self.config.index_topk, most_entries)]
        else:
            local = all_compressed_local_indices(step.positions, self.compress_ratio, most_entries)
        return global_slots(local, meta, self.compress_ratio, timer)

    def _attend(self, q, step: StepMetadata, caches: LayerCaches, timer) -> torch.Tensor:
        return attend(self, q, step, caches, self._compressed_slots(step, timer), timer)
