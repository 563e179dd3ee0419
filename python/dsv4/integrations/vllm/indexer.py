"""A CPU lightning indexer for vLLM's DeepSeek-V4 layers on dsv4's fused paged logits + top-k.

vLLM's ``SparseAttnIndexer.forward_cpu`` asserts an index top-k of 512 (so DeepSeek-V4-Pro, top-k 1024,
cannot run on the CPU) and builds the dense ``[tokens, context]`` logits before choosing. This subclass,
registered for vLLM's ``SparseAttnIndexer`` name, scores and chooses in one pass with
``dsv4.ops.fp8_paged_mqa_topk`` for any top-k, prefill and decode alike, and writes the same row-local
positions into the same buffer.
"""

from __future__ import annotations

import torch

from ... import ops


def _select(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, lengths: torch.Tensor,
            block_table: torch.Tensor, row_requests: torch.Tensor, out: torch.Tensor) -> None:
    """The top-``out.shape[1]`` row-local positions of each row's paged logits, written into out."""
    kv_pages = kv_cache.view(kv_cache.shape[0], -1)  # a per-layer view: its page stride may exceed one page
    ops.fp8_paged_mqa_topk(q, kv_pages, weights, lengths.to(torch.int32), block_table, row_requests.to(torch.int32),
                           kv_cache.shape[1], out.shape[1], out=out)


def indexer_class():
    """The subclass of the installed vLLM's ``SparseAttnIndexer`` (built on demand: vLLM is optional)."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadata

    class Dsv4SparseAttnIndexer(SparseAttnIndexer):
        """vLLM's indexer layer with dsv4's fused selection on the CPU (any top-k, no dense logits)."""

        def forward_cpu(self, hidden_states, q_quant, k, weights):
            if self.use_fp4_cache or not isinstance(q_quant, torch.Tensor):
                raise NotImplementedError("dsv4's CPU indexer reads the fp8 indexer cache (132 B per entry)")
            if self.dcp_world_size > 1 or self.use_pcp or not self.skip_k_cache_insert:
                raise NotImplementedError("dsv4's CPU indexer runs without context parallelism")
            metadata = get_forward_context().attn_metadata
            metadata = metadata.get(self.k_cache.prefix) if isinstance(metadata, dict) else None
            if metadata is None:  # profiling / dummy run
                return self.topk_indices_buffer
            assert isinstance(metadata, DeepseekV32IndexerMetadata)
            kv_cache, width, buffer = self.k_cache.kv_cache, self.topk_tokens, self.topk_indices_buffer
            buffer[: hidden_states.shape[0]] = -1
            if metadata.num_prefills > 0:
                for chunk in metadata.prefill.chunks:
                    rows = slice(chunk.token_start, chunk.token_end)
                    if chunk.local_total_seq_lens == 0:
                        continue  # already -1
                    lengths = chunk.cu_seqlen_ke - chunk.cu_seqlen_ks
                    requests = torch.searchsorted(chunk.local_cu_seq_lens, chunk.cu_seqlen_ks, right=True) - 1
                    _select(q_quant[rows], kv_cache, weights[rows], lengths, chunk.block_table, requests,
                            buffer[rows, :width])
            decode = metadata.decode
            if metadata.num_decodes > 0 and decode is not None and decode.decode_lens.shape[0] > 0:
                if decode.requires_padding:
                    raise NotImplementedError("dsv4's CPU indexer has no padded (multi-token) decode rows")
                rows = metadata.num_decode_tokens
                lengths = decode.seq_lens[:, -1] if decode.seq_lens.ndim == 2 else decode.seq_lens
                block_table = decode.block_table[:rows]
                requests = torch.arange(rows, device=block_table.device)
                _select(q_quant[:rows], kv_cache, weights[:rows], lengths[:rows], block_table, requests,
                        buffer[:rows, :width])
            return buffer

    return Dsv4SparseAttnIndexer


def install() -> list[str]:
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    if "SparseAttnIndexer" not in op_registry_oot:
        cls = CustomOp.register_oot(name="SparseAttnIndexer")(indexer_class())
        cls.name = "sparse_attn_indexer"  # enabled or not by the base op's name in compilation_config.custom_ops
    return ["SparseAttnIndexer (CPU)"]
