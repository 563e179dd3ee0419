// Byte layouts of the paged caches for warp-per-row kernels (spec: python/dsv4/reference/quant.py; the same bytes
// as csrc/cpu/kernels/records.h). Rows are lane-strided registers (warp_rows.cuh); every function is called
// by a whole warp. Cache bytes are written and read one byte at a time: pages may start at any byte.
//   MODEL1 (584 B): data at 576 * i (448 e4m3 NoPE, 64 bf16 RoPE), scales at 576 * block_size + 8 * i
//                   (7 UE8M0 bytes, one per 64-dim tile, then a zero pad byte).
//   V32 (656 B):    512 e4m3, 4 fp32 scales (128-dim tiles), 64 bf16 RoPE, in one entry.
//   Indexer K:      128 e4m3 at 128 * i, one fp32 scale at 128 * block_size + 4 * i.
#pragma once
#include "common/cache_layouts.h"
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
