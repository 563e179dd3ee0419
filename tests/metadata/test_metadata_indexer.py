"""Indexer metadata on hand-made batches: decode context lengths (plain and MTP), prefill chunks under the
workspace and logits budgets with their key ranges, and the CPU variant's single chunk."""

from __future__ import annotations

import torch

from dsv4.metadata import (
    AttentionMetadataConfig,
    DeepseekV4CPUIndexerMetadataBuilder,
    DeepseekV32IndexerMetadataBuilder,
    make_common_metadata,
    split_indexer_prefill_chunks,
)

FP32 = 4


def config(**overrides) -> AttentionMetadataConfig:
    return AttentionMetadataConfig(**{"max_num_batched_tokens": 32, "max_model_len": 4096, **overrides})


def table(rows: int) -> torch.Tensor:
    return torch.arange(rows * 3, dtype=torch.int32).reshape(rows, 3)


def mixed_batch():
    """r0 decode at p=19; r1 chunked prefill p=8..11 (3 entries visible at the end); r2 a 6-token prompt."""
    return make_common_metadata([1, 4, 6], [20, 12, 6], table(3), torch.arange(11))


def test_decode_context_lengths():
    cm = make_common_metadata([1, 1, 1], [4, 3, 2051], table(3), torch.arange(3))
    meta = DeepseekV32IndexerMetadataBuilder(config()).build(cm)
    assert (meta.num_decodes, meta.num_decode_tokens, meta.num_prefills, meta.max_seq_len) == (3, 3, 0, 2051)
    assert meta.prefill is None
    assert meta.decode.seq_lens.tolist() == [[1], [0], [512]]  # L // 4, always 2-D
    assert meta.decode.decode_lens.tolist() == [1, 1, 1] and not meta.decode.requires_padding
    assert torch.equal(meta.decode.block_table, table(3))
    assert meta.decode.schedule_metadata.shape == (config().num_sms + 1, 2)


def test_mtp_decode_context_lengths():
    """next_n = 2: token j sees L - 2 + j + 1 raw tokens; a padded request (L = 0) stays at 0."""
    cm = make_common_metadata([2, 2, 0], [9, 12, 0], table(3), torch.arange(4))
    meta = DeepseekV32IndexerMetadataBuilder(config(num_speculative_tokens=1)).build(cm)
    assert meta.num_decodes == 3 and meta.decode.seq_lens.tolist() == [[2, 2], [2, 3], [0, 0]]
    assert meta.decode.requires_padding


def test_non_uniform_decodes_go_to_the_prefill_side():
    cm = make_common_metadata([2, 1, 6], [9, 12, 6], table(3), torch.arange(9))
    meta = DeepseekV32IndexerMetadataBuilder(config(num_speculative_tokens=1)).build(cm)
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens, meta.num_prefill_tokens) == (1, 2, 2, 7)


def test_prefill_chunk_key_ranges():
    meta = DeepseekV32IndexerMetadataBuilder(config()).build(mixed_batch())
    (chunk,) = meta.prefill.chunks
    assert chunk.cu_seq_lens.tolist() == [0, 3, 4] and chunk.total_seq_lens == 4
    assert chunk.token_to_seq.tolist() == [0, 0, 0, 1]
    assert (chunk.token_start, chunk.token_end, chunk.req_start, chunk.num_reqs) == (1, 11, 1, 2)
    assert chunk.cu_seqlen_ks.tolist() == [0, 0, 0, 0, 3, 3, 3, 3, 3, 3]
    assert chunk.cu_seqlen_ke.tolist() == [2, 2, 2, 3, 3, 3, 3, 4, 4, 4]  # ks + (p + 1) // 4
    assert torch.equal(chunk.block_table, table(3)[1:3]) and not chunk.skip_kv_gather


def test_prefill_split_along_queries_under_the_logits_budget():
    """8 logits elements: r1 (4 queries x 3 keys) is cut into 2-query pieces; r2 (6 x 1) fits whole."""
    meta = DeepseekV32IndexerMetadataBuilder(config(indexer_max_logits_bytes=8 * FP32)).build(mixed_batch())
    spans = [(c.token_start, c.token_end, c.req_start, c.num_reqs, c.skip_kv_gather) for c in meta.prefill.chunks]
    assert spans == [(1, 3, 1, 1, False), (3, 5, 1, 1, True), (5, 11, 2, 1, False)]
    assert meta.prefill.chunks[1].cu_seqlen_ke.tolist() == [2, 3]


def test_chunks_without_compressed_entries_are_skipped():
    cm = make_common_metadata([1, 3], [20, 3], table(2), torch.arange(4))
    assert DeepseekV32IndexerMetadataBuilder(config()).build(cm).prefill.chunks == []


def test_split_by_workspace():
    chunks = split_indexer_prefill_chunks(torch.tensor([10, 20, 30]), torch.tensor([5, 5, 5]), 35, 1 << 30)
    assert chunks == [(slice(0, 2), slice(0, 10)), (slice(2, 3), slice(0, 5))]


def test_split_by_logits_budget_with_offset():
    chunks = split_indexer_prefill_chunks(torch.tensor([10, 10]), torch.tensor([10, 15]), 1000, 200 * FP32,
                                          request_offset=3)
    assert chunks == [(slice(3, 4), slice(0, 10)), (slice(4, 5), slice(0, 15))]


def test_split_single_request_over_budget():
    chunks = split_indexer_prefill_chunks(torch.tensor([50]), torch.tensor([30]), 1000, 200 * FP32)
    assert chunks == [(slice(0, 1), slice(m, min(m + 4, 30))) for m in range(0, 30, 4)]  # 200 // 50 = 4 queries


def test_split_without_keys():
    assert split_indexer_prefill_chunks(torch.tensor([0, 0]), torch.tensor([3, 4]), 10, 16) == [
        (slice(0, 2), slice(0, 7))]


def test_cpu_variant_single_chunk():
    split = DeepseekV4CPUIndexerMetadataBuilder._split_indexer_prefill_chunks
    assert split(torch.tensor([50, 20]), torch.tensor([30, 7]), 1, 4, request_offset=3) == [
        (slice(3, 5), slice(0, 37))]
    meta = DeepseekV4CPUIndexerMetadataBuilder(config(indexer_max_logits_bytes=8 * FP32)).build(mixed_batch())
    (chunk,) = meta.prefill.chunks
    assert (chunk.token_start, chunk.token_end, chunk.num_reqs, chunk.skip_kv_gather) == (1, 11, 2, False)


def test_indexer_slot_mapping_and_passthrough():
    meta = DeepseekV32IndexerMetadataBuilder(config()).build(mixed_batch())
    assert meta.slot_mapping.tolist() == [0 * 64 + 4, -1, -1, -1, 3 * 64 + 2, -1, -1, -1, 6 * 64 + 0, -1, -1]
    assert meta.seq_lens.tolist() == [20, 12, 6]
