// Byte layouts of the paged caches for warp-per-row kernels (spec: python/dsv4/reference/quant.py; the same bytes
// as csrc/cpu/kernels/records.h). Rows are lane-strided registers (warp_rows.cuh); every function is called
// by a whole warp. Cache bytes are written and read one byte at a time: pages may start at any byte.
//   MODEL1 (584 B): data at 576 * i (448 e4m3 NoPE, 64 bf16 RoPE), scales at 576 * block_size + 8 * i
//                   (7 UE8M0 bytes, one per 64-dim tile, then a zero pad byte).
//   V32 (656 B):    512 e4m3, 4 fp32 scales (128-dim tiles), 64 bf16 RoPE, in one entry.
//   V4.1 fp8 (528 B): 512 e4m3, then 16 UE8M0 scales (32-dim tiles); V4.1 fp4 (288 B): 256 bytes of e2m1 pairs,
//                   then 32 e4m3 scales (16-dim tiles); page-split or per-token (common/records.h).
//   Indexer K:      128 e4m3 at 128 * i, one fp32 scale at 128 * block_size + 4 * i.
// Where an attention record's bytes are: common/records.h (slot_entry); the store and load functions take its
// EntryBytes.
#pragma once
#include "common/cache_layouts.h"
#include "common/records.h"
#include "cuda/portable/warp_rows.cuh"

namespace dsv4::cuda {

// ---- little-endian byte access ----
DSV4_DEVICE void store_u16_bytes(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v), p[1] = uint8_t(v >> 8);
}
DSV4_DEVICE void store_u32_bytes(uint8_t* p, uint32_t v) {
  for (int b = 0; b < 4; ++b) p[b] = uint8_t(v >> (8 * b));
}
DSV4_DEVICE uint16_t load_u16_bytes(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
DSV4_DEVICE uint32_t load_u32_bytes(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// ---- scales ----
// UE8M0 byte of a tile exponent, clamped like the CPU store.
DSV4_DEVICE uint8_t ue8m0_byte(int e) {
  const int b = e + 127;
  return uint8_t(b < 0 ? 0 : (b > 255 ? 255 : b));
}
// 2^(b - 127) (b = 0 is the subnormal 2^-127), NaN for 255.
DSV4_DEVICE float ue8m0_value(uint8_t b) {
  return b == 255 ? __uint_as_float(kF32QuietNanBits) : ldexpf(1.0f, int(b) - 127);
}

// Quantizes tile t (elements [t * kTile, (t + 1) * kTile), already bf16-rounded) to e4m3 codes[element] with a
// power-of-two scale; returns the scale exponent (the same in every lane).
template <int kTile, int J>
DSV4_DEVICE int quantize_tile_lanes(const float (&x)[J], int t, uint8_t* codes) {
  constexpr int kSteps = kTile / kWarpSize;
  const int lane = lane_id();
  const int e = tile_exponent(warp_abs_max(x, t * kSteps, kSteps));
  const float mult = exp2_int(-e);
#pragma unroll
  for (int j = 0; j < J; ++j)
    if (j >= t * kSteps && j < (t + 1) * kSteps) codes[j * kWarpSize + lane] = f32_to_e4m3(x[j] * mult);
  return e;
}

// bf16 bytes of elements [kFirst, J * kWarpSize) at dst + 2 * (element - kFirst).
template <int kFirst, int J>
DSV4_DEVICE void store_bf16_lanes(uint8_t* dst, const float (&x)[J]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = kFirst / kWarpSize; j < J; ++j)
    store_u16_bytes(dst + 2 * (j * kWarpSize + lane - kFirst), f32_to_bf16(x[j]));
}

// ---- MODEL1 ----
// Entry from 448 bf16-rounded NoPE values and 64 RoPE values (rounded to bf16 here).
DSV4_DEVICE void model1_store_lanes(uint8_t* data, uint8_t* scales, const float (&x)[lane_steps<kModel1HeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int t = 0; t < kModel1Tiles; ++t) {
    const int e = quantize_tile_lanes<kModel1Tile>(x, t, data);
    if (lane == t) scales[t] = ue8m0_byte(e);
  }
  if (lane == kModel1Tiles) scales[kModel1Tiles] = 0;
  store_bf16_lanes<kModel1NopeDim>(data + kModel1NopeDim, x);
}

// Entry -> 512 floats.
DSV4_DEVICE void model1_load_lanes(const uint8_t* data, const uint8_t* scales, float (&x)[lane_steps<kModel1HeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < lane_steps<kModel1HeadDim>(); ++j) {
    const int i = j * kWarpSize + lane;
    x[j] = i < kModel1NopeDim ? e4m3_to_f32(data[i]) * ue8m0_value(scales[i / kModel1Tile])
                              : bf16_to_f32(load_u16_bytes(data + kModel1NopeDim + 2 * (i - kModel1NopeDim)));
  }
}

// ---- V32 ----
// Entry from 576 bf16-rounded values (512 NoPE, 64 RoPE).
DSV4_DEVICE void v32_store_lanes(uint8_t* entry, const float (&x)[lane_steps<kV32HeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int t = 0; t < kV32Tiles; ++t) {
    const int e = quantize_tile_lanes<kV32Tile>(x, t, entry);
    if (lane == t) store_u32_bytes(entry + kV32NopeDim + 4 * t, __float_as_uint(exp2_int(e)));
  }
  store_bf16_lanes<kV32NopeDim>(entry + kV32RopeOffset, x);
}

DSV4_DEVICE void v32_load_lanes(const uint8_t* entry, float (&x)[lane_steps<kV32HeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < lane_steps<kV32HeadDim>(); ++j) {
    const int i = j * kWarpSize + lane;
    x[j] = i < kV32NopeDim
               ? e4m3_to_f32(entry[i]) * __uint_as_float(load_u32_bytes(entry + kV32NopeDim + 4 * (i / kV32Tile)))
               : bf16_to_f32(load_u16_bytes(entry + kV32RopeOffset + 2 * (i - kV32NopeDim)));
  }
}

// ---- V4.1 ----
// Max of v over each group of kGroup neighbouring lanes (kGroup a power of two, at most the warp), NaN ignored.
template <int kGroup>
DSV4_DEVICE float group_max(float v) {
  static_assert(kGroup <= kWarpSize && (kGroup & (kGroup - 1)) == 0, "groups of whole lanes within a warp");
#pragma unroll
  for (int m = kGroup / 2; m > 0; m >>= 1) v = fmaxf(v, warp_xor(v, m));
  return v;
}

// Whether the predicate holds in some lane of this lane's group of kGroup neighbouring lanes.
template <int kGroup>
DSV4_DEVICE bool group_any(bool predicate) {
  const uint64_t ballot = warp_ballot(predicate);
  const int first = lane_id() & ~(kGroup - 1);
  return ((ballot >> first) & ((uint64_t(1) << kGroup) - 1)) != 0;
}

// Entry from 512 bf16-rounded values: 16 tiles of 32, each e4m3 codes and a UE8M0 scale (MODEL1's tile rule).
DSV4_DEVICE void v41_fp8_store_lanes(const EntryBytes& e, const float (&x)[lane_steps<kV41HeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < lane_steps<kV41HeadDim>(); ++j) {
    const int i = j * kWarpSize + lane;
    const float a = fabsf(x[j]);
    const int exponent = tile_exponent(group_max<kV41Fp8Tile>(a > 0.0f ? a : 0.0f));
    e.data[i] = f32_to_e4m3(x[j] * exp2_int(-exponent));
    if (i % kV41Fp8Tile == 0) e.scales[i / kV41Fp8Tile] = ue8m0_byte(exponent);
  }
}

DSV4_DEVICE void v41_fp8_load_lanes(const EntryBytes& e, float (&x)[lane_steps<kV41HeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < lane_steps<kV41HeadDim>(); ++j) {
    const int i = j * kWarpSize + lane;
    x[j] = e4m3_to_f32(e.data[i]) * ue8m0_value(e.scales[i / kV41Fp8Tile]);
  }
}

constexpr float kE2m1Max = 6.0f, kFp4ScaleMin = 0x1p-9f;  // the scale's floor: the smallest e4m3 magnitude
constexpr uint8_t kE4m3NanByte = 0x7f;

// e2m1 code of y: nearest with ties to the even code, saturating at +-6; NaN -> 0; the sign bit is kept.
DSV4_DEVICE uint32_t f32_to_e2m1(float y) {
  if (isnan(y)) return 0u;
  const float a = fabsf(y);
  const uint32_t magnitude = uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) +
                             uint32_t(a >= 1.75f) + uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a > 5.0f);
  return ((__float_as_uint(y) >> 31) ? kE2m1SignBit : 0u) | magnitude;
}

// Entry from 512 bf16-rounded values: 32 tiles of 16, each e2m1 codes of x / scale and an e4m3 scale
// (e4m3(max(amax / 6, 2^-9)), saturating; NaN for a tile holding NaN or inf).
DSV4_DEVICE void v41_fp4_store_lanes(const EntryBytes& e, const float (&x)[lane_steps<kV41HeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < lane_steps<kV41HeadDim>(); ++j) {
    const int i = j * kWarpSize + lane;
    const float a = fabsf(x[j]);
    const bool finite = isfinite(a);
    const float amax = group_max<kV41Fp4Tile>(finite ? a : 0.0f);
    const float s = __fdiv_rn(amax, kE2m1Max);
    const uint8_t scale_byte =
        group_any<kV41Fp4Tile>(!finite) ? kE4m3NanByte : f32_to_e4m3(s < kFp4ScaleMin ? kFp4ScaleMin : s);
    const uint32_t code = f32_to_e2m1(__fdiv_rn(x[j], e4m3_to_f32(scale_byte)));
    const uint32_t odd = warp_xor(code, 1);  // dim i + 1's code, in the next lane
    if ((lane & 1) == 0) e.data[i / 2] = uint8_t(code | odd << 4);
    if (i % kV41Fp4Tile == 0) e.scales[i / kV41Fp4Tile] = scale_byte;
  }
}

DSV4_DEVICE void v41_fp4_load_lanes(const EntryBytes& e, float (&x)[lane_steps<kV41HeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < lane_steps<kV41HeadDim>(); ++j) {
    const int i = j * kWarpSize + lane;
    const uint32_t pair = e.data[i / 2];
    x[j] = e2m1_to_f32((lane & 1) ? pair >> 4 : pair & 0xfu) * e4m3_to_f32(e.scales[i / kV41Fp4Tile]);
  }
}

// A 512-dim record (MODEL1, V4.1 fp8 or fp4) from bf16-rounded values (MODEL1: RoPE dims as given, rounded here).
DSV4_DEVICE void record512_store_lanes(KvLayout layout, const EntryBytes& e,
                                       const float (&x)[lane_steps<kV41HeadDim>()]) {
  switch (layout) {
    case KvLayout::v41_fp8: v41_fp8_store_lanes(e, x); break;
    case KvLayout::v41_fp4: v41_fp4_store_lanes(e, x); break;
    default: model1_store_lanes(e.data, e.scales, x);
  }
}

// ---- indexer (K cache entries and fp8 q) ----
// 128 values -> e4m3 codes with one power-of-two scale 2^e; returns e.
DSV4_DEVICE int indexer_quantize_lanes(const float (&x)[lane_steps<kIndexerHeadDim>()], uint8_t* codes) {
  constexpr int kSteps = lane_steps<kIndexerHeadDim>();
  const int lane = lane_id();
  const int e = indexer_exponent(warp_abs_max(x, 0, kSteps));
  const float mult = exp2_int(-e);
#pragma unroll
  for (int j = 0; j < kSteps; ++j) codes[j * kWarpSize + lane] = f32_to_e4m3(x[j] * mult);
  return e;
}

// K cache entry from 128 bf16-rounded values: codes, then the fp32 scale.
DSV4_DEVICE void indexer_k_store_lanes(uint8_t* codes, uint8_t* scale, const float (&x)[lane_steps<kIndexerHeadDim>()]) {
  const int e = indexer_quantize_lanes(x, codes);
  if (lane_id() == 0) store_u32_bytes(scale, __float_as_uint(exp2_int(e)));
}

}  // namespace dsv4::cuda
