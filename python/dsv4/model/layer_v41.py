"""Reference DeepSeek-V4.1 attention layer composed of the dsv4 ops and metadata builders.

What changes from V4.0 (:mod:`.layer`), per step:
1. q has no per-head RMSNorm: ``qnorm_rope_kv_insert(q_norm=False)`` ropes q and writes the window cache in the
   V4.1 record.
2. A kv-source layer compresses (ratio 2: gated pooling of token pairs; ratio 1: the RMSNorm of each projected
   row, no gate) into its compressed cache, and turns the normed entry (the latent) into indexer keys:
   ``k = k_norm(wk(latent))``, RoPE at the group's first position, fp8 or MXFP4 keys.
3. An index-source layer scores the keys of its kv source and publishes its top-k; the candidate source also
   publishes the best blocks of ``candidate_block_size`` entries (block score: the largest logit, the newest
   block always kept), and the index layers after it choose inside those blocks.
4. Every compressed layer attends its window and the entries its index source selected, from its kv source's
   compressed cache.

Weights are random with a seed or loaded from a state dict (:meth:`torch.nn.Module.load_state_dict`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import ops
from ..constants import INDEXER_HEAD_DIM, SWA_BLOCK_SIZE
from ..metadata import LayerType, all_compressed_local_indices, compress_ratio_of
from .attention_step import StepMetadata
from .cache_manager import CacheGroup, LayerCaches
from .config import DeepseekV4AttentionConfig
from .layer import (
    _buffers,
    attend,
    attention_buffers,
    check_layer_inputs,
    global_slots,
    layer_rope_table,
    output_projection,
    project_inputs,
    randomize_weights,
)
from .timing import NULL_TIMER

STATE_GROUP = {LayerType.C1A: CacheGroup.C1_STATE, LayerType.C2A: CacheGroup.C2_STATE}


def select_candidate_blocks(logits: torch.Tensor, lengths: torch.Tensor, block_size: int, topk_blocks: int,
                            out: torch.Tensor) -> None:
    """The ``topk_blocks`` best blocks of ``block_size`` entries of each row into int32 ``out [rows, topk_blocks]``
    (-1 pads): a block scores its largest logit inside the row's ``lengths`` entries (NaN wins), the block of the
    row's newest entry always comes first, blocks with no visible entry are never chosen."""
    rows, width = logits.shape
    out.fill_(-1)
    if rows == 0 or width == 0:
        return
    blocks = -(-width // block_size)
    columns = torch.arange(blocks * block_size, device=logits.device)
    padded = F.pad(logits, (0, blocks * block_size - width), value=float("-inf"))
    padded = padded.masked_fill(columns >= lengths.long()[:, None], float("-inf"))
    scores = padded.view(rows, blocks, block_size).amax(dim=-1)
    has_entries = lengths > 0
    newest = ((lengths.long() - 1).clamp(min=0) // block_size)[:, None]
    scores.scatter_(1, newest, torch.where(has_entries, float("inf"), float("-inf"))[:, None].to(scores.dtype))
    count = min(topk_blocks, blocks)
    values, chosen = scores.topk(count, dim=1)
    out[:, :count] = torch.where(values > float("-inf"), chosen, -1).to(out.dtype)


def mask_to_candidates(logits: torch.Tensor, candidates: torch.Tensor, block_size: int) -> torch.Tensor:
    """``logits`` with every entry outside the row's candidate blocks set to -inf."""
    rows, width = logits.shape
    blocks = -(-width // block_size)
    keep = torch.zeros(rows, blocks + 1, dtype=torch.bool, device=logits.device)
    keep.scatter_(1, torch.where(candidates >= 0, candidates.long(), blocks).clamp(max=blocks), True)
    column_block = torch.arange(width, device=logits.device) // block_size
    return logits.masked_fill(~keep[:, column_block], float("-inf"))


class V41Compressor(torch.nn.Module):
    """A kv source's compressor: projection to ``[kv | gate score]`` (ratio 2) or ``kv`` (ratio 1), output norm."""

    def __init__(self, hidden_size: int, head_dim: int, compress_ratio: int, device) -> None:
        super().__init__()
        self.compress_ratio, self.head_dim = compress_ratio, head_dim
        rows = (2 if compress_ratio > 1 else 1) * head_dim  # ratio 1 pools one token: the checkpoint has no gate
        _buffers(self, {"wkv_wgate": ((rows, hidden_size), torch.bfloat16),
                        "norm": ((head_dim,), torch.float32)}, device)


class V41Indexer(torch.nn.Module):
    """Indexer of a V4.1 index source (query projection, head weights); a kv source also owns the key path."""

    def __init__(self, config: DeepseekV4AttentionConfig, owns_keys: bool, device) -> None:
        super().__init__()
        heads = config.index_n_heads
        specs = {"wq_b": ((heads * INDEXER_HEAD_DIM, config.q_lora_rank), torch.bfloat16),
                 "weights_proj": ((heads, config.hidden_size), torch.bfloat16)}
        if owns_keys:
            specs |= {"wk": ((INDEXER_HEAD_DIM, config.head_dim), torch.bfloat16),
                      "k_norm": ((INDEXER_HEAD_DIM,), torch.float32)}
        _buffers(self, specs, device)


class DeepseekV41Attention(torch.nn.Module):
    """One DeepSeek-V4.1 attention layer; :meth:`attach_sources` links it to the layers whose caches and selection
    it reads (every layer of a stack, in order)."""

    def __init__(self, config: DeepseekV4AttentionConfig, layer_id: int, *, max_model_len: int,
                 max_num_batched_tokens: int, seed: int = 0, state_dict: dict | None = None,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        if config.model_version != "v4.1":
            raise ValueError(f"{config.name} is a DeepSeek-{config.model_version.upper()} configuration; "
                             f"DeepseekV41Attention needs a V4.1 one")
        self.config, self.layer_id = config, layer_id
        self.layer_type = config.layer_types[layer_id]
        self.compress_ratio = compress_ratio_of(self.layer_type)
        compressed = self.layer_type is not LayerType.SWA_ONLY
        self.is_kv_source = compressed and config.kv_source_of(layer_id) == layer_id
        self.is_index_source = compressed and config.index_source_of(layer_id) == layer_id
        self.is_candidate_source = layer_id == config.candidate_source_layer_id
        self.uses_candidates = config.uses_candidates(layer_id)
        dim = config.head_dim
        attention_buffers(self, config, device)
        self.compressor = (V41Compressor(config.hidden_size, dim, self.compress_ratio, device)
                           if self.is_kv_source else None)
        self.indexer = V41Indexer(config, self.is_kv_source, device) if self.is_index_source else None
        if state_dict is None:
            randomize_weights(self, seed)
        else:
            self.load_state_dict(state_dict)
        self.cos_sin_cache = layer_rope_table(config, compressed, max_model_len, device)
        rows = max_num_batched_tokens
        self.topk_indices_buffer = (torch.full((rows, config.index_topk), -1, dtype=torch.int32, device=device)
                                    if self.is_index_source else None)
        self.candidate_blocks = (torch.full((rows, config.candidate_topk_blocks), -1, dtype=torch.int32,
                                            device=device) if self.is_candidate_source else None)
        self.ape = torch.zeros(max(self.compress_ratio, 1), dim, device=device)  # V4.1 pools without position bias
        self._sources: dict[str, DeepseekV41Attention] = {}  # a plain dict: other layers are not submodules

    def attach_sources(self, layers: list[DeepseekV41Attention]) -> None:
        """Links the layer whose top-k it attends and, for a two-level index layer, the candidate source."""
        if self.layer_type is not LayerType.SWA_ONLY:
            self._sources["selection"] = layers[self.config.index_source_of(self.layer_id)]
        if self.uses_candidates:
            self._sources["candidates"] = layers[self.config.candidate_source_layer_id]

    @property
    def selection_source(self) -> DeepseekV41Attention | None:
        """The index-source layer whose top-k this layer attends (None for a window-only layer)."""
        return self._sources.get("selection")

    @property
    def candidate_source(self) -> DeepseekV41Attention | None:
        """The layer publishing the candidate blocks this index layer chooses inside (None if it chooses freely)."""
        return self._sources.get("candidates")

    def forward(self, hidden_states: torch.Tensor, step: StepMetadata, caches: LayerCaches,
                timer=NULL_TIMER) -> torch.Tensor:
        """bf16 ``[T, hidden]`` -> bf16 ``[T, hidden]`` for the step's tokens; writes this layer's caches."""
        check_layer_inputs(self, hidden_states, step, caches)
        config, x, positions = self.config, hidden_states, step.positions
        qr, kv, q = project_inputs(self, x, timer)
        with timer("qnorm_rope_kv_insert"):
            q = ops.qnorm_rope_kv_insert(q, kv, positions, self.cos_sin_cache, step.swa.slot_mapping, caches.swa,
                                         SWA_BLOCK_SIZE, config.rms_norm_eps, q_norm=False,
                                         layout=caches.window_layout)
        if self.compressor is not None:
            self._compress(x, step, caches, timer)
        if self.indexer is not None:
            self._index(x, qr, step, caches, timer)
        return output_projection(self, self._attend(q, step, caches, timer), positions, timer)

    def _compress(self, x, step: StepMetadata, caches: LayerCaches, timer) -> None:
        """State rows, the completed entries into the compressed cache, and their indexer keys."""
        compressor, positions, dim = self.compressor, step.positions, self.config.head_dim
        state = step.compressor[STATE_GROUP[self.layer_type]]
        with timer("projections"):
            projected = F.linear(x, compressor.wkv_wgate).float()
        # ratio 1 pools one row: any finite score gives it weight 1
        gated = self.compress_ratio > 1
        kv, score = projected.split(dim, dim=-1) if gated else (projected, torch.zeros_like(projected))
        with timer("save_partial_states"):
            ops.save_partial_states(kv, score, self.ape, positions, caches.compressor_state, state.slot_mapping)
        latent = torch.zeros(x.shape[0], dim, dtype=torch.bfloat16, device=x.device)
        with timer("compress_norm_rope_store"):
            ops.compress_norm_rope_store(caches.compressor_state, state.window_slots, positions,
                                         step.compressed[self.layer_type].slot_mapping, compressor.norm,
                                         self.config.rms_norm_eps, self.cos_sin_cache, caches.compressed,
                                         caches.compressed_block_size, self.compress_ratio,
                                         layout=caches.compressed_layout, latent_out=latent)
        with timer("projections"):
            k_pre = F.linear(latent, self.indexer.wk)
        with timer("indexer_k_norm_rope_store"):
            ops.indexer_k_norm_rope_store(k_pre, positions, self.cos_sin_cache, self.indexer.k_norm,
                                          self.config.rms_norm_eps, caches.indexer_k,
                                          step.indexers[self.layer_type].slot_mapping, caches.compressed_block_size,
                                          self.compress_ratio, key_format=caches.index_key_format)

    def _index(self, x, qr, step: StepMetadata, caches: LayerCaches, timer) -> None:
        """Fills the top-k buffer rows of the step with request-local compressed indices (-1 padded)."""
        meta, ratio, topk = step.indexers[self.layer_type], self.compress_ratio, self.config.index_topk
        positions, tokens, heads = step.positions, step.num_tokens, self.config.index_n_heads
        rows = self.topk_indices_buffer[:tokens]
        if meta.max_seq_len // ratio <= topk:  # every token sees at most topk entries: take them all
            with timer("short_context_fill"):
                rows.copy_(all_compressed_local_indices(positions, ratio, topk))
            return
        key_format = caches.index_key_format
        with timer("projections"):
            index_q = F.linear(qr, self.indexer.wq_b).view(tokens, heads, INDEXER_HEAD_DIM)
            weights = F.linear(x, self.indexer.weights_proj).float()
        with timer("indexer_q_rope_quant"):
            quantized = ops.indexer_q_rope_quant(index_q, positions, self.cos_sin_cache, weights,
                                                 INDEXER_HEAD_DIM**-0.5, heads**-0.5, query_format=key_format)
        q_values, q_scales, weights = quantized if len(quantized) == 3 else (quantized[0], None, quantized[1])
        rows.fill_(-1)
        most_entries = meta.max_seq_len // ratio
        two_level = self.is_candidate_source or self.uses_candidates
        if meta.decode is not None:
            if meta.decode.seq_lens.shape[1] != 1 or meta.num_decode_tokens != meta.num_decodes:
                raise ValueError("the CPU indexer takes one query token per decode request (no speculative decode)")
            span = slice(0, meta.num_decode_tokens)
            self._select(q_values[span], None if q_scales is None else q_scales[span], weights[span],
                         meta.decode.seq_lens[:, 0], meta.decode.block_table, most_entries, rows[span], span,
                         caches, timer)
        requests_of = step.compressed[self.layer_type].req_id_per_token
        for chunk in meta.prefill.chunks if meta.prefill is not None else ():
            span = slice(chunk.token_start, chunk.token_end)
            requests = requests_of[span] - chunk.req_start
            lengths = chunk.cu_seqlen_ke - chunk.cu_seqlen_ks
            chunk_scales = None if q_scales is None else q_scales[span]
            if two_level:  # the blocks need every logit: each token is its own row of the paged logits
                self._select(q_values[span], chunk_scales, weights[span], lengths, chunk.block_table[requests.long()],
                             most_entries, rows[span], span, caches, timer)
                continue
            with timer("fp8_paged_mqa_topk"):  # fused: no [tokens x context] logits in prefill
                ops.fp8_paged_mqa_topk(q_values[span], caches.indexer_k, weights[span], lengths, chunk.block_table,
                                       requests, caches.compressed_block_size, topk, out=rows[span],
                                       q_scale=chunk_scales, key_format=key_format)

    def _select(self, q, q_scale, weights, context_lens, page_table, most_entries, out, span, caches, timer) -> None:
        """Paged logits over each row's ``context_lens`` entries, the candidate blocks, then its top-k into ``out``."""
        config = self.config
        with timer("fp8_paged_mqa_logits"):
            logits = ops.fp8_paged_mqa_logits(q.unsqueeze(1), caches.indexer_k, weights, context_lens, page_table,
                                              caches.compressed_block_size, most_entries, clean_logits=True,
                                              q_scale=None if q_scale is None else q_scale.unsqueeze(1),
                                              key_format=caches.index_key_format)
        if self.is_candidate_source:
            with timer("candidate_blocks"):
                select_candidate_blocks(logits, context_lens, config.candidate_block_size,
                                        config.candidate_topk_blocks, self.candidate_blocks[span])
        elif self.uses_candidates:
            with timer("candidate_blocks"):
                logits = mask_to_candidates(logits, self.candidate_source.candidate_blocks[span],
                                            config.candidate_block_size)
        with timer("topk_transform"):
            raw, _ = ops.topk_transform(logits, context_lens, config.index_topk)
            out.copy_(raw)

    def _compressed_slots(self, step: StepMetadata, timer) -> torch.Tensor | None:
        """Global slots ``[T, n]`` of the compressed entries each token attends (None when no token has any)."""
        if self.layer_type is LayerType.SWA_ONLY:
            return None
        meta = step.compressed[self.layer_type]
        most_entries = meta.max_seq_len // self.compress_ratio
        local = self.selection_source.topk_indices_buffer[: step.num_tokens,
                                                          : min(self.config.index_topk, most_entries)]
        return global_slots(local, meta, self.compress_ratio, timer)

    def _attend(self, q, step: StepMetadata, caches: LayerCaches, timer) -> torch.Tensor:
        return attend(self, q, step, caches, self._compressed_slots(step, timer), timer)
