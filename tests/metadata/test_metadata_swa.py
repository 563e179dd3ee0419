"""Sliding-window metadata on hand-made batches: window slots and lengths, padding, gather lengths, chunk plan,
tile schedulers, persistent buffers and the CPU variant."""

from __future__ import annotations

import pytest
import torch

from dsv4.metadata import (
    AttentionMetadataConfig,
    AttentionPrefillChunk,
    DeepseekSparseSWAMetadataBuilder,
    DeepseekV4CPUSparseSWAMetadataBuilder,
    LayerType,
    build_tile_schedulers,
    make_common_metadata,
    plan_attention_prefill_chunks,
)

BLOCK, WINDOW = 64, 128
UNUSED = -1  # block-table padding / a recycled block


def run(*pieces: tuple[int, int, int]) -> torch.Tensor:
    """Slots of consecutive offsets: each piece (physical block, first offset, count) in order, then -1 up to W."""
    slots = torch.cat([torch.arange(block * BLOCK + first, block * BLOCK + first + count) for block, first, count
                       in pieces])
    return torch.cat([slots, torch.full((WINDOW - slots.numel(),), -1)]).to(torch.int32)


def config(**overrides) -> AttentionMetadataConfig:
    return AttentionMetadataConfig(**{"max_num_batched_tokens": 16, "max_model_len": 1024,
                                      "compress_ratios": (0, 4, 128), **overrides})


# Decodes first: r0 at p=127 (the first full window), r1 at p=199 (window 72..199 over 3 blocks, block 0
# recycled), r2 a padded decode; then r3 a chunked prefill (prefix 100, 3 tokens) and r4 a fresh 2-token prompt.
QUERY_LENS = [1, 1, 1, 3, 2]
SEQ_LENS = [128, 200, 1, 103, 2]
TABLE = torch.tensor([[5, 2, UNUSED, UNUSED],
                      [UNUSED, 3, 9, 11],
                      [0, UNUSED, UNUSED, UNUSED],
                      [4, 6, UNUSED, UNUSED],
                      [8, UNUSED, UNUSED, UNUSED]], dtype=torch.int32)
SLOTS = torch.tensor([2 * 64 + 63, 11 * 64 + 7, -1, 6 * 64 + 36, 6 * 64 + 37, 6 * 64 + 38, 8 * 64, 8 * 64 + 1])


def mixed_batch(padding: int = 0):
    slot_mapping = torch.cat([SLOTS, torch.full((padding,), -1)])
    return make_common_metadata(QUERY_LENS, SEQ_LENS, TABLE, slot_mapping)


def test_mixed_decode_and_prefill_windows():
    meta = DeepseekSparseSWAMetadataBuilder(config()).build(mixed_batch())
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens, meta.num_prefill_tokens) == (3, 2, 3, 5)
    assert meta.block_size == BLOCK
    assert meta.token_to_req_indices.tolist() == [0, 1, 2, 3, 3, 3, 4, 4]
    assert meta.decode_swa_lens.tolist() == [128, 128, 0]
    expected_decode = torch.stack([
        run((5, 0, 64), (2, 0, 64)),  # p = 127: positions 0..127
        run((3, 8, 56), (9, 0, 64), (11, 0, 8)),  # p = 199: positions 72..199
        torch.full((WINDOW,), -1, dtype=torch.int32),  # padding
    ])
    assert torch.equal(meta.decode_swa_indices[:, 0], expected_decode)
    assert meta.decode_swa_indices.shape == (3, 1, WINDOW) and meta.decode_swa_indices.dtype == torch.int32
    assert meta.prefill_swa_lens.tolist() == [101, 102, 103, 1, 2]
    expected_prefill = torch.stack([
        run((4, 0, 64), (6, 0, 37)),  # p = 100
        run((4, 0, 64), (6, 0, 38)),
        run((4, 0, 64), (6, 0, 39)),
        run((8, 0, 1)),  # p = 0
        run((8, 0, 2)),
    ])
    assert torch.equal(meta.prefill_swa_indices[:, 0], expected_prefill)


def test_window_boundaries():
    """p = 126 (one short of full), 127 (full), 128 (slides by one), 191 -> 192 (window enters a third block)."""
    positions = [126, 127, 128, 191, 192]
    table = torch.tensor([[1, 2, 3, 4]] * len(positions), dtype=torch.int32)
    cm = make_common_metadata([1] * 5, [p + 1 for p in positions], table, torch.arange(5))
    meta = DeepseekSparseSWAMetadataBuilder(config()).build(cm)
    assert meta.decode_swa_lens.tolist() == [127, 128, 128, 128, 128]
    expected = torch.stack([
        run((1, 0, 64), (2, 0, 63)),
        run((1, 0, 64), (2, 0, 64)),
        run((1, 1, 63), (2, 0, 64), (3, 0, 1)),
        run((2, 0, 64), (3, 0, 64)),  # positions 64..191
        run((2, 1, 63), (3, 0, 64), (4, 0, 1)),  # positions 65..192
    ])
    assert torch.equal(meta.decode_swa_indices[:, 0], expected)


def test_padding_rows_and_valid_mask():
    meta = DeepseekSparseSWAMetadataBuilder(config()).build(mixed_batch(padding=3))
    assert meta.is_valid_token.tolist() == [True, True, False, True, True, True, True, True, False, False, False]
    assert meta.slot_mapping.shape == (11,)


def test_prefill_lengths_and_gather():
    meta = DeepseekSparseSWAMetadataBuilder(config()).build(mixed_batch())
    assert meta.prefill_seq_lens.tolist() == [103, 2] and meta.prefill_seq_lens_cpu.tolist() == [103, 2]
    assert meta.prefill_query_lens_cpu.tolist() == [3, 2] and meta.prefill_query_lens_cpu.dtype == torch.int32
    assert meta.prefill_gather_lens.tolist() == [3 + 100, 2 + 0]
    long_prefix = make_common_metadata([4], [504], torch.arange(8, dtype=torch.int32)[None], torch.arange(4))
    assert DeepseekSparseSWAMetadataBuilder(config()).build(long_prefix).prefill_gather_lens_cpu.tolist() == [4 + 127]


def test_persistent_buffers_are_reused():
    builder = DeepseekSparseSWAMetadataBuilder(config())
    first = builder.build(mixed_batch())
    second = builder.build(mixed_batch())
    for name in ("decode_swa_indices", "decode_swa_lens", "prefill_swa_indices", "prefill_swa_lens",
                 "is_valid_token", "token_to_req_indices"):
        assert getattr(first, name).data_ptr() == getattr(second, name).data_ptr() == getattr(builder, name).data_ptr()


def test_decode_lengths_past_the_step_are_zeroed():
    builder = DeepseekSparseSWAMetadataBuilder(config())
    builder.build(make_common_metadata([1] * 4, [9] * 4, torch.zeros(4, 1, dtype=torch.int32), torch.arange(4)))
    builder.build(make_common_metadata([1], [9], torch.zeros(1, 1, dtype=torch.int32), torch.arange(1)))
    assert builder.decode_swa_lens[:4].tolist() == [9, 0, 0, 0]


def test_too_many_tokens():
    cm = make_common_metadata([20], [20], torch.zeros(1, 1, dtype=torch.int32), torch.arange(20))
    try:
        DeepseekSparseSWAMetadataBuilder(config()).build(cm)
    except ValueError as error:
        assert "max_num_batched_tokens = 16" in str(error)
    else:
        raise AssertionError("a step over max_num_batched_tokens must be refused")


def test_prefill_chunk_plan():
    """Budget for R=4: 4 * (ceil(1024/4) + 128 + 16) = 1600 workspace rows."""
    seq_lens = torch.tensor([400, 400, 400, 400, 1024, 40])  # compressed 100, 100, 100, 100, 256, 10
    gathers = torch.tensor([200, 200, 200, 200, 200, 20])
    chunks = plan_attention_prefill_chunks(seq_lens, gathers, 4, 1024, 128, 16)
    # 4 * (100 + 200) = 1200 fits; a fifth at N=256 needs 5 * 456 > 1600; then 2 * (256 + 200) = 912 fits.
    assert chunks == [AttentionPrefillChunk(0, 4, 100, 300), AttentionPrefillChunk(4, 6, 256, 456)]
    window_only = plan_attention_prefill_chunks(seq_lens, gathers, 1, 1024, 128, 16)  # budget 4 * 144 = 576
    assert window_only == [AttentionPrefillChunk(0, 2, 0, 200), AttentionPrefillChunk(2, 4, 0, 200),
                           AttentionPrefillChunk(4, 6, 0, 200)]  # 2 * 200 fits, 3 * 200 does not
    meta = DeepseekSparseSWAMetadataBuilder(config()).build(mixed_batch())
    assert meta.prefill_chunk_plan(128) == [AttentionPrefillChunk(0, 2, 0, 103)]


def test_single_request_over_budget_is_its_own_chunk():
    chunks = plan_attention_prefill_chunks(torch.tensor([10, 4000, 10]), torch.tensor([5, 3000, 5]), 4, 1024, 128, 16)
    assert [(c.start, c.end) for c in chunks] == [(0, 1), (1, 2), (2, 3)]


def test_tile_schedulers():
    fresh = build_tile_schedulers({LayerType.SWA_ONLY, LayerType.C4A}, 3, True, new_sched_meta=object)
    assert fresh[LayerType.C128A] is None
    assert fresh["swaonly"] is not None and fresh["c4a"] is not None and fresh["swaonly"] is not fresh["c4a"]
    assert set(build_tile_schedulers(LayerType, 0, True, new_sched_meta=object).values()) == {None}
    assert set(build_tile_schedulers(LayerType, 3, False, new_sched_meta=object).values()) == {None}
    meta = DeepseekSparseSWAMetadataBuilder(config()).build(mixed_batch())  # the CPU plans no schedule
    assert (meta.tile_sched_swaonly, meta.tile_sched_c4a, meta.tile_sched_c128a) == (None, None, None)


def test_cpu_variant():
    builder = DeepseekV4CPUSparseSWAMetadataBuilder(config())
    # every layer type, V4.1's c1a and c2a too: vLLM 0.32.0's CPU builder returns only the V4.0 ones
    assert builder.build_tile_scheduler(5) == {"swaonly": None, "c4a": None, "c128a": None, "c1a": None, "c2a": None}
    cpu, base = builder.build(mixed_batch()), DeepseekSparseSWAMetadataBuilder(config()).build(mixed_batch())
    assert torch.equal(cpu.decode_swa_indices, base.decode_swa_indices)
    assert torch.equal(cpu.prefill_swa_indices, base.prefill_swa_indices)


def test_default_schedule_is_a_fresh_flashmla_sched_meta():
    flash_mla = pytest.importorskip("dsv4.flash_mla")
    fresh = build_tile_schedulers({LayerType.C4A}, 1, True)[LayerType.C4A]
    assert isinstance(fresh, flash_mla.FlashMLASchedMeta) and not fresh.have_initialized
