// MXFP4 indexer keys and queries (DeepSeek-V4.1) on the portable tier: per 32 dims one UE8M0 exponent and e2m1
// codes, two per byte (even dim in the low nibble). The encoder is the CPU tiers' rule bit for bit
// (csrc/cpu/kernels/indexer/mxfp4.h, spec python/dsv4/reference/quant.py): ties to the lower magnitude, NaN left
// out of its block's amax and stored as code 0, an infinite amax gives exponent 127. Decoding is exact in fp32 and
// in bf16 (every value has at most two significant bits and lies in fp32's range or overflows to inf in both); a
// scale byte of 255 decodes as NaN.
#pragma once
#include "cuda/portable/records.cuh"

namespace dsv4::cuda {

constexpr float kMxfp4AmaxFloor = 6.0f * 0x1p-126f;  // exponents stay >= -126
constexpr float kMxfp4Max = 6.0f;

// e2m1 code of y: nearest magnitude with ties to the lower one, saturating at 6; NaN -> 0; no sign on magnitude 0.
DSV4_DEVICE uint32_t mxfp4_code(float y) {
  const float a = fabsf(y);
  const uint32_t m = uint32_t(a > 0.25f) + uint32_t(a > 0.75f) + uint32_t(a > 1.25f) + uint32_t(a > 1.75f) +
                     uint32_t(a > 2.5f) + uint32_t(a > 3.5f) + uint32_t(a > 5.0f);
  return m != 0u && signbit(y) ? m | kE2m1SignBit : m;
}

// Scale exponent of a block of amax `amax` (NaN left out; NaN itself: a block of NaN only):
// ceil(log2(max(amax, 6 * 2^-126) / 6)), 127 for an infinite amax.
DSV4_DEVICE int mxfp4_exponent(float amax) {
  amax = fmaxf(amax, kMxfp4AmaxFloor);  // fmaxf drops NaN
  return isinf(amax) ? 127 : min(127, ceil_log2(amax / kMxfp4Max));
}

// 128 lane-strided values -> 64 code bytes and 4 UE8M0 bytes, one per 32 dims. Called by a whole warp.
DSV4_DEVICE void mxfp4_store_lanes(uint8_t* codes, uint8_t* scales, const float (&x)[lane_steps<kIndexerHeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < lane_steps<kIndexerHeadDim>(); ++j) {
    const int e = mxfp4_exponent(group_max<kMxfp4Block>(fabsf(x[j])));  // a block: 32 neighbouring lanes
    const uint32_t code = mxfp4_code(ldexpf(x[j], -e));  // ldexpf scales exactly, subnormal results included
    const uint32_t odd = warp_down(code, 1);  // dim + 1's code, in the next lane
    const int dim = j * kWarpSize + lane;
    if ((lane & 1) == 0) codes[dim / 2] = uint8_t(code | odd << 4);
    if (dim % kMxfp4Block == 0) scales[dim / kMxfp4Block] = uint8_t(e + 127);
  }
}

// Value of e2m1 code under UE8M0 byte scale (exact: an e2m1 value times a power of two; NaN for byte 255).
DSV4_DEVICE float mxfp4_value(uint32_t code, uint8_t scale) { return e2m1_to_f32(code) * ue8m0_value(scale); }

// Four mxfp4 dims of one block (two code bytes, first in the low byte) as four bf16 values, dims 0, 1 in .x (low
// half first), 2, 3 in .y: the fp32 values' high halves, exact (their low 16 bits are zero).
DSV4_DEVICE uint2 mxfp4x4_to_bf16x4(uint32_t pairs, uint8_t scale) {
  const float s = ue8m0_value(scale);
  uint32_t h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __float_as_uint(e2m1_to_f32((pairs >> (4 * i)) & 0xfu) * s) >> 16;
  return make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
}

// ---- the indexer K cache in either key format ----
// Where one key's bytes are: its data (128 e4m3 or 64 e2m1-pair bytes) and its 4 scale bytes (one fp32, or one
// UE8M0 byte per 32 dims); data is nullptr for a slot outside the cache.
struct IndexerKeyBytes {
  uint8_t* data;
  uint8_t* scales;
};

DSV4_DEVICE int64_t indexer_key_data_bytes(IndexerFormat format) {
  return format == IndexerFormat::mxfp4 ? kIndexerFp4DataBytes : kIndexerHeadDim;
}

DSV4_DEVICE IndexerKeyBytes indexer_key_entry(IndexerFormat format, const PagedCache& cache, int64_t slot) {
  const int64_t data_bytes = indexer_key_data_bytes(format);
  static_assert(kIndexerScaleBytes == kIndexerFp4ScaleBytes, "both formats keep 4 scale bytes per entry");
  return {slot_entry(cache, slot, 0, data_bytes),
          slot_entry(cache, slot, cache.block_size * data_bytes, kIndexerScaleBytes)};
}

// One key of 128 bf16-rounded lane-strided values into its entry, in the cache's key format.
DSV4_DEVICE void indexer_key_store_lanes(IndexerFormat format, const IndexerKeyBytes& e,
                                         const float (&x)[lane_steps<kIndexerHeadDim>()]) {
  if (format == IndexerFormat::mxfp4)
    mxfp4_store_lanes(e.data, e.scales, x);
  else
    indexer_k_store_lanes(e.data, e.scales, x);
}

}  // namespace dsv4::cuda
