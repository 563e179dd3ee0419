// Stores and loads of the paged cache records (geometry: common/cache_layouts.h; spec: python/dsv4/reference/quant.py).
#pragma once
#include "common/records.h"
#include "cpu/kernels/numerics.h"

namespace dsv4::cpu::DSV4_ISA {

// Page and offset of a slot, or nullptr when the slot is -1 or outside the cache.
inline uint8_t* slot_page(const PagedCache& c, int64_t slot, int64_t* offset) {
  if (slot < 0 || slot >= c.num_blocks * c.block_size) return nullptr;
  *offset = slot % c.block_size;
  return c.base + (slot / c.block_size) * c.block_stride;
}

// Quantizes one tile of already bf16-rounded values; returns the power-of-two exponent.
inline int quantize_tile(const float* x, int64_t n, uint8_t* codes) {
  const int e = tile_exponent(abs_max(x, n));
  encode_e4m3_scaled(x, std::ldexp(1.0f, -e), n, codes);
  return e;
}

// UE8M0 scale byte of a power-of-two exponent (clamped to the byte's range).
inline uint8_t ue8m0_byte(int exponent) {
  const int byte = exponent + 127;
  return uint8_t(byte < 0 ? 0 : (byte > 255 ? 255 : byte));
}

// 2^(b - 127) of a UE8M0 byte; 255 is NaN.
inline float ue8m0_value(uint8_t b) { return b == 255 ? NAN : std::ldexp(1.0f, int(b) - 127); }

// MODEL1 entry from 448 bf16-rounded NoPE values and 64 RoPE values (rounded to bf16 here).
inline void model1_store(const EntryBytes& e, const float* nope, const float* rope) {
  uint8_t *data = e.data, *scales = e.scales;
  for (int64_t t = 0; t < kModel1Tiles; ++t) {
    scales[t] = ue8m0_byte(quantize_tile(nope + t * kModel1Tile, kModel1Tile, data + t * kModel1Tile));
  }
  scales[kModel1Tiles] = 0;
  uint16_t rope_bf16[kModel1RopeDim];
  for (int64_t i = 0; i < kModel1RopeDim; ++i) rope_bf16[i] = f32_to_bf16(rope[i]);
  std::memcpy(data + kModel1NopeDim, rope_bf16, sizeof(rope_bf16));
}

// MODEL1 entry -> 512 floats (scale byte b means 2^(b-127); 255 is NaN).
inline void model1_load(const EntryBytes& e, float* out) {
  const uint8_t *data = e.data, *scales = e.scales;
  for (int64_t t = 0; t < kModel1Tiles; ++t) {
    const float mult = ue8m0_value(scales[t]);
    for (int64_t i = 0; i < kModel1Tile; ++i) out[t * kModel1Tile + i] = e4m3_to_f32(data[t * kModel1Tile + i]) * mult;
  }
  uint16_t rope_bf16[kModel1RopeDim];
  std::memcpy(rope_bf16, data + kModel1NopeDim, sizeof(rope_bf16));
  for (int64_t i = 0; i < kModel1RopeDim; ++i) out[kModel1NopeDim + i] = bf16_to_f32(rope_bf16[i]);
}

// V32 entry from 576 bf16-rounded values (512 NoPE, 64 RoPE).
inline void v32_store(uint8_t* entry, const float* x) {
  float scales[kV32Tiles];
  for (int64_t t = 0; t < kV32Tiles; ++t)
    scales[t] = std::ldexp(1.0f, quantize_tile(x + t * kV32Tile, kV32Tile, entry + t * kV32Tile));
  std::memcpy(entry + kV32NopeDim, scales, sizeof(scales));
  uint16_t rope_bf16[kV32RopeDim];
  for (int64_t i = 0; i < kV32RopeDim; ++i) rope_bf16[i] = f32_to_bf16(x[kV32NopeDim + i]);
  std::memcpy(entry + kV32NopeDim + sizeof(scales), rope_bf16, sizeof(rope_bf16));
}

inline void v32_load(const uint8_t* entry, float* out) {
  float scales[kV32Tiles];
  std::memcpy(scales, entry + kV32NopeDim, sizeof(scales));
  for (int64_t i = 0; i < kV32NopeDim; ++i) out[i] = e4m3_to_f32(entry[i]) * scales[i / kV32Tile];
  uint16_t rope_bf16[kV32RopeDim];
  std::memcpy(rope_bf16, entry + kV32NopeDim + sizeof(scales), sizeof(rope_bf16));
  for (int64_t i = 0; i < kV32RopeDim; ++i) out[kV32NopeDim + i] = bf16_to_f32(rope_bf16[i]);
}

// V4.1 fp8 entry from 512 bf16-rounded values: 16 tiles of 32, each e4m3 codes and a UE8M0 scale.
inline void v41_fp8_store(const EntryBytes& e, const float* x) {
  for (int64_t t = 0; t < kV41Fp8Tiles; ++t)
    e.scales[t] = ue8m0_byte(quantize_tile(x + t * kV41Fp8Tile, kV41Fp8Tile, e.data + t * kV41Fp8Tile));
}

inline void v41_fp8_load(const EntryBytes& e, float* out) {
  for (int64_t t = 0; t < kV41Fp8Tiles; ++t) {
    const float mult = ue8m0_value(e.scales[t]);
    for (int64_t i = 0; i < kV41Fp8Tile; ++i) out[t * kV41Fp8Tile + i] = e4m3_to_f32(e.data[t * kV41Fp8Tile + i]) * mult;
  }
}

constexpr float kE2m1Max = 6.0f, kFp4ScaleMin = 0x1p-9f;  // the scale's floor: the smallest e4m3 magnitude
constexpr uint8_t kE4m3NanByte = 0x7f, kE2m1Sign = 8, kE2m1Magnitude = 7;
constexpr float kE2m1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// e2m1 code of y: round to nearest even (ties to the even code), saturating at +-6; NaN -> 0; the sign bit is kept
// (-0 and negatives that round to 0 give code 8).
inline uint8_t f32_to_e2m1(float y) {
  if (std::isnan(y)) return 0;
  const float a = std::fabs(y);
  const uint8_t magnitude = uint8_t((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                                    (a >= 3.5f) + (a > 5.0f));
  return uint8_t((std::signbit(y) ? kE2m1Sign : 0) | magnitude);
}

// e4m3 byte of a V4.1 fp4 tile scale: e4m3_rne(clamp(amax / 6, 2^-9, 448)); a tile holding NaN or inf gets NaN.
inline uint8_t fp4_scale_byte(const float* x) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kV41Fp4Tile; ++i) {
    const float a = std::fabs(x[i]);
    if (!std::isfinite(a)) return kE4m3NanByte;  // NaN counts as inf: it poisons the tile
    amax = a > amax ? a : amax;
  }
  const float s = amax / kE2m1Max;
  return f32_to_e4m3(s < kFp4ScaleMin ? kFp4ScaleMin : s);  // f32_to_e4m3 saturates at 448
}

// V4.1 fp4 entry from 512 bf16-rounded values: 32 tiles of 16, each e2m1 codes of x / scale and an e4m3 scale.
inline void v41_fp4_store(const EntryBytes& e, const float* x) {
  for (int64_t t = 0; t < kV41Fp4Tiles; ++t) {
    const float* tile = x + t * kV41Fp4Tile;
    e.scales[t] = fp4_scale_byte(tile);
    const float scale = e4m3_to_f32(e.scales[t]);
    uint8_t* codes = e.data + t * kV41Fp4Tile / 2;
    for (int64_t i = 0; i < kV41Fp4Tile; i += 2)
      codes[i / 2] = uint8_t(f32_to_e2m1(tile[i] / scale) | f32_to_e2m1(tile[i + 1] / scale) << 4);
  }
}

inline float e2m1_to_f32(uint8_t code) {
  const float v = kE2m1Values[code & kE2m1Magnitude];
  return (code & kE2m1Sign) ? -v : v;
}

inline void v41_fp4_load(const EntryBytes& e, float* out) {
  for (int64_t t = 0; t < kV41Fp4Tiles; ++t) {
    const float scale = e4m3_to_f32(e.scales[t]);
    for (int64_t i = 0; i < kV41Fp4Tile; i += 2) {
      const uint8_t pair = e.data[(t * kV41Fp4Tile + i) / 2];
      out[t * kV41Fp4Tile + i] = e2m1_to_f32(pair & 0xf) * scale;
      out[t * kV41Fp4Tile + i + 1] = e2m1_to_f32(pair >> 4) * scale;
    }
  }
}

// Any attention record's entry at slot -> its record_head_dim(layout) floats; false when the slot is invalid.
inline bool record_load(KvLayout layout, const PagedCache& c, int64_t slot, float* out) {
  const EntryBytes e = slot_entry(layout, c, slot);
  if (!e.data) return false;
  switch (layout) {
    case KvLayout::model1: model1_load(e, out); break;
    case KvLayout::v32: v32_load(e.data, out); break;
    case KvLayout::v41_fp8: v41_fp8_load(e, out); break;
    case KvLayout::v41_fp4: v41_fp4_load(e, out); break;
  }
  return true;
}

// A 512-dim record's entry (MODEL1, V4.1 fp8 or fp4) at slot from 512 bf16-rounded values (MODEL1: RoPE dims as
// given, rounded here); false when the slot is invalid.
inline bool record512_store(KvLayout layout, const PagedCache& c, int64_t slot, const float* x) {
  const EntryBytes e = slot_entry(layout, c, slot);
  if (!e.data || layout == KvLayout::v32) return false;
  if (layout == KvLayout::v41_fp8) v41_fp8_store(e, x);
  else if (layout == KvLayout::v41_fp4) v41_fp4_store(e, x);
  else model1_store(e, x, x + kModel1NopeDim);
  return true;
}

// Any attention record's entry at slot from record_head_dim(layout) bf16-rounded values; false when the slot is
// invalid.
inline bool record_store(KvLayout layout, const PagedCache& c, int64_t slot, const float* x) {
  if (layout != KvLayout::v32) return record512_store(layout, c, slot, x);
  const EntryBytes e = slot_entry(layout, c, slot);
  if (e.data) v32_store(e.data, x);
  return e.data != nullptr;
}

// Indexer K entry from 128 bf16-rounded values: e4m3 codes plus a power-of-two fp32 scale.
inline void indexer_k_store(uint8_t* page, int64_t block_size, int64_t off, const float* x) {
  const int e = indexer_exponent(abs_max(x, kIndexerHeadDim));
  encode_e4m3_scaled(x, std::ldexp(1.0f, -e), kIndexerHeadDim, page + off * kIndexerHeadDim);
  const float scale = std::ldexp(1.0f, e);
  std::memcpy(page + block_size * kIndexerHeadDim + 4 * off, &scale, 4);
}

}  // namespace dsv4::cpu::DSV4_ISA
