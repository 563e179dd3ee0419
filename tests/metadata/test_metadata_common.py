"""dsv4.metadata basics: layer types from compress_ratios, CommonAttentionMetadata, the decode/prefill split."""

from __future__ import annotations

import pytest
import torch

from dsv4.metadata import (
    LAYER_TYPE_C4A,
    LAYER_TYPE_C128A,
    LAYER_TYPE_SWAONLY,
    LayerType,
    compress_ratio_of,
    layer_type_for_ratio,
    layer_types,
    make_common_metadata,
    split_decodes_and_prefills,
)


def batch(query_lens, seq_lens, **kwargs):
    tokens = sum(query_lens)
    table = torch.zeros(len(query_lens), 1, dtype=torch.int32)
    return make_common_metadata(query_lens, seq_lens, table, torch.arange(tokens), **kwargs)


def test_layer_types_from_compress_ratios():
    flash_prefix = [0, 0, 4, 128, 4, 128, 1]
    assert layer_types(flash_prefix) == [LayerType.SWA_ONLY, LayerType.SWA_ONLY, LayerType.C4A, LayerType.C128A,
                                         LayerType.C4A, LayerType.C128A, LayerType.SWA_ONLY]
    assert (LAYER_TYPE_SWAONLY, LAYER_TYPE_C4A, LAYER_TYPE_C128A) == ("swaonly", "c4a", "c128a")
    assert [compress_ratio_of(t) for t in LayerType] == [1, 4, 128, 1, 2]
    v41 = layer_types([0, 0, 2, 2, 1], "v4.1")
    assert v41 == [LayerType.SWA_ONLY, LayerType.SWA_ONLY, LayerType.C2A, LayerType.C2A, LayerType.C1A]
    assert layer_type_for_ratio(LayerType.C1A) is LayerType.C1A  # a type goes through as it is
    with pytest.raises(ValueError, match=r"unsupported compress ratio 4 for DeepSeek-V4.1; supported: \[0, 1, 2\]"):
        layer_types([4], "v4.1")
    with pytest.raises(ValueError, match="unknown DeepSeek model version 'v5'"):
        layer_type_for_ratio(0, "v5")


@pytest.mark.parametrize("ratio", [2, 3, 8, 64, 256, -1])
def test_unsupported_ratio_is_a_value_error(ratio):
    with pytest.raises(ValueError, match=r"supported: \[0, 1, 4, 128\]"):
        layer_type_for_ratio(ratio)


def test_positions_and_requests_from_lengths():
    cm = batch([1, 3, 2], [10, 5, 2])
    assert cm.query_start_loc.tolist() == [0, 1, 4, 6]
    assert (cm.num_reqs, cm.num_actual_tokens, cm.max_query_len, cm.max_seq_len) == (3, 6, 3, 10)
    assert cm.token_positions().tolist() == [9, 2, 3, 4, 0, 1]
    assert cm.token_requests().tolist() == [0, 1, 1, 1, 2, 2]
    buffer = torch.full((8,), 7, dtype=torch.int32)
    view = cm.token_to_req_indices(buffer)
    assert view.data_ptr() == buffer.data_ptr() and buffer.tolist() == [0, 1, 1, 1, 2, 2, 7, 7]


def test_given_positions_win():
    cm = batch([2], [2], positions=torch.tensor([40, 41]))
    assert cm.token_positions().tolist() == [40, 41]


@pytest.mark.parametrize("query_lens, seq_lens, message", [
    ([2, 1], [1, 4], "query_len <= seq_len"),
    ([1], [1, 2], "1-D of one length"),
])
def test_bad_lengths(query_lens, seq_lens, message):
    with pytest.raises(ValueError, match=message):
        make_common_metadata(query_lens, seq_lens, torch.zeros(len(seq_lens), 1), torch.arange(4))


def test_short_slot_mapping_and_table_rows():
    with pytest.raises(ValueError, match="slot_mapping has 2 entries for 3 tokens"):
        make_common_metadata([3], [3], torch.zeros(1, 1), torch.arange(2))
    with pytest.raises(ValueError, match=r"block_table must be \[num_reqs = 2"):
        make_common_metadata([1, 1], [3, 3], torch.zeros(1, 1), torch.arange(2))


@pytest.mark.parametrize("query_lens, threshold, uniform, expected", [
    ([1, 1, 1], 1, False, (3, 0, 3, 0)),  # all decode
    ([5, 3], 1, False, (0, 2, 0, 8)),  # first request is a prefill
    ([1, 1, 4, 7], 1, False, (2, 2, 2, 11)),  # mixed, decodes first
    ([2, 1, 6], 2, False, (2, 1, 3, 6)),  # MTP: up to 2 tokens is a decode, lengths may differ
    ([2, 1, 6], 2, True, (1, 2, 2, 7)),  # uniform: the first different length starts the prefills
    ([2, 2, 0], 2, True, (3, 0, 4, 0)),  # uniform with a padded (0-token) request
    ([1, 1, 1], 1, True, (3, 0, 3, 0)),
])
def test_split(query_lens, threshold, uniform, expected):
    seq_lens = [q + 10 for q in query_lens]
    assert tuple(split_decodes_and_prefills(batch(query_lens, seq_lens), threshold, uniform)) == expected


def test_short_extend_of_a_prompt_can_count_as_prefill():
    cm = batch([1, 1], [5, 3], is_prefilling=torch.tensor([False, True]))
    assert tuple(split_decodes_and_prefills(cm, 1)) == (2, 0, 2, 0)
    assert tuple(split_decodes_and_prefills(cm, 1, treat_short_extends_as_decodes=False)) == (1, 1, 1, 1)


def test_decode_after_prefill_is_rejected():
    with pytest.raises(ValueError, match="decodes first"):
        split_decodes_and_prefills(batch([1, 5, 1], [3, 9, 4]), 1)
