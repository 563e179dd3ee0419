// Device helpers of the portable CUDA tier: raw-bit bf16 / f16 / e4m3 conversions (no cuda_bf16.h or cuda_fp8.h,
// so the tier hipifies and builds with old HIP), index reads, warp reductions with the warp size from one
// constant. Rounding matches the CPU tiers bit for bit (csrc/cpu/kernels/numerics.h); the tier is compiled with
// --fmad=false, so products and sums round where the source says (use fmaf where a fused product is wanted).
#pragma once
#include <cstdint>

#if defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif

#include "common/indices.h"
#include "common/params.h"

#define DSV4_DEVICE __device__ __forceinline__

namespace dsv4::cuda {

#if defined(__HIP_PLATFORM_AMD__)
constexpr int kWarpSize = 64;
#else
constexpr int kWarpSize = 32;
#endif

constexpr uint16_t kBf16QuietNan = 0x7fc0;
constexpr uint32_t kF32QuietNanBits = 0x7fc00000u;
constexpr float kFp8Max = 448.0f;
constexpr float kScaleFloor = 1e-4f;  // MODEL1/V32 tiles: floor of amax / 448
constexpr float kIndexerAmaxFloor = 1e-4f;  // indexer K/Q: floor of amax
constexpr float kFp8MinNormal = 0.015625f;  // 2^-6

// ---- warp reductions (HIP before 6.x has no *_sync shuffles) ----
template <typename T>
DSV4_DEVICE T warp_xor(T v, int lane_mask) {
#if defined(__HIP_PLATFORM_AMD__)
  return __shfl_xor(v, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#endif
}
template <typename T>
DSV4_DEVICE T warp_down(T v, int delta) {  // lane + delta's value (the lane's own past the warp's end)
#if defined(__HIP_PLATFORM_AMD__)
  return __shfl_down(v, delta);
#else
  return __shfl_down_sync(0xffffffffu, v, delta);
#endif
}
DSV4_DEVICE uint64_t warp_ballot(bool predicate) {  // bit l: lane l's predicate
#if defined(__HIP_PLATFORM_AMD__)
  return __ballot(predicate);
#else
  return __ballot_sync(0xffffffffu, predicate);
#endif
}
template <typename T>
DSV4_DEVICE T warp_broadcast(T v, int lane) {
#if defined(__HIP_PLATFORM_AMD__)
  return __shfl(v, lane);
#else
  return __shfl_sync(0xffffffffu, v, lane);
#endif
}
DSV4_DEVICE float warp_sum(float v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += warp_xor(v, m);
  return v;
}
DSV4_DEVICE float warp_max(float v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v = fmaxf(v, warp_xor(v, m));
  return v;
}

// ---- indices (index_at, load_index: common/indices.h) ----
// Slot -> address of its entry in a paged cache region, or nullptr when the slot is outside the cache.
DSV4_DEVICE uint8_t* slot_entry(const PagedCache& c, int64_t slot, int64_t region_offset, int64_t entry_bytes) {
  if (slot < 0 || slot >= c.num_blocks * c.block_size) return nullptr;
  const int64_t block = slot / c.block_size, offset = slot - block * c.block_size;
  return c.base + block * c.block_stride + region_offset + offset * entry_bytes;
}

// ---- 16-bit floats ----
DSV4_DEVICE float bf16_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
DSV4_DEVICE uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
DSV4_DEVICE float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
DSV4_DEVICE float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) return __uint_as_float(sign) + (sign ? -1.0f : 1.0f) * ldexpf(float(man), -24);
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}
DSV4_DEVICE uint16_t f32_to_f16(float f) {  // round to nearest even
  const uint32_t u = __float_as_uint(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = fabsf(f);
  if (isnan(f)) return uint16_t(sign | 0x7e00u);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00u);
  if (a < 6.103515625e-05f) return uint16_t(sign | uint16_t(rintf(a * 16777216.0f)));
  uint32_t b = __float_as_uint(a);
  b += 0xfffu + ((b >> 13) & 1u);
  return uint16_t(sign | uint16_t((b >> 13) - (112u << 10)));
}
// Element i of a bf16 / f16 / f32 array as fp32, and the store back.
DSV4_DEVICE float load_f32(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
DSV4_DEVICE void store_f32(void* p, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// ---- fp8 e4m3fn and power-of-two scales ----
// Exact ceil(log2(x)) for finite x > 0.
DSV4_DEVICE int ceil_log2(float x) {
  int e;
  const float m = frexpf(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return m == 0.5f ? e - 1 : e;
}
// Scale exponent of a MODEL1/V32 tile: ceil(log2(max(amax / 448, 1e-4))).
DSV4_DEVICE int tile_exponent(float amax) {
  const float q = amax / kFp8Max;
  return ceil_log2(q > kScaleFloor ? q : kScaleFloor);
}
// Scale exponent of an indexer K/Q vector: ceil(log2(max(amax, 1e-4) / 448)).
DSV4_DEVICE int indexer_exponent(float amax) {
  return ceil_log2((amax > kIndexerAmaxFloor ? amax : kIndexerAmaxFloor) / kFp8Max);
}
// fp32 -> e4m3fn, round to nearest even, saturating at +-448, subnormals kept.
DSV4_DEVICE uint8_t f32_to_e4m3(float x) {
  const uint32_t sign = (__float_as_uint(x) >> 24) & 0x80u;
  float a = fabsf(x);
  a = a < kFp8Max ? a : kFp8Max;
  uint32_t code;
  if (a < kFp8MinNormal) {
    code = uint32_t(rintf(a * 512.0f));  // multiples of 2^-9; 8 is the smallest normal
  } else {
    uint32_t b = __float_as_uint(a);
    b += 0x7ffffu + ((b >> 20) & 1u);
    code = (b >> 20) - (120u << 3);
  }
  return uint8_t(sign | code);
}
DSV4_DEVICE float e4m3_to_f32(uint8_t c) {
  const uint32_t exp = (c >> 3) & 0xfu, man = c & 7u;
  float v;
  if (exp == 0) v = ldexpf(float(man), -9);
  else if (exp == 15 && man == 7) v = __uint_as_float(kF32QuietNanBits);
  else v = __uint_as_float(((exp + 120u) << 23) | (man << 20));
  return (c & 0x80u) ? -v : v;
}

// ---- fp4 e2m1 (V4.1 fp4 records) ----
constexpr uint32_t kE2m1SignBit = 8u, kE2m1MagnitudeBits = 7u;
// +-{0, 0.5, 1, 1.5, 2, 3, 4, 6} of an e2m1 code (code 8 is -0).
DSV4_DEVICE float e2m1_to_f32(uint32_t code) {
  const uint32_t m = code & kE2m1MagnitudeBits;  // from 2 on: (1 + (m & 1) / 2) * 2^((m >> 1) - 1)
  const uint32_t bits = m < 2u ? (m == 1u ? 0x3f000000u : 0u) : ((m >> 1) + 126u) << 23 | (m & 1u) << 22;
  return __uint_as_float(bits | (code & kE2m1SignBit) << 28);
}

// 2^e as fp32 for e in [-126, 127].
DSV4_DEVICE float exp2_int(int e) { return __uint_as_float(uint32_t(e + 127) << 23); }

// GPT-J (interleaved) rotation of the pair (x[2i], x[2i+1]) at table row pos; sign -1 inverts it.
DSV4_DEVICE void rope_pair(float& even, float& odd, const RopeTable& rope, int64_t pos, int64_t i, float sign) {
  const float* cos_row = rope.data + pos * rope.row_stride;
  const float c = cos_row[i], s = sign * cos_row[rope.rope_dim / 2 + i];
  const float e = even, o = odd;
  even = e * c - o * s;
  odd = e * s + o * c;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace dsv4::cuda
