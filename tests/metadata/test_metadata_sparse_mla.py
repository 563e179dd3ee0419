"""Sparse-MLA metadata on hand-made batches: compressed slot mapping across page boundaries (C4 entry 63 -> 64,
C128 entry 1 -> 2), C128A decode slots / lengths and prefill local indices, the CPU variant."""

from __future__ import annotations

import pytest
import torch

from dsv4.metadata import (
    AttentionMetadataConfig,
    DeepseekV4CPUFlashMLAMetadataBuilder,
    DeepseekV4SparseMLAMetadataBuilder,
    all_compressed_local_indices,
    c128a_width,
    make_common_metadata,
)

UNUSED = -1


def config(max_model_len: int = 1024) -> AttentionMetadataConfig:
    return AttentionMetadataConfig(max_num_batched_tokens=32, max_model_len=max_model_len, index_topk=512)


def padded(values: list[int], width: int) -> list[int]:
    return values + [-1] * (width - len(values))


def test_c4_slot_mapping_crosses_page_63_to_64():
    # r0 decode at p=3 (completes entry 0); r1 prefill p=250..262 (completes entries 62, 63 | 64 on the next page).
    table = torch.tensor([[6, UNUSED], [3, 8]], dtype=torch.int32)
    cm = make_common_metadata([1, 13], [4, 263], table, torch.arange(14))
    meta = DeepseekV4SparseMLAMetadataBuilder(config(), 4).build(cm)
    expected = [6 * 64 + 0] + [-1, 3 * 64 + 62, -1, -1, -1, 3 * 64 + 63, -1, -1, -1, 8 * 64 + 0, -1, -1, -1]
    assert meta.slot_mapping.tolist() == expected and meta.slot_mapping.dtype == torch.int64
    assert (meta.block_size, meta.compress_ratio, meta.topk_tokens) == (256, 4, 512)
    assert meta.req_id_per_token.tolist() == [0] + [1] * 13
    assert meta.c128a_global_decode_topk_indices is None and meta.c128a_prefill_topk_indices is None


def c128_batch():
    # Decodes: r0 at p=383 (3 entries; entry 2 on the second page), r1 at p=255, r2 padded (slot -1) at p=300.
    # Prefill: r3 at p=126..129 (no entry, then entry 0 from p=127 on).
    table = torch.tensor([[5, 9], [4, UNUSED], [7, 1], [2, UNUSED]], dtype=torch.int32)
    slots = torch.tensor([10, 11, -1, 20, 21, 22, 23])
    return make_common_metadata([1, 1, 1, 4], [384, 256, 301, 130], table, slots)


def test_c128_slot_mapping_crosses_page_1_to_2():
    meta = DeepseekV4SparseMLAMetadataBuilder(config(), 128).build(c128_batch())
    assert meta.slot_mapping.tolist() == [9 * 2 + 0, 4 * 2 + 1, -1, -1, 2 * 2 + 0, -1, -1]


def test_c128a_decode_and_prefill_indices():
    width = 128  # ceil(1024 / 128) = 8 entries, padded to the 128-column FlashMLA tile
    meta = DeepseekV4SparseMLAMetadataBuilder(config(), 128).build(c128_batch())
    decode = meta.c128a_global_decode_topk_indices
    assert decode.shape == (3, 1, width) and decode.dtype == torch.int32
    assert decode[:, 0].tolist() == [padded([10, 11, 18], width), padded([8, 9], width), padded([14, 15], width)]
    assert meta.c128a_decode_topk_lens.tolist() == [3, 2, 0]  # the padded token reads nothing
    assert meta.c128a_prefill_topk_indices.tolist() == [padded([], width)] + [padded([0], width)] * 3


def test_c128a_fields_are_absent_without_tokens_of_their_kind():
    all_prefill = make_common_metadata([3], [300], torch.tensor([[0, 1]], dtype=torch.int32), torch.arange(3))
    meta = DeepseekV4SparseMLAMetadataBuilder(config(), 128).build(all_prefill)
    assert meta.c128a_global_decode_topk_indices is None and meta.c128a_decode_topk_lens is None
    assert meta.c128a_prefill_topk_indices.shape == (3, 128)


@pytest.mark.parametrize("max_model_len, width", [(1024, 128), (16384, 128), (16385, 256), (1 << 20, 8192)])
def test_c128a_width_is_aligned(max_model_len, width):
    assert c128a_width(max_model_len) == width


def test_c128a_counts_clamp_to_the_width():
    local = all_compressed_local_indices(torch.tensor([126, 127, 1000]), 128, 4)
    assert local.tolist() == [[-1, -1, -1, -1], [0, -1, -1, -1], [0, 1, 2, 3]]


def test_cpu_variant_has_no_c128a_metadata():
    cpu = DeepseekV4CPUFlashMLAMetadataBuilder(config(), 128)
    assert cpu._build_c128a_metadata(c128_batch(), torch.zeros(7, dtype=torch.int32)) == {}
    meta = cpu.build(c128_batch())
    assert meta.c128a_global_decode_topk_indices is None
    assert meta.c128a_decode_topk_lens is None
    assert meta.c128a_prefill_topk_indices is None
    base = DeepseekV4SparseMLAMetadataBuilder(config(), 128).build(c128_batch())
    assert torch.equal(meta.slot_mapping, base.slot_mapping)
    assert torch.equal(meta.req_id_per_token, base.req_id_per_token)


def test_slot_mapping_buffer_is_refilled():
    builder = DeepseekV4SparseMLAMetadataBuilder(config(), 4)
    builder.build(make_common_metadata([8], [8], torch.tensor([[1]], dtype=torch.int32), torch.arange(8)))
    meta = builder.build(make_common_metadata([1], [4], torch.tensor([[2]], dtype=torch.int32), torch.arange(1)))
    assert meta.slot_mapping.tolist() == [128]
    assert builder.compressed_slot_mapping[1:].eq(-1).all()
    assert meta.slot_mapping.data_ptr() == builder.compressed_slot_mapping.data_ptr()


def test_window_only_group_passes_its_slot_mapping_through():
    cm = make_common_metadata([2], [2], torch.tensor([[3]], dtype=torch.int32), torch.tensor([192, 193]))
    assert DeepseekV4SparseMLAMetadataBuilder(config(), 0).build(cm).slot_mapping.tolist() == [192, 193]
