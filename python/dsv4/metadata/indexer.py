"""Lightning-indexer metadata (C4A layers): decode context lengths and prefill chunks.

Token at position p scores the ``(p + 1) // 4`` complete compressed entries of its request. Decode
requests read them through the indexer block table (paged logits); prefill requests are cut into
chunks whose gathered keys fit a workspace and whose dense logits fit a byte budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..constants import C4_RATIO
from .common import AttentionMetadataConfig, CommonAttentionMetadata, check_capacity, split_decodes_and_prefills
from .layer_types import LayerType, compress_ratio_of, layer_type_for_ratio
from .sparse_mla import compressed_slot_mapping

FP32_BYTES = 4  # logits are fp32
# Gathered-key workspace rows per token of context: (2 * 576 // 132) * 5 = 40 (vLLM's sizing).
PREFILL_WORKSPACE_FACTOR = 40
SCHEDULE_BLOCK_KV = 64  # indexer entries per page, the paged-logits kernel's key block


@dataclass
class DeepSeekV32IndexerDecodeMetadata:
    block_table: torch.Tensor  # [Nd, max_blocks] indexer table rows of the decode requests
    seq_lens: torch.Tensor  # [Nd, next_n] int32 compressed context length of each decode token
    decode_lens: torch.Tensor  # [Nd] int32 query tokens per decode request
    requires_padding: bool  # decode requests have different query lengths
    schedule_metadata: torch.Tensor  # [num_sms + 1, 2] int32 (planned on CUDA; ignored by the CPU kernel)


@dataclass
class DeepseekV32IndexerPrefillChunkMetadata:
    cu_seqlen_ks: torch.Tensor  # [tokens] int32 first gathered key row of each query token
    cu_seqlen_ke: torch.Tensor  # [tokens] int32 one past its last visible key row
    cu_seq_lens: torch.Tensor  # [num_reqs + 1] int32 exclusive cumsum of compressed lengths
    token_to_seq: torch.Tensor  # [total_seq_lens] int32 chunk-local request of each gathered key row
    total_seq_lens: int
    token_start: int  # absolute token rows [token_start, token_end) of the step
    token_end: int
    block_table: torch.Tensor  # [num_reqs, max_blocks] rows of the chunk's requests
    skip_kv_gather: bool  # a later query piece of a split request reuses the first piece's gather
    num_reqs: int
    req_start: int  # absolute index of the chunk's first request


@dataclass
class DeepseekV32IndexerPrefillMetadata:
    chunks: list[DeepseekV32IndexerPrefillChunkMetadata]


@dataclass
class DeepseekV32IndexerMetadata:
    seq_lens: torch.Tensor  # uncompressed, passthrough
    max_seq_len: int  # uncompressed; decides the short-context fill (max_seq_len // 4 <= topk)
    slot_mapping: torch.Tensor  # compressed slots of the indexer K cache
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    decode: DeepSeekV32IndexerDecodeMetadata | None = None
    prefill: DeepseekV32IndexerPrefillMetadata | None = None


def split_indexer_prefill_chunks(
    compressed_seq_lens_cpu: torch.Tensor,
    prefill_query_lens_cpu: torch.Tensor,
    workspace_size: int,
    max_logits_bytes: int,
    request_offset: int = 0,
) -> list[tuple[slice, slice]]:
    """``[(request slice (absolute), query slice (relative to the chunk's first query token))]``.

    Requests join a chunk while its gathered keys stay within ``workspace_size`` and its logits
    (query tokens x keys, fp32) within ``max_logits_bytes``; a request over either bound alone forms
    its own chunk. A chunk still over the logits budget is cut along its queries.
    """
    max_elements = max_logits_bytes // FP32_BYTES
    keys, queries = compressed_seq_lens_cpu.tolist(), prefill_query_lens_cpu.tolist()
    chunks: list[tuple[slice, slice]] = []
    end = 0
    while end < len(keys):
        start, chunk_m, chunk_n = end, 0, 0
        while end < len(keys):
            grown_m, grown_n = chunk_m + queries[end], chunk_n + keys[end]
            if end > start and (grown_n > workspace_size or grown_m * grown_n > max_elements):
                break
            chunk_m, chunk_n, end = grown_m, grown_n, end + 1
            if chunk_n > workspace_size or chunk_m * chunk_n > max_elements:
                break  # a single request over budget
        piece = max(1, max_elements // chunk_n) if chunk_n else max(chunk_m, 1)
        requests = slice(request_offset + start, request_offset + end)
        chunks += [(requests, slice(m, min(m + piece, chunk_m))) for m in range(0, chunk_m, piece)]
    return chunks


class DeepseekV32IndexerMetadataBuilder:
    """Builds :class:`DeepseekV32IndexerMetadata` for the indexer cache group (ratio 4)."""

    def __init__(self, config: AttentionMetadataConfig, compress_ratio: int | LayerType = C4_RATIO) -> None:
        self.config = config
        self.compress_ratio = compress_ratio_of(layer_type_for_ratio(compress_ratio))  # V4.1: C1A or C2A
        self.storage_block_size = config.logical_block_size // self.compress_ratio
        self.next_n = config.decode_threshold
        self.workspace_size = config.max_model_len * PREFILL_WORKSPACE_FACTOR // self.compress_ratio
        self.max_logits_bytes = config.indexer_max_logits_bytes
        reqs, device = config.num_request_rows, config.device
        self.decode_seq_lens = torch.zeros(reqs, self.next_n, dtype=torch.int32, device=device)
        self.decode_lens = torch.zeros(reqs, dtype=torch.int32, device=device)
        self.schedule_metadata = torch.zeros(config.num_sms + 1, 2, dtype=torch.int32, device=device)
        self.compressed_slot_mapping = torch.full((config.max_num_batched_tokens,), -1, dtype=torch.int64,
                                                  device=device)

    @staticmethod
    def _split_indexer_prefill_chunks(compressed_seq_lens_cpu, prefill_query_lens_cpu, workspace_size,
                                      max_logits_bytes, request_offset=0) -> list[tuple[slice, slice]]:
        return split_indexer_prefill_chunks(compressed_seq_lens_cpu, prefill_query_lens_cpu, workspace_size,
                                            max_logits_bytes, request_offset)

    def build(self, cm: CommonAttentionMetadata) -> DeepseekV32IndexerMetadata:
        check_capacity(type(self).__name__, cm.num_actual_tokens, self.config.max_num_batched_tokens)
        if cm.num_reqs > self.decode_lens.shape[0]:
            raise ValueError(f"{type(self).__name__}: step has {cm.num_reqs} requests, buffers hold "
                             f"max_num_reqs = {self.decode_lens.shape[0]}")
        split = split_decodes_and_prefills(cm, self.next_n, require_uniform=True)
        slot_mapping = compressed_slot_mapping(cm, self.compress_ratio, self.storage_block_size,
                                               self.compressed_slot_mapping)
        return DeepseekV32IndexerMetadata(
            seq_lens=cm.seq_lens,
            max_seq_len=cm.max_seq_len,
            slot_mapping=slot_mapping,
            num_decodes=split.num_decodes,
            num_decode_tokens=split.num_decode_tokens,
            num_prefills=split.num_prefills,
            num_prefill_tokens=split.num_prefill_tokens,
            decode=self._build_decode(cm, split.num_decodes) if split.num_decodes else None,
            prefill=self._build_prefill(cm, split.num_decodes) if split.num_prefills else None,
        )

    def _build_decode(self, cm: CommonAttentionMetadata, num_decodes: int) -> DeepSeekV32IndexerDecodeMetadata:
        query_lens = cm.query_lens_cpu[:num_decodes]
        decode_lens = self.decode_lens[:num_decodes]
        decode_lens.copy_(query_lens)
        # Token j of a request's next_n decode tokens sees L - next_n + j + 1 raw tokens (0 for padded requests).
        token = torch.arange(self.next_n, device=cm.seq_lens.device)
        raw = cm.seq_lens[:num_decodes, None].long() - self.next_n + 1 + token
        seq_lens = self.decode_seq_lens[:num_decodes]
        seq_lens.copy_(raw.clamp(min=0) // self.compress_ratio)
        if seq_lens.device.type == "cuda":
            from ..deep_gemm import get_paged_mqa_logits_metadata

            self.schedule_metadata.copy_(get_paged_mqa_logits_metadata(seq_lens, SCHEDULE_BLOCK_KV,
                                                                       self.config.num_sms))
        return DeepSeekV32IndexerDecodeMetadata(
            block_table=cm.block_table_tensor[:num_decodes],
            seq_lens=seq_lens,
            decode_lens=decode_lens,
            requires_padding=bool(query_lens.min() != query_lens.max()),
            schedule_metadata=self.schedule_metadata,
        )

    def _build_prefill(self, cm: CommonAttentionMetadata, num_decodes: int) -> DeepseekV32IndexerPrefillMetadata:
        compressed = cm.seq_lens_cpu[num_decodes:] // self.compress_ratio
        specs = self._split_indexer_prefill_chunks(compressed, cm.query_lens_cpu[num_decodes:], self.workspace_size,
                                                   self.max_logits_bytes, request_offset=num_decodes)
        positions, req_ids = cm.token_positions(), cm.token_requests()
        chunks = [self._build_chunk(cm, requests, queries, positions, req_ids) for requests, queries in specs]
        return DeepseekV32IndexerPrefillMetadata([chunk for chunk in chunks if chunk is not None])

    def _build_chunk(self, cm: CommonAttentionMetadata, requests: slice, queries: slice, positions: torch.Tensor,
                     req_ids: torch.Tensor) -> DeepseekV32IndexerPrefillChunkMetadata | None:
        """One chunk's key ranges; None when its requests have no compressed entry yet (nothing to score)."""
        device = cm.seq_lens.device
        compressed = cm.seq_lens_cpu[requests].long() // self.compress_ratio
        total = int(compressed.sum())
        if total == 0:
            return None
        cu_seq_lens = torch.zeros(compressed.numel() + 1, dtype=torch.int32)
        torch.cumsum(compressed, 0, out=cu_seq_lens[1:])
        first_token = int(cm.query_start_loc_cpu[requests.start])
        rows = slice(first_token + queries.start, first_token + queries.stop)
        local_req = (req_ids[rows] - requests.start).cpu()
        starts = cu_seq_lens[local_req]
        ends = starts + ((positions[rows].cpu() + 1) // self.compress_ratio).to(torch.int32)
        token_to_seq = torch.repeat_interleave(torch.arange(compressed.numel(), dtype=torch.int32), compressed)
        return DeepseekV32IndexerPrefillChunkMetadata(
            cu_seqlen_ks=starts.to(device),
            cu_seqlen_ke=ends.to(device),
            cu_seq_lens=cu_seq_lens.to(device),
            token_to_seq=token_to_seq.to(device),
            total_seq_lens=total,
            token_start=rows.start,
            token_end=rows.stop,
            block_table=cm.block_table_tensor[requests],
            skip_kv_gather=queries.start > 0,
            num_reqs=compressed.numel(),
            req_start=requests.start,
        )
