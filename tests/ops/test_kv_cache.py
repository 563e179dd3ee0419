"""quantize_kv_insert, dequantize_kv_gather, indexer_k_quant_insert against reference/quant.py.

The writers are deterministic encoders of bf16-rounded inputs, so they must be byte-exact; the
whole cache storage (page padding included) is compared, so bytes outside the written entries
are proven untouched. reference/quant.py itself is checked against hand-computed bytes first.
"""

from __future__ import annotations

import pytest
import torch

from conftest import (
    PAGE_SIZES,
    assert_rejects,
    clone_storage,
    column_slice,
    distinct_slots,
    random_pages,
    storage_bytes,
)
from dsv4 import ops
from dsv4.constants import (
    INDEXER_HEAD_DIM,
    INDEXER_K_BYTES_PER_ENTRY,
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_DATA_BYTES,
    MODEL1_HEAD_DIM,
    MODEL1_NOPE_DIM,
    MODEL1_TILE,
    ROPE_DIM,
    V32_BYTES_PER_TOKEN,
    V32_HEAD_DIM,
    V32_NOPE_DIM,
    V32_TILE,
)
from dsv4.reference import quant

PAD_BYTES = 40  # page stride = page bytes + this: padding that must stay untouched
NUM_TOKENS = 24
SKIP_FRACTION = 0.2  # share of slot_mapping entries set to -1

LAYOUTS = {  # head dim -> (bytes per entry, reference writer, reference reader)
    MODEL1_HEAD_DIM: (MODEL1_BYTES_PER_TOKEN, quant.model1_write, quant.model1_read),
    V32_HEAD_DIM: (V32_BYTES_PER_TOKEN, quant.v32_write, quant.v32_read),
}

# ---------------------------------------------------------------------------------------------
# reference/quant.py against hand-computed bytes
# ---------------------------------------------------------------------------------------------

E4M3_CODES = [  # (value, e4m3fn byte): RNE, saturating at 448, subnormals (multiples of 2^-9) kept
    (448.0, 0x7E),
    (-448.0, 0xFE),
    (464.0, 0x7E),  # halfway to 480 (a NaN code): saturates, never rounds up
    (1000.0, 0x7E),
    (240.0, 0x77),
    (1.0, 0x38),
    (1.0625, 0x38),  # tie between 1.0 (even) and 1.125
    (1.1875, 0x3A),  # tie between 1.125 and 1.25 (even)
    (2.0**-6, 0x08),  # smallest normal
    (15 * 2.0**-10, 0x08),  # tie between the largest subnormal 7*2^-9 and 2^-6 (even)
    (7 * 2.0**-9, 0x07),
    (2.0**-9, 0x01),  # smallest subnormal
    (3 * 2.0**-10, 0x02),  # tie between subnormal codes 1 and 2 (even)
    (5 * 2.0**-10, 0x02),  # tie between subnormal codes 2 (even) and 3
    (3 * 2.0**-11, 0x01),
    (2.0**-10, 0x00),  # tie between 0 (even) and 2^-9
    (-(2.0**-9), 0x81),
    (-0.0, 0x80),
]


E4M3_VALUES = {0x7E: 448.0, 0x77: 240.0, 0x38: 1.0, 0x3A: 1.25, 0x08: 2.0**-6, 0x07: 7 * 2.0**-9, 0x02: 2.0**-8,
               0x01: 2.0**-9, 0x81: -(2.0**-9), 0x00: 0.0, 0xFE: -448.0}


def test_reference_e4m3_codes_by_hand():
    values = torch.tensor([v for v, _ in E4M3_CODES])
    expected = torch.tensor([c for _, c in E4M3_CODES], dtype=torch.uint8)
    assert quant.encode_e4m3(values).tolist() == expected.tolist()
    codes = torch.tensor(list(E4M3_VALUES), dtype=torch.uint8)
    assert quant.decode_e4m3(codes).tolist() == list(E4M3_VALUES.values())
    assert quant.decode_e4m3(torch.tensor([0x7F, 0xFF], dtype=torch.uint8)).isnan().all()


def test_reference_ceil_log2_by_hand():
    x = torch.tensor([1.0, 1.5, 0.75, 2.0**-13, 3.0, 448.0, 2.0**-126])
    expected = torch.tensor([0, 1, 0, -13, 2, 9, -126], dtype=torch.int32)
    assert torch.equal(quant.ceil_log2(x), expected)


def test_reference_model1_entry_by_hand():
    kv = torch.zeros(1, MODEL1_HEAD_DIM)
    # tile -> amax (first element of the tile): exponent ceil(log2(max(amax/448, 1e-4)))
    amax_and_scale_byte = [
        (448.0, 127),  # amax exactly 448 * 2^0
        (448.0 * 8, 130),  # exactly 448 * 2^3: exponent 3, not 4
        (3600.0, 131),  # just above 448 * 2^3
        (448.0 * 2.0**-5, 122),
        (448.0 * 2.0**-12, 115),  # amax/448 = 2^-12 > 1e-4
        (1e-6, 114),  # amax/448 below the 1e-4 floor: exponent ceil(log2(1e-4)) = -13
        (0.0, 114),  # an all-zero tile is floored too
    ]
    for tile, (amax, _) in enumerate(amax_and_scale_byte):
        kv[0, tile * MODEL1_TILE] = amax
    kv[0, MODEL1_TILE + 1] = -(2.0**-6)  # one subnormal step (2^-9) of tile 1's scale 2^3: code 0x81
    kv[0, MODEL1_NOPE_DIM] = 1.0  # bf16 0x3F80
    kv[0, MODEL1_NOPE_DIM + 1] = -2.0  # bf16 0xC000
    data, scales = quant.model1_pack(kv)
    expected_scales = [b for _, b in amax_and_scale_byte] + [0]
    assert scales[0].tolist() == expected_scales
    first_codes = data[0, :MODEL1_NOPE_DIM:MODEL1_TILE].tolist()
    # 3600 / 16 = 225 rounds to 224 (0x76); 1e-6 * 2^13 = 8.2e-3 -> 4.19 subnormal steps -> 4
    assert first_codes == [0x7E, 0x7E, 0x76, 0x7E, 0x7E, 0x04, 0x00]
    assert data[0, MODEL1_TILE + 1].item() == 0x81
    assert data[0, MODEL1_NOPE_DIM : MODEL1_NOPE_DIM + 4].tolist() == [0x80, 0x3F, 0x00, 0xC0]


def test_reference_v32_entry_by_hand():
    kv = torch.zeros(1, V32_HEAD_DIM)
    kv[0, 0] = 896.0  # tile 0: amax 448 * 2 -> fp32 scale 2.0
    kv[0, V32_TILE] = 448.0 * 2.0**-4  # tile 1: scale 2^-4
    kv[0, V32_NOPE_DIM] = 1.0
    entry = quant.v32_pack(kv)[0]
    assert entry[0].item() == 0x7E and entry[V32_TILE].item() == 0x7E
    scales = entry[V32_NOPE_DIM : V32_NOPE_DIM + 16].view(torch.float32).tolist()
    assert scales == [2.0, 2.0**-4, 2.0**-13, 2.0**-13]
    assert entry[V32_NOPE_DIM + 16 : V32_NOPE_DIM + 18].tolist() == [0x80, 0x3F]


def test_reference_indexer_scale_by_hand():
    rows = torch.zeros(4, INDEXER_HEAD_DIM)
    rows[0, 5] = 448.0  # exactly 448 * 2^0 -> scale 1
    rows[1, 7] = -450.0  # just above (exact in bf16) -> scale 2
    rows[2, 0] = 448.0 * 2.0**-10
    rows[3, 0] = 1e-6  # amax floored at 1e-4: 1e-4/448 -> 2^-22
    codes, scales = quant.indexer_k_pack(rows)
    assert scales.tolist() == [1.0, 2.0, 2.0**-10, 2.0**-22]
    assert codes[0, 5].item() == 0x7E and codes[2, 0].item() == 0x7E
    assert codes[1, 7].item() == 0xF6  # -450 / 2 = -225 rounds to -224 = -1.75 * 2^7


def test_reference_paged_offsets_by_hand():
    block_size, pad = 2, 16
    cache = torch.zeros(3, block_size * MODEL1_BYTES_PER_TOKEN + pad, dtype=torch.uint8)
    kv = torch.full((1, MODEL1_HEAD_DIM), 448.0)
    quant.model1_write(cache[:, : block_size * MODEL1_BYTES_PER_TOKEN], torch.tensor([3]), block_size, kv)
    touched = cache.nonzero()
    data_start, scale_start = MODEL1_DATA_BYTES, block_size * MODEL1_DATA_BYTES + 8
    assert set(touched[:, 0].tolist()) == {1}  # slot 3 = block 1, offset 1
    columns = touched[:, 1]
    assert columns.min().item() == data_start and columns.max().item() == scale_start + 6
    assert cache[1, scale_start : scale_start + 8].tolist() == [127] * 7 + [0]
    k_cache = torch.zeros(2, block_size * INDEXER_K_BYTES_PER_ENTRY, dtype=torch.uint8)
    quant.indexer_k_write(k_cache, torch.tensor([1]), block_size, torch.full((1, 128), 7, dtype=torch.uint8),
                          torch.tensor([2.0]))
    assert k_cache[0, 128:256].eq(7).all() and k_cache[0, :128].eq(0).all()
    assert k_cache[0, 256 + 4 : 256 + 8].view(torch.float32).item() == 2.0


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------


def wide_range_rows(num_rows: int, dim: int, group: int) -> torch.Tensor:
    """fp32 rows whose groups span many magnitudes, so floored scales and fp8 subnormals occur."""
    group_scale = 2.0 ** torch.randint(-16, 10, (num_rows, dim // group)).float().repeat_interleave(group, dim=1)
    element_scale = 2.0 ** torch.randint(-10, 1, (num_rows, dim)).float()
    return torch.randn(num_rows, dim) * group_scale * element_scale


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-2 * num_tokens // block_size) + 1  # about half the slots stay unwritten


def assert_same_storage(actual: torch.Tensor, expected: torch.Tensor):
    a, e = storage_bytes(actual), storage_bytes(expected)
    mismatch = (a != e).nonzero().flatten()
    assert mismatch.numel() == 0, f"{mismatch.numel()} bytes differ, first at storage byte {mismatch[:8].tolist()}"


# ---------------------------------------------------------------------------------------------
# quantize_kv_insert
# ---------------------------------------------------------------------------------------------


def run_quantize_kv_insert(head_dim, block_size, dtype, index_dtype, num_tokens=NUM_TOKENS):
    bytes_per_entry, write, _ = LAYOUTS[head_dim]
    cache = random_pages(blocks_for(num_tokens, block_size), block_size * bytes_per_entry, PAD_BYTES)
    expected = clone_storage(cache)
    kv = column_slice(wide_range_rows(num_tokens, head_dim, MODEL1_TILE).to(dtype))
    slots = distinct_slots(num_tokens, cache.shape[0] * block_size, SKIP_FRACTION).to(index_dtype)
    ops.quantize_kv_insert(kv, slots, cache, block_size)
    write(expected, slots.long(), block_size, kv.float())
    assert_same_storage(cache, expected)


@pytest.mark.parametrize("block_size", PAGE_SIZES)
@pytest.mark.parametrize("head_dim", [MODEL1_HEAD_DIM, V32_HEAD_DIM], ids=["model1", "v32"])
def test_quantize_kv_insert_byte_exact(isa, head_dim, block_size):
    run_quantize_kv_insert(head_dim, block_size, torch.bfloat16, torch.int64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [MODEL1_HEAD_DIM, V32_HEAD_DIM], ids=["model1", "v32"])
def test_quantize_kv_insert_input_dtypes(isa, head_dim, dtype):
    run_quantize_kv_insert(head_dim, 64, dtype, torch.int32)


@pytest.mark.parametrize("head_dim", [MODEL1_HEAD_DIM, V32_HEAD_DIM], ids=["model1", "v32"])
def test_quantize_kv_insert_empty_batch(head_dim):
    run_quantize_kv_insert(head_dim, 64, torch.bfloat16, torch.int32, num_tokens=0)


def test_quantize_kv_insert_four_dim_cache_view(isa):
    """FlashMLA's [num_blocks, block_size, 1, 584] view addresses the same bytes as the 2-D view."""
    block_size = 64
    pages = random_pages(3, block_size * MODEL1_BYTES_PER_TOKEN, PAD_BYTES)
    expected = clone_storage(pages)
    view = pages.as_strided((3, block_size, 1, MODEL1_BYTES_PER_TOKEN),
                            (pages.stride(0), MODEL1_BYTES_PER_TOKEN, MODEL1_BYTES_PER_TOKEN, 1))
    kv = wide_range_rows(NUM_TOKENS, MODEL1_HEAD_DIM, MODEL1_TILE).bfloat16()
    slots = distinct_slots(NUM_TOKENS, 3 * block_size, SKIP_FRACTION).to(torch.int64)
    ops.quantize_kv_insert(kv, slots, view, block_size)
    quant.model1_write(expected, slots, block_size, kv.float())
    assert_same_storage(pages, expected)


# ---------------------------------------------------------------------------------------------
# dequantize_kv_gather
# ---------------------------------------------------------------------------------------------

GATHER_SHAPES = [(37,), (5, 8), (2, 3, 7), (0,), (3, 0), ()]


def gather_slots_with_invalid(shape, capacity: int, index_dtype: torch.dtype) -> torch.Tensor:
    """Slots over the whole cache plus -1, other negatives and ids past the cache (all invalid)."""
    candidates = torch.tensor([-1, -7, capacity, capacity + 1000])
    slots = torch.randint(0, capacity, shape)
    invalid = torch.rand(shape) < SKIP_FRACTION
    slots[invalid] = candidates[torch.randint(0, len(candidates), (int(invalid.sum()),))]
    return slots.to(index_dtype)


@pytest.mark.parametrize("block_size", PAGE_SIZES)
@pytest.mark.parametrize("head_dim", [MODEL1_HEAD_DIM, V32_HEAD_DIM], ids=["model1", "v32"])
def test_dequantize_kv_gather_exact(isa, head_dim, block_size):
    """Random cache bytes decode exactly as the reference (NaN scales and codes included)."""
    bytes_per_entry, _, read = LAYOUTS[head_dim]
    cache = random_pages(blocks_for(NUM_TOKENS, block_size), block_size * bytes_per_entry, PAD_BYTES)
    capacity = cache.shape[0] * block_size
    for shape, index_dtype in zip(GATHER_SHAPES, [torch.int64, torch.int32] * 3, strict=True):
        slots = gather_slots_with_invalid(shape, capacity, index_dtype)
        out = ops.dequantize_kv_gather(cache, slots, block_size, head_dim)
        expected = read(cache, slots.long(), block_size).to(torch.bfloat16)
        assert out.shape == (*shape, head_dim) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
        invalid = (slots < 0) | (slots >= capacity)
        assert out[invalid].view(torch.int16).eq(0).all(), "invalid slots must give +0.0 exactly"


def test_dequantize_kv_gather_transposed_slots(isa):
    cache = random_pages(4, 2 * MODEL1_BYTES_PER_TOKEN, PAD_BYTES)
    slots = torch.randint(0, 8, (6, 5)).t()
    out = ops.dequantize_kv_gather(cache, slots, 2, MODEL1_HEAD_DIM)
    torch.testing.assert_close(out, quant.model1_read(cache, slots, 2).bfloat16(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("head_dim", [MODEL1_HEAD_DIM, V32_HEAD_DIM], ids=["model1", "v32"])
def test_insert_gather_round_trip(isa, head_dim):
    """gather(insert(x)) is the reference decode of the reference encode, and within fp8 error of x."""
    bytes_per_entry, write, read = LAYOUTS[head_dim]
    block_size, tile = 61, MODEL1_TILE if head_dim == MODEL1_HEAD_DIM else V32_TILE
    cache = random_pages(blocks_for(NUM_TOKENS, block_size), block_size * bytes_per_entry, PAD_BYTES)
    expected_cache = clone_storage(cache)
    x = wide_range_rows(NUM_TOKENS, head_dim, MODEL1_TILE).bfloat16().float()
    slots = torch.randperm(cache.shape[0] * block_size)[:NUM_TOKENS]
    ops.quantize_kv_insert(x, slots, cache, block_size)
    out = ops.dequantize_kv_gather(cache, slots, block_size, head_dim).float()
    write(expected_cache, slots, block_size, x)
    torch.testing.assert_close(out, quant.round_bf16(read(expected_cache, slots, block_size)), rtol=0, atol=0)
    nope_dim = head_dim - ROPE_DIM
    tiles = x[:, :nope_dim].reshape(NUM_TOKENS, -1, tile)
    scale = torch.ldexp(torch.ones(()), quant.tile_scale_exponent(tiles).float())
    # half an fp8 ULP (normal: 2^-4 relative, subnormal: 2^-10 * scale) plus the bf16 rounding of the output
    bound = tiles.abs() * (2.0**-4 + 2.0**-8) + scale[..., None] * 2.0**-10
    assert ((out[:, :nope_dim].reshape_as(tiles) - tiles).abs() <= bound).all()
    assert torch.equal(out[:, nope_dim:], x[:, nope_dim:])


# ---------------------------------------------------------------------------------------------
# indexer_k_quant_insert
# ---------------------------------------------------------------------------------------------


def run_indexer_k_quant_insert(block_size, dtype, index_dtype, num_tokens=NUM_TOKENS):
    cache = random_pages(blocks_for(num_tokens, block_size), block_size * INDEXER_K_BYTES_PER_ENTRY, PAD_BYTES)
    expected = clone_storage(cache)
    k = column_slice(wide_range_rows(num_tokens, INDEXER_HEAD_DIM, INDEXER_HEAD_DIM).to(dtype))
    slots = distinct_slots(num_tokens, cache.shape[0] * block_size, SKIP_FRACTION).to(index_dtype)
    ops.indexer_k_quant_insert(k, slots, cache, block_size)
    codes, scales = quant.indexer_k_pack(k.float())
    quant.indexer_k_write(expected, slots.long(), block_size, codes, scales)
    assert_same_storage(cache, expected)


@pytest.mark.parametrize("block_size", PAGE_SIZES)
def test_indexer_k_quant_insert_byte_exact(isa, block_size):
    run_indexer_k_quant_insert(block_size, torch.bfloat16, torch.int64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_indexer_k_quant_insert_input_dtypes(isa, dtype):
    run_indexer_k_quant_insert(64, dtype, torch.int32)


def test_indexer_k_quant_insert_empty_batch():
    run_indexer_k_quant_insert(64, torch.bfloat16, torch.int64, num_tokens=0)


# ---------------------------------------------------------------------------------------------
# opcheck and bad inputs
# ---------------------------------------------------------------------------------------------


def test_opcheck(opcheck):
    block_size, num_blocks = 4, 3
    slots = torch.tensor([5, -1, 0])
    all_slots = torch.arange(num_blocks * block_size)
    for head_dim, (bytes_per_entry, _, _) in LAYOUTS.items():
        cache = random_pages(num_blocks, block_size * bytes_per_entry)
        kv = torch.randn(3, head_dim).bfloat16()
        opcheck(torch.ops.dsv4.quantize_kv_insert.default, (kv, slots, cache, block_size))
        # a fully written cache: random bytes could decode to NaN, which opcheck's comparisons reject
        ops.quantize_kv_insert(torch.randn(len(all_slots), head_dim), all_slots, cache, block_size)
        opcheck(torch.ops.dsv4.dequantize_kv_gather.default,
                              (cache, slots.view(3, 1), block_size, head_dim))
    k_cache = random_pages(num_blocks, block_size * INDEXER_K_BYTES_PER_ENTRY)
    opcheck(torch.ops.dsv4.indexer_k_quant_insert.default,
                          (torch.randn(3, INDEXER_HEAD_DIM), slots.int(), k_cache, block_size))


def model1_insert_args(**overrides):
    block_size = overrides.pop("block_size", 4)
    args = {
        "kv": torch.randn(3, MODEL1_HEAD_DIM).bfloat16(),
        "slot_mapping": torch.tensor([0, -1, 7]),
        "kv_cache": random_pages(2, block_size * MODEL1_BYTES_PER_TOKEN),
        "block_size": block_size,
    }
    args.update(overrides)
    return args


QUANTIZE_BAD_INPUTS = {
    "kv dtype": ({"kv": torch.randint(0, 9, (3, MODEL1_HEAD_DIM))}, "'kv'"),
    "kv rank": ({"kv": torch.randn(3, 1, MODEL1_HEAD_DIM)}, "'kv'"),
    "kv head dim": ({"kv": torch.randn(3, 300)}, "'kv'.*300"),
    "kv last dim strided": ({"kv": torch.randn(3, 2 * MODEL1_HEAD_DIM)[:, ::2]}, "'kv'"),
    "slots dtype": ({"slot_mapping": torch.tensor([0.0, 1.0, 2.0])}, "'slot_mapping'"),
    "slots rank": ({"slot_mapping": torch.tensor([[0, 1, 2]])}, "'slot_mapping'"),
    "slots length": ({"slot_mapping": torch.tensor([0, 1])}, "'slot_mapping'"),
    "slot past cache": ({"slot_mapping": torch.tensor([0, 8, 1])}, "'slot_mapping'.* 8"),
    "slot below -1": ({"slot_mapping": torch.tensor([0, -2, 1])}, "'slot_mapping'.*-2"),
    "two tokens, one slot": ({"slot_mapping": torch.tensor([5, -1, 5])},
                             "'slot_mapping' entries 0 and 2 both write slot 5"),
    "cache dtype": ({"kv_cache": torch.zeros(2, 4 * MODEL1_BYTES_PER_TOKEN // 4)}, "'kv_cache'"),
    "cache rank": ({"kv_cache": torch.zeros(4 * MODEL1_BYTES_PER_TOKEN, dtype=torch.uint8)}, "'kv_cache'"),
    "page too small": ({"kv_cache": random_pages(2, 4 * MODEL1_BYTES_PER_TOKEN - 1)}, "'kv_cache'"),
    "cache inner dims strided": (
        {"kv_cache": torch.zeros(2, 4 * MODEL1_BYTES_PER_TOKEN * 2, dtype=torch.uint8)[:, ::2]}, "'kv_cache'"),
    "block_size zero": ({"block_size": 0, "kv_cache": random_pages(2, MODEL1_BYTES_PER_TOKEN)}, "'block_size'"),
}


@pytest.mark.parametrize("case", QUANTIZE_BAD_INPUTS, ids=list(QUANTIZE_BAD_INPUTS))
def test_quantize_kv_insert_rejects(case):
    overrides, pattern = QUANTIZE_BAD_INPUTS[case]
    assert_rejects(ops.quantize_kv_insert, model1_insert_args(**overrides), f"dsv4::quantize_kv_insert.*{pattern}",
                   unchanged=("kv_cache",))


GATHER_BAD_INPUTS = {
    "head_dim": ({"head_dim": 300}, "'head_dim'.*300"),
    "slots dtype": ({"slots": torch.tensor([0.5])}, "'slots'"),
    "cache dtype": ({"kv_cache": torch.zeros(2, 4 * MODEL1_BYTES_PER_TOKEN // 2, dtype=torch.bfloat16)}, "'kv_cache'"),
    "page too small for v32": ({"head_dim": V32_HEAD_DIM}, "'kv_cache'"),
    "block_size negative": ({"block_size": -4}, "'block_size'"),
}


@pytest.mark.parametrize("case", GATHER_BAD_INPUTS, ids=list(GATHER_BAD_INPUTS))
def test_dequantize_kv_gather_rejects(case):
    overrides, pattern = GATHER_BAD_INPUTS[case]
    args = {"kv_cache": random_pages(2, 4 * MODEL1_BYTES_PER_TOKEN), "slots": torch.tensor([0, 3]), "block_size": 4,
            "head_dim": MODEL1_HEAD_DIM}
    args.update(overrides)
    assert_rejects(ops.dequantize_kv_gather, args, f"dsv4::dequantize_kv_gather.*{pattern}")


INDEXER_BAD_INPUTS = {
    "k dtype": ({"k": torch.randint(0, 9, (3, INDEXER_HEAD_DIM), dtype=torch.int32)}, "'k'"),
    "k head dim": ({"k": torch.randn(3, 64)}, "'k'"),
    "k rank": ({"k": torch.randn(3, 1, INDEXER_HEAD_DIM)}, "'k'"),
    "slots length": ({"slot_mapping": torch.tensor([0])}, "'slot_mapping'"),
    "slot past cache": ({"slot_mapping": torch.tensor([0, 1, 8])}, "'slot_mapping'"),
    "two tokens, one slot": ({"slot_mapping": torch.tensor([7, 0, 7])},
                             "'slot_mapping' entries 0 and 2 both write slot 7"),
    "page too small": ({"kv_cache": random_pages(2, 4 * INDEXER_K_BYTES_PER_ENTRY - 4)}, "'kv_cache'"),
}


@pytest.mark.parametrize("case", INDEXER_BAD_INPUTS, ids=list(INDEXER_BAD_INPUTS))
def test_indexer_k_quant_insert_rejects(case):
    overrides, pattern = INDEXER_BAD_INPUTS[case]
    args = {"k": torch.randn(3, INDEXER_HEAD_DIM), "slot_mapping": torch.tensor([0, -1, 7]),
            "kv_cache": random_pages(2, 4 * INDEXER_K_BYTES_PER_ENTRY), "block_size": 4}
    args.update(overrides)
    assert_rejects(ops.indexer_k_quant_insert, args, f"dsv4::indexer_k_quant_insert.*{pattern}",
                   unchanged=("kv_cache",))


def test_huge_block_size_is_rejected():
    """block_size * bytes per entry would wrap around 2^64; the page check must not be fooled into a write."""
    cache = random_pages(1, 584)
    with pytest.raises(RuntimeError, match="fewer than block_size"):
        ops.quantize_kv_insert(torch.randn(1, 512).bfloat16(), torch.tensor([1]), cache, 2**62)
