"""Sliding-window metadata: per-token window slots and lengths, valid-token mask, prefill gather lengths,
prefill chunk plan and the per-layer-type tile schedulers.

Token at position p attends to the raw tokens ``[max(p - W + 1, 0), p]`` of its request: ``min(p + 1, W)``
slots (through the SWA block table, 64 tokens per block) then -1. A padding token (slot_mapping < 0)
gets length 0 and an all -1 row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import ops
from .common import AttentionMetadataConfig, CommonAttentionMetadata, check_capacity, split_decodes_and_prefills
from .layer_types import LayerType, layer_type_for_ratio
from .prefill_chunks import PREFILL_CHUNK_SIZE, AttentionPrefillChunk, plan_attention_prefill_chunks
from .tile_scheduler import build_tile_schedulers, plans_flashmla_schedules


def sliding_window_slots(
    positions: torch.Tensor,
    req_ids: torch.Tensor,
    block_table: torch.Tensor,
    valid: torch.Tensor,
    window: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots int64 ``[N, window]``, lengths int64 ``[N]``) of each token's window; invalid tokens get 0 / -1."""
    positions = positions.long()
    start = (positions - window + 1).clamp(min=0)
    lens = torch.where(valid, positions + 1 - start, 0)
    offsets = torch.arange(window, device=positions.device)
    local = torch.where(offsets < lens[:, None], start[:, None] + offsets, -1)
    return ops.map_local_to_global_slots(local, req_ids, block_table, block_size), lens


@dataclass
class DeepseekSparseSWAMetadata:
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    block_size: int
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    is_valid_token: torch.Tensor  # [len(slot_mapping)] bool
    token_to_req_indices: torch.Tensor  # [T] int32
    decode_swa_indices: torch.Tensor  # [Nd, 1, W] int32 global SWA slots
    decode_swa_lens: torch.Tensor  # [Nd] int32
    prefill_swa_indices: torch.Tensor  # [Np, 1, W]
    prefill_swa_lens: torch.Tensor  # [Np]
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    prefill_seq_lens: torch.Tensor
    prefill_seq_lens_cpu: torch.Tensor
    prefill_query_lens_cpu: torch.Tensor  # int32
    prefill_gather_lens: torch.Tensor  # q_len + min(prefix, W - 1) per prefill request
    prefill_gather_lens_cpu: torch.Tensor
    prefill_window_size: int
    prefill_max_model_len: int
    prefill_max_num_batched_tokens: int
    tile_sched_swaonly: object | None = None
    tile_sched_c4a: object | None = None
    tile_sched_c128a: object | None = None
    flashinfer_sparse_index_cache: dict = field(default_factory=dict)  # per-step memo of the plain-row path

    def prefill_chunk_plan(self, compress_ratio: int, chunk_size: int = PREFILL_CHUNK_SIZE
                           ) -> list[AttentionPrefillChunk]:
        """Attention prefill chunks of this step for a layer of ratio ``compress_ratio`` (1 = window only)."""
        return plan_attention_prefill_chunks(self.prefill_seq_lens_cpu, self.prefill_gather_lens_cpu, compress_ratio,
                                             self.prefill_max_model_len, self.prefill_window_size,
                                             self.prefill_max_num_batched_tokens, chunk_size)


class DeepseekSparseSWAMetadataBuilder:
    """Builds :class:`DeepseekSparseSWAMetadata` into persistent buffers sized by max_num_batched_tokens."""

    def __init__(self, config: AttentionMetadataConfig) -> None:
        self.config = config
        self.window_size = config.sliding_window
        self.block_size = config.swa_block_size
        self.decode_threshold = config.decode_threshold
        self.layer_types = {layer_type_for_ratio(r, config.model_version) for r in config.compress_ratios}
        rows, device = config.max_num_batched_tokens, config.device
        self.token_to_req_indices = torch.zeros(rows, dtype=torch.int32, device=device)
        self.is_valid_token = torch.zeros(rows, dtype=torch.bool, device=device)
        self.decode_swa_indices = torch.full((rows, 1, self.window_size), -1, dtype=torch.int32, device=device)
        self.decode_swa_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.prefill_swa_indices = torch.full((rows, 1, self.window_size), -1, dtype=torch.int32, device=device)
        self.prefill_swa_lens = torch.zeros(rows, dtype=torch.int32, device=device)

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict[LayerType, object | None]:
        return build_tile_schedulers(self.layer_types, num_decode_tokens, plans_flashmla_schedules(self.config.device))

    def _fill_windows(self, rows: slice, positions, req_ids, block_table, valid, indices_out, lens_out) -> None:
        slots, lens = sliding_window_slots(positions[rows], req_ids[rows], block_table, valid[rows],
                                           self.window_size, self.block_size)
        indices_out[:, 0].copy_(slots)
        lens_out.copy_(lens)

    def build(self, cm: CommonAttentionMetadata) -> DeepseekSparseSWAMetadata:
        num_tokens = cm.num_actual_tokens
        check_capacity(type(self).__name__, max(num_tokens, cm.slot_mapping.shape[0]),
                       self.config.max_num_batched_tokens)
        num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(
            cm, self.decode_threshold)
        req_ids = cm.token_to_req_indices(self.token_to_req_indices)
        is_valid = self.is_valid_token[: cm.slot_mapping.shape[0]]
        is_valid.copy_(cm.slot_mapping >= 0)
        # Tokens past the slot mapping (DP padding) are not inserted, so they have no window either.
        valid = torch.zeros(num_tokens, dtype=torch.bool, device=is_valid.device)
        covered = min(num_tokens, is_valid.shape[0])
        valid[:covered] = is_valid[:covered]
        positions = cm.token_positions()
        decode_rows, prefill_rows = slice(0, num_decode_tokens), slice(num_decode_tokens, num_tokens)
        self.decode_swa_lens[num_decode_tokens:].zero_()  # padded decode rows of a CUDA graph read length 0
        decode_indices = self.decode_swa_indices[:num_decode_tokens]
        decode_lens = self.decode_swa_lens[:num_decode_tokens]
        prefill_indices = self.prefill_swa_indices[:num_prefill_tokens]
        prefill_lens = self.prefill_swa_lens[:num_prefill_tokens]
        self._fill_windows(decode_rows, positions, req_ids, cm.block_table_tensor, valid, decode_indices, decode_lens)
        self._fill_windows(prefill_rows, positions, req_ids, cm.block_table_tensor, valid, prefill_indices,
                           prefill_lens)

        prefill_seq_lens_cpu = cm.seq_lens_cpu[num_decodes:]
        prefill_query_lens_cpu = cm.query_lens_cpu[num_decodes:].to(torch.int32)
        prefix = (prefill_seq_lens_cpu - prefill_query_lens_cpu).clamp(min=0)
        gather_lens_cpu = (prefill_query_lens_cpu + prefix.clamp(max=self.window_size - 1)).to(torch.int32)
        schedulers = self.build_tile_scheduler(num_decode_tokens)
        return DeepseekSparseSWAMetadata(
            block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            block_size=self.block_size,
            seq_lens=cm.seq_lens,
            query_start_loc=cm.query_start_loc,
            query_start_loc_cpu=cm.query_start_loc_cpu,
            is_valid_token=is_valid,
            token_to_req_indices=req_ids,
            decode_swa_indices=decode_indices,
            decode_swa_lens=decode_lens,
            prefill_swa_indices=prefill_indices,
            prefill_swa_lens=prefill_lens,
            num_decodes=num_decodes,
            num_prefills=num_prefills,
            num_decode_tokens=num_decode_tokens,
            num_prefill_tokens=num_prefill_tokens,
            prefill_seq_lens=cm.seq_lens[num_decodes:],
            prefill_seq_lens_cpu=prefill_seq_lens_cpu,
            prefill_query_lens_cpu=prefill_query_lens_cpu,
            prefill_gather_lens=gather_lens_cpu.to(cm.seq_lens.device),
            prefill_gather_lens_cpu=gather_lens_cpu,
            prefill_window_size=self.window_size,
            prefill_max_model_len=self.config.max_model_len,
            prefill_max_num_batched_tokens=self.config.max_num_batched_tokens,
            tile_sched_swaonly=schedulers[LayerType.SWA_ONLY],
            tile_sched_c4a=schedulers[LayerType.C4A],
            tile_sched_c128a=schedulers[LayerType.C128A],
        )
