"""MXFP4 indexer keys: the reference rule, DeepSeek-V4.1's key writer (indexer_k_norm_rope_store) and the generic
key insert in either key format, byte for byte against the reference on every tier."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rejects, clone_storage, distinct_slots, random_pages, replaced, rope_table, storage_bytes
from dsv4 import cache as dsv4_cache
from dsv4 import ops
from dsv4.constants import INDEXER_HEAD_DIM
from dsv4.reference import indexer, quant

KEY_FORMATS = ("fp8", "mxfp4")
MAX_POSITION = 600


def test_mxfp4_rule_ties_saturation_sign_and_nan():
    """Boundaries take the lower code, values past 5 (times the scale) go to 6, a negative that rounds to 0 has no
    sign bit, NaN is left out of the block's amax and stored as 0; the scale is ceil(log2(amax / 6))."""
    block = torch.tensor([0.25, 0.2501, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.001, 6.0, -0.25, -0.3, float("nan"),
                          -6.0, 0.0, -0.0] + [0.0] * 16)
    codes, scales = quant.mxfp4_pack(block[None])
    assert scales.tolist() == [[127]]  # amax 6 -> exponent 0
    nibbles = torch.stack([codes[0] & 0xF, codes[0] >> 4], dim=-1).reshape(-1)[:16].tolist()
    assert nibbles == [0, 1, 1, 2, 3, 4, 5, 6, 7, 7, 0, 9, 0, 15, 0, 0]
    assert quant.mxfp4_pack(torch.full((1, 32), 6.001))[1].tolist() == [[128]]
    assert quant.mxfp4_pack(torch.zeros(1, 32))[1].tolist() == [[1]]  # amax floored at 6 * 2^-126
    inf_codes, inf_scales = quant.mxfp4_pack(torch.tensor([[float("inf")] + [1.0] * 31]))
    assert inf_scales.tolist() == [[254]] and int(inf_codes[0, 0]) & 0xF == 7


def test_mxfp4_round_trip_is_exact_and_bounded():
    x = torch.randn(64, 128) * torch.exp2(torch.randint(-20, 20, (64, 1)).float())
    codes, scales = quant.mxfp4_pack(x)
    y = quant.mxfp4_unpack(codes, scales)
    assert torch.equal(quant.mxfp4_unpack(*quant.mxfp4_pack(y)), y), "decoded values re-encode to themselves"
    step = torch.ldexp(torch.ones(64, 4), scales.float() - 127).repeat_interleave(32, dim=1)
    assert torch.all((x - y).abs() <= step + 1e-30)  # within one e2m1 step (the largest gap is 2) times the scale
    assert torch.equal(y, y.to(torch.bfloat16).float()), "decoded values are exact in bf16"


@pytest.mark.parametrize("key_format", KEY_FORMATS)
def test_cache_geometry(key_format):
    bytes_per_entry = dsv4_cache.INDEXER_KEY_FORMATS[key_format]
    assert dsv4_cache.indexer_k_page_bytes(64, key_format) == dsv4_cache.aligned_page_bytes(64, bytes_per_entry)
    cache = dsv4_cache.allocate_indexer_k_cache(3, 64, key_format=key_format)
    assert cache.shape == (3, dsv4_cache.indexer_k_page_bytes(64, key_format))
    with pytest.raises(ValueError, match="key format"):
        dsv4_cache.indexer_k_page_bytes(64, "fp4")


def writer_case(tokens, block_size, ratio, key_format, index_dtype=torch.int64, strided=False):
    num_blocks = max(1, 2 * tokens // block_size + 1)
    k = (torch.randn(tokens, INDEXER_HEAD_DIM + (32 if strided else 0)) * 3).to(torch.bfloat16)
    k = k[:, :INDEXER_HEAD_DIM]
    positions = torch.randint(0, MAX_POSITION, (tokens,))
    positions[: tokens // 2] = torch.randint(1, MAX_POSITION // ratio, (tokens // 2,)) * ratio - 1  # closing tokens
    return dict(k_pre=k, positions=positions.to(index_dtype), cos_sin_cache=rope_table(MAX_POSITION),
                norm_weight=torch.rand(INDEXER_HEAD_DIM) + 0.5, eps=1e-6,
                kv_cache=random_pages(num_blocks, dsv4_cache.indexer_k_page_bytes(block_size, key_format), 40),
                slot_mapping=distinct_slots(tokens, num_blocks * block_size, 0.15).to(index_dtype),
                block_size=block_size, compress_ratio=ratio, key_format=key_format)


@pytest.mark.parametrize("key_format", KEY_FORMATS)
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("block_size", [1, 61, 64])
def test_norm_rope_store_matches_reference(isa, key_format, ratio, block_size):
    args = writer_case(40, block_size, ratio, key_format, strided=block_size == 61)
    expected = clone_storage(args["kv_cache"])
    indexer.indexer_k_norm_rope_store(**{**args, "kv_cache": expected})
    before = storage_bytes(args["kv_cache"]).clone()
    ops.indexer_k_norm_rope_store(**args)
    assert torch.equal(storage_bytes(args["kv_cache"]), storage_bytes(expected))
    assert not torch.equal(storage_bytes(args["kv_cache"]), before), "closing tokens with slots write"


@pytest.mark.parametrize("key_format", KEY_FORMATS)
def test_norm_rope_store_skips_and_empty(isa, key_format):
    args = writer_case(16, 64, 4, key_format, index_dtype=torch.int32)
    args["positions"] = torch.arange(16, dtype=torch.int32) * 4  # (p + 1) % 4 != 0: nobody closes a group
    before = storage_bytes(args["kv_cache"]).clone()
    ops.indexer_k_norm_rope_store(**args)
    assert torch.equal(storage_bytes(args["kv_cache"]), before)
    empty = writer_case(0, 64, 4, key_format)
    ops.indexer_k_norm_rope_store(**empty)


def test_norm_rope_store_opcheck(opcheck):
    args = writer_case(8, 16, 2, "mxfp4")
    opcheck(torch.ops.dsv4.indexer_k_norm_rope_store.default, tuple(args.values()))


@pytest.mark.parametrize("corrupt,message", [
    (replaced(k_pre=torch.zeros(4, 128)), "argument 'k_pre' must have dtype BFloat16"),
    (replaced(k_pre=torch.zeros(4, 64, dtype=torch.bfloat16)), "argument 'k_pre'"),
    (replaced(key_format="fp4"), "argument 'key_format' must be 'fp8'"),
    (replaced(compress_ratio=0), "argument 'compress_ratio'"),
    (replaced(norm_weight=torch.ones(64)), "argument 'norm_weight'"),
    (replaced(positions=torch.full((4,), MAX_POSITION)), "argument 'positions' entry 0"),
    (replaced(slot_mapping=torch.full((4,), 10**6)), "argument 'slot_mapping'"),
    (replaced(block_size=32), "argument 'kv_cache'"),
    (replaced(eps=-1.0), "argument 'eps'"),
])
def test_norm_rope_store_rejects(corrupt, message):
    args = writer_case(4, 64, 1, "mxfp4")
    corrupt(args)
    assert_rejects(ops.indexer_k_norm_rope_store, args, message, unchanged=("kv_cache",))


def test_norm_rope_store_rejects_fp8_cache_as_mxfp4():
    args = writer_case(4, 64, 1, "fp8")
    args["key_format"] = "mxfp4"  # 8640-byte pages are no 68-byte page size
    assert_rejects(ops.indexer_k_norm_rope_store, args, "argument 'kv_cache'", unchanged=("kv_cache",))


@pytest.mark.parametrize("key_format", KEY_FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quant_insert_formats(isa, key_format, dtype):
    tokens, block_size = 50, 16
    num_blocks = 2 * tokens // block_size + 1
    k = (torch.randn(tokens, INDEXER_HEAD_DIM) * torch.exp2(torch.randint(-10, 10, (tokens, 1)).float())).to(dtype)
    k[3, 5] = float("nan")  # NaN: code 0, left out of its block's amax (mxfp4)
    slots = distinct_slots(tokens, num_blocks * block_size, 0.2)
    cache = random_pages(num_blocks, dsv4_cache.indexer_k_page_bytes(block_size, key_format), 8)
    expected = clone_storage(cache)
    if key_format == "fp8":
        k[3, 5] = 1.0  # the fp8 rule keeps NaN as its own business: not part of this test
    quant.indexer_k_insert(expected, slots, block_size, k.float(), key_format)
    ops.indexer_k_quant_insert(k, slots, cache, block_size, key_format=key_format)
    assert torch.equal(storage_bytes(cache), storage_bytes(expected))
    data, scales = quant.indexer_k_read(cache, slots, block_size, key_format=key_format)
    want_data, want_scales = quant.indexer_key_pack(k.float(), key_format)
    assert torch.equal(data[slots >= 0], want_data[slots >= 0])
    if key_format == "mxfp4":
        assert torch.equal(scales[slots >= 0], want_scales[slots >= 0]) and not scales[slots < 0].any()


def test_quant_insert_fp8_format_is_the_old_op():
    k = torch.randn(10, INDEXER_HEAD_DIM)
    slots = torch.arange(10)
    a, b = (random_pages(2, dsv4_cache.indexer_k_page_bytes(8), 0) for _ in range(2))
    b.copy_(a)
    torch.ops.dsv4.indexer_k_quant_insert(k, slots, a, 8)
    torch.ops.dsv4.indexer_k_quant_insert.format(k, slots, b, 8, "fp8")
    assert torch.equal(a, b)
    codes, scales = quant.indexer_k_pack(k)
    want = torch.zeros_like(a)
    quant.indexer_k_write(want, slots, 8, codes, scales)
    got = torch.zeros_like(a)
    quant.indexer_key_write(got, slots, 8, *quant.indexer_key_pack(k, "fp8"), "fp8")
    assert torch.equal(got, want), "the key-format writer keeps the fp8 bytes"
