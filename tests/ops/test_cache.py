"""Page arithmetic, allocation and the block allocator of dsv4.cache."""

import re
from pathlib import Path

import pytest
import torch

from dsv4 import cache, constants, ops

# (what, page bytes) from the DSv4 layout table: logical block 256, fp8_ds_mla.
EXPECTED_PAGES = [
    ("swa model1 bs64", lambda: cache.kv_page_bytes(64), 37440),
    ("c128a model1 bs2", lambda: cache.kv_page_bytes(2), 1728),
    ("indexer k bs64", lambda: cache.indexer_k_page_bytes(64), 8640),
    ("state c4a main", lambda: cache.compressor_state_page_bytes(4, 512, 4), 32832),
    ("state c128a main", lambda: cache.compressor_state_page_bytes(8, 512, 128), 32832),
    ("state c4a indexer", lambda: cache.compressor_state_page_bytes(4, 128, 4), 8640),
    ("v32 bs64", lambda: cache.kv_page_bytes(64, "v32"), 42048),
]


@pytest.mark.parametrize("what,compute,expected", EXPECTED_PAGES, ids=[e[0] for e in EXPECTED_PAGES])
def test_page_bytes(what, compute, expected):
    assert compute() == expected
    assert expected % 576 == 0


def test_bad_geometry_raises():
    with pytest.raises(ValueError, match="unknown KV layout"):
        cache.kv_page_bytes(64, "fp16")
    with pytest.raises(ValueError, match=re.escape("block_size (tokens per page) must be an int >= 1, got 0")):
        cache.kv_page_bytes(0)


def test_compressor_state_is_padded_view():
    state = cache.allocate_compressor_state(3, 4, 512, 4)
    assert state.shape == (3, 4, 2048)
    assert state.stride() == (32832 // 4, 2048, 1)


@pytest.mark.parametrize("layout,dim", [("model1", 512), ("v32", 576)])
def test_quantize_roundtrip_matches_kernel(layout, dim):
    kv = (torch.randn(9, dim) * 3).bfloat16()
    entries = cache.quantize_kv(kv, layout)
    assert entries.shape == (9, cache.KV_LAYOUTS[layout])
    back = cache.dequantize_kv(entries, layout)
    rel = (back - kv.float()).abs().max() / kv.float().abs().max()
    assert rel < 0.07  # e4m3 has a 3-bit mantissa: relative step 1/16 at worst
    kv_cache = cache.allocate_kv_cache(2, 8, layout)
    slots = torch.arange(9) + 3
    ops.quantize_kv_insert(kv, slots, kv_cache, 8)
    gathered = ops.dequantize_kv_gather(kv_cache, slots, 8, dim)
    assert torch.equal(gathered, back.bfloat16())


def test_block_allocator_tables_and_slots():
    alloc = cache.BlockAllocator(num_blocks=4, block_size=2)
    alloc.ensure_capacity(7, 3)
    alloc.ensure_capacity(9, 2)
    table = alloc.block_table([7, 9, 11])
    assert table.tolist() == [[0, 1], [2, -1], [-1, -1]]
    slots = alloc.slot_mapping(7, torch.tensor([0, 1, 2, 3, 4, -1]))
    assert slots.tolist() == [0, 1, 2, 3, -1, -1]
    alloc.free(7)
    assert alloc.num_free_blocks == 3
    with pytest.raises(RuntimeError, match="out of cache blocks"):
        alloc.ensure_capacity(5, 100)


# ---- the one C++ home of the record geometry (csrc/common/cache_layouts.h) agrees with dsv4.constants ----

LAYOUT_HEADER = Path(__file__).resolve().parents[2] / "csrc" / "common" / "cache_layouts.h"
C = constants
PYTHON_LAYOUTS = {  # every constant of the header, as dsv4.constants spells it
    "kModel1HeadDim": C.MODEL1_HEAD_DIM, "kModel1NopeDim": C.MODEL1_NOPE_DIM, "kModel1RopeDim": C.MODEL1_ROPE_DIM,
    "kModel1Tile": C.MODEL1_TILE, "kModel1Tiles": C.MODEL1_NOPE_DIM // C.MODEL1_TILE,
    "kModel1DataBytes": C.MODEL1_DATA_BYTES, "kModel1ScaleBytes": C.MODEL1_SCALE_BYTES,
    "kModel1BytesPerEntry": C.MODEL1_BYTES_PER_TOKEN,
    "kV32HeadDim": C.V32_HEAD_DIM, "kV32NopeDim": C.V32_NOPE_DIM, "kV32RopeDim": C.V32_ROPE_DIM,
    "kV32Tile": C.V32_TILE, "kV32Tiles": C.V32_NOPE_DIM // C.V32_TILE,
    "kV32RopeOffset": C.V32_BYTES_PER_TOKEN - 2 * C.V32_ROPE_DIM, "kV32BytesPerEntry": C.V32_BYTES_PER_TOKEN,
    "kV41HeadDim": C.V41_HEAD_DIM, "kV41Fp8Tile": C.V41_FP8_TILE, "kV41Fp8Tiles": C.V41_HEAD_DIM // C.V41_FP8_TILE,
    "kV41Fp8DataBytes": C.V41_FP8_DATA_BYTES, "kV41Fp8ScaleBytes": C.V41_FP8_SCALE_BYTES,
    "kV41Fp8BytesPerEntry": C.V41_FP8_BYTES_PER_TOKEN,
    "kV41Fp4Tile": C.V41_FP4_TILE, "kV41Fp4Tiles": C.V41_HEAD_DIM // C.V41_FP4_TILE,
    "kV41Fp4DataBytes": C.V41_FP4_DATA_BYTES, "kV41Fp4ScaleBytes": C.V41_FP4_SCALE_BYTES,
    "kV41Fp4BytesPerEntry": C.V41_FP4_BYTES_PER_TOKEN,
    "kIndexerHeadDim": C.INDEXER_HEAD_DIM, "kIndexerRopeDim": C.INDEXER_ROPE_DIM,
    "kIndexerNopeDim": C.INDEXER_HEAD_DIM - C.INDEXER_ROPE_DIM,
    "kIndexerScaleBytes": C.INDEXER_K_BYTES_PER_ENTRY - C.INDEXER_HEAD_DIM,
    "kIndexerBytesPerEntry": C.INDEXER_K_BYTES_PER_ENTRY,
    "kMxfp4Block": C.INDEXER_MXFP4_BLOCK, "kIndexerFp4DataBytes": C.INDEXER_K_FP4_DATA_BYTES,
    "kIndexerFp4ScaleBytes": C.INDEXER_K_FP4_SCALE_BYTES, "kIndexerFp4BytesPerEntry": C.INDEXER_K_FP4_BYTES_PER_ENTRY,
}


def header_constants() -> dict[str, int]:
    """name -> value of every `constexpr int` scalar in the header, evaluated in order (C++ integer division)."""
    values: dict[str, int] = {}
    for declaration in re.findall(r"constexpr int (k\w+ = [^;\[]+);", LAYOUT_HEADER.read_text()):
        for name, expr in re.findall(r"(k\w+) = ([^,]+)", declaration):
            values[name] = eval(expr.replace("/", "//"), {}, dict(values))  # noqa: S307 (the project's own header)
    return values


def test_layout_header_agrees_with_constants():
    assert header_constants() == PYTHON_LAYOUTS


def test_page_alignments_agree_and_include_the_one_dsv4_allocates_with():
    alignments = re.search(r"kPageAlignments\[2\] = \{(\d+), (\d+)\}", LAYOUT_HEADER.read_text())
    assert (int(alignments.group(1)), int(alignments.group(2))) == C.PAGE_ALIGNMENTS
    assert C.CACHE_ALIGNMENT in C.PAGE_ALIGNMENTS


@pytest.mark.parametrize(("allocate", "message"), [
    (lambda: cache.allocate_kv_cache(-1, 64), "num_blocks must be an int >= 0, got -1"),
    (lambda: cache.allocate_kv_cache(4, 0), "block_size (tokens per page) must be an int >= 1, got 0"),
    (lambda: cache.allocate_indexer_k_cache(4, -64), "block_size (tokens per page) must be an int >= 1, got -64"),
    (lambda: cache.allocate_compressor_state(2.0, 4, 512, 4), "num_blocks must be an int >= 0, got 2.0"),
    (lambda: cache.kv_page_bytes(0), "block_size (tokens per page) must be an int >= 1, got 0"),
])
def test_allocation_names_the_bad_argument(allocate, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        allocate()


def test_zero_blocks_allocate_an_empty_cache():
    assert cache.allocate_kv_cache(0, 64).shape == (0, cache.kv_page_bytes(64))
