"""Compressor-state metadata: state block sizes, per-token window slots, clamped block table."""

from __future__ import annotations

import pytest
import torch

from dsv4.metadata import AttentionMetadataConfig, CompressorMetadataBuilder, make_common_metadata

CONFIG = AttentionMetadataConfig(max_num_batched_tokens=16, max_model_len=1024)


def test_c4_window_slots():
    """Window of 2 * 4 rows, 4 rows per block: r0 decode at p=13 (block 0 recycled), r1 prompt p=0..2."""
    table = torch.tensor([[-1, 5, 7, 1], [4, -1, -1, -1]], dtype=torch.int32)
    state_slots = torch.tensor([1 * 4 + 1, 16, 17, 18])
    cm = make_common_metadata([1, 3], [14, 3], table, state_slots)
    meta = CompressorMetadataBuilder(CONFIG, 4).build(cm)
    assert meta.block_size == 4
    assert meta.block_table.tolist() == [[0, 5, 7, 1], [4, 0, 0, 0]]
    assert meta.slot_mapping.tolist() == [5, 16, 17, 18]
    assert meta.token_to_req_indices.tolist() == [0, 1, 1, 1]
    assert meta.window_slots.tolist() == [
        [22, 23, 28, 29, 30, 31, 4, 5],  # positions 6..13
        [-1] * 7 + [16],
        [-1] * 6 + [16, 17],
        [-1] * 5 + [16, 17, 18],
    ]


def test_c128_window_slots():
    table = torch.arange(16, dtype=torch.int32)[None].flip(1)  # block i of the request is page 15 - i
    cm = make_common_metadata([1], [128], table, torch.tensor([0]))
    meta = CompressorMetadataBuilder(CONFIG, 128).build(cm)
    assert meta.block_size == 8
    expected = [(15 - p // 8) * 8 + p % 8 for p in range(128)]  # positions 0..127, 8 rows per block
    assert meta.window_slots.tolist() == [expected]


@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_window_only_layers_have_no_compressor(ratio):
    with pytest.raises(ValueError, match=r"compress ratio in \(4, 128\)|supported"):
        CompressorMetadataBuilder(CONFIG, ratio)
