// Geometry of the paged cache records, for the bindings, the CPU tiers and both CUDA tiers alike (the byte-exact
// spec is python/dsv4/reference/quant.py; python/dsv4/constants.py mirrors these numbers, and a test keeps the two
// equal). Host and device code: plain constexpr ints only.
#pragma once

namespace dsv4 {

// MODEL1 ("fp8_ds_mla", DeepSeek-V4): per entry 448 e4m3 NoPE + 64 bf16 RoPE (the data rows of a page), then per
// entry 7 UE8M0 scale bytes (one per 64-dim tile) + 1 zero pad byte (the scale rows after all the data rows).
constexpr int kModel1HeadDim = 512, kModel1NopeDim = 448, kModel1RopeDim = 64;
constexpr int kModel1Tile = 64, kModel1Tiles = kModel1NopeDim / kModel1Tile;
constexpr int kModel1DataBytes = kModel1NopeDim + 2 * kModel1RopeDim, kModel1ScaleBytes = 8;
constexpr int kModel1BytesPerEntry = kModel1DataBytes + kModel1ScaleBytes;

// V32 (DeepSeek-V3.2 FlashMLA): one 656-byte entry of 512 e4m3 NoPE, 4 fp32 scales (128-dim tiles), 64 bf16 RoPE.
constexpr int kV32HeadDim = 576, kV32NopeDim = 512, kV32RopeDim = 64;
constexpr int kV32Tile = 128, kV32Tiles = kV32NopeDim / kV32Tile;
constexpr int kV32RopeOffset = kV32NopeDim + 4 * kV32Tiles;  // bytes: after the fp32 tile scales
constexpr int kV32BytesPerEntry = kV32RopeOffset + 2 * kV32RopeDim;

// V4.1 fp8 (DeepSeek-V4.1): all 512 dims as e4m3 (the RoPE dims too), then 16 UE8M0 scales, scale j for dims
// 32j .. 32j + 31.
constexpr int kV41HeadDim = 512, kV41Fp8Tile = 32, kV41Fp8Tiles = kV41HeadDim / kV41Fp8Tile;
constexpr int kV41Fp8DataBytes = kV41HeadDim, kV41Fp8ScaleBytes = kV41Fp8Tiles;
constexpr int kV41Fp8BytesPerEntry = kV41Fp8DataBytes + kV41Fp8ScaleBytes;

// V4.1 fp4 (extra cache only, beside a V4.1 fp8 main cache): 256 bytes of e2m1 codes (dim 2i in the low nibble
// of byte i, dim 2i + 1 in the high one), then 32 e4m3 scales, scale j for dims 16j .. 16j + 15.
constexpr int kV41Fp4Tile = 16, kV41Fp4Tiles = kV41HeadDim / kV41Fp4Tile;
constexpr int kV41Fp4DataBytes = kV41HeadDim / 2, kV41Fp4ScaleBytes = kV41Fp4Tiles;
constexpr int kV41Fp4BytesPerEntry = kV41Fp4DataBytes + kV41Fp4ScaleBytes;

// Indexer K: 128 e4m3 per entry (the data rows of a page), then one fp32 scale per entry (the scale rows).
constexpr int kIndexerHeadDim = 128, kIndexerRopeDim = 64, kIndexerNopeDim = kIndexerHeadDim - kIndexerRopeDim;
constexpr int kIndexerScaleBytes = 4, kIndexerBytesPerEntry = kIndexerHeadDim + kIndexerScaleBytes;
// Indexer K, MXFP4 (DeepSeek-V4.1): 64 bytes of e2m1 codes per entry (dim 2i in the low nibble of byte i), then
// 4 UE8M0 scale bytes per entry, scale j for dims 32j .. 32j + 31 (queries use the same rule per head).
constexpr int kMxfp4Block = 32;
constexpr int kIndexerFp4DataBytes = kIndexerHeadDim / 2, kIndexerFp4ScaleBytes = kIndexerHeadDim / kMxfp4Block;
constexpr int kIndexerFp4BytesPerEntry = kIndexerFp4DataBytes + kIndexerFp4ScaleBytes;

// Page alignments engines pad cache pages to (vLLM: 576 with fp8_ds_mla caches, 512 otherwise).
constexpr int kPageAlignments[2] = {512, 576};

static_assert(kModel1BytesPerEntry == 584 && kV32BytesPerEntry == 656 && kIndexerBytesPerEntry == 132 && kIndexerFp4BytesPerEntry == 68 &&
                  kV41Fp8BytesPerEntry == 528 && kV41Fp4BytesPerEntry == 288,
              "record sizes engines allocate for");

}  // namespace dsv4
