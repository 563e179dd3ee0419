// Stores and loads of the paged cache records (geometry: common/cache_layouts.h; spec: python/dsv4/reference/quant.py).
#pragma once
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

// MODEL1 entry from 448 bf16-rounded NoPE values and 64 RoPE values (rounded to bf16 here).
inline void model1_store(uint8_t* page, int64_t block_size, int64_t off, const float* nope, const float* rope) {
  uint8_t* data = page + off * kModel1DataBytes;
  uint8_t* scales = page + block_size * kModel1DataBytes + off * kModel1ScaleBytes;
  for (int64_t t = 0; t < kModel1Tiles; ++t) {
    const int e = quantize_tile(nope + t * kModel1Tile, kModel1Tile, data + t * kModel1Tile);
    const int byte = e + 127;
    scales[t] = uint8_t(byte < 0 ? 0 : (byte > 255 ? 255 : byte));
  }
  scales[kModel1Tiles] = 0;
  uint16_t rope_bf16[kModel1RopeDim];
  for (int64_t i = 0; i < kModel1RopeDim; ++i) rope_bf16[i] = f32_to_bf16(rope[i]);
  std::memcpy(data + kModel1NopeDim, rope_bf16, sizeof(rope_bf16));
}

// MODEL1 entry -> 512 floats (scale byte b means 2^(b-127); 255 is NaN).
inline void model1_load(const uint8_t* page, int64_t block_size, int64_t off, float* out) {
  const uint8_t* data = page + off * kModel1DataBytes;
  const uint8_t* scales = page + block_size * kModel1DataBytes + off * kModel1ScaleBytes;
  for (int64_t t = 0; t < kModel1Tiles; ++t) {
    const float mult = scales[t] == 255 ? NAN : std::ldexp(1.0f, int(scales[t]) - 127);
    for (int64_t i = 0; i < kModel1Tile; ++i) out[t * kModel1Tile + i] = e4m3_to_f32(data[t * kModel1Tile + i]) * mult;
  }
  uint16_t rope_bf16[kModel1RopeDim];
  std::memcpy(rope_bf16, data + kModel1NopeDim, sizeof(rope_bf16));
  for (int64_t i = 0; i < kModel1RopeDim; ++i) out[kModel1NopeDim + i] = bf16_to_f32(rope_bf16[i]);
}

// V32 entry from 576 bf16-rounded values (512 NoPE, 64 RoPE).
inline void v32_store(uint8_t* page, int64_t off, const float* x) {
  uint8_t* entry = page + off * kV32BytesPerEntry;
  float scales[kV32Tiles];
  for (int64_t t = 0; t < kV32Tiles; ++t)
    scales[t] = std::ldexp(1.0f, quantize_tile(x + t * kV32Tile, kV32Tile, entry + t * kV32Tile));
  std::memcpy(entry + kV32NopeDim, scales, sizeof(scales));
  uint16_t rope_bf16[kV32RopeDim];
  for (int64_t i = 0; i < kV32RopeDim; ++i) rope_bf16[i] = f32_to_bf16(x[kV32NopeDim + i]);
  std::memcpy(entry + kV32NopeDim + sizeof(scales), rope_bf16, sizeof(rope_bf16));
}

inline void v32_load(const uint8_t* page, int64_t off, float* out) {
  const uint8_t* entry = page + off * kV32BytesPerEntry;
  float scales[kV32Tiles];
  std::memcpy(scales, entry + kV32NopeDim, sizeof(scales));
  for (int64_t i = 0; i < kV32NopeDim; ++i) out[i] = e4m3_to_f32(entry[i]) * scales[i / kV32Tile];
  uint16_t rope_bf16[kV32RopeDim];
  std::memcpy(rope_bf16, entry + kV32NopeDim + sizeof(scales), sizeof(rope_bf16));
  for (int64_t i = 0; i < kV32RopeDim; ++i) out[kV32NopeDim + i] = bf16_to_f32(rope_bf16[i]);
}

// Indexer K entry from 128 bf16-rounded values: e4m3 codes plus a power-of-two fp32 scale.
inline void indexer_k_store(uint8_t* page, int64_t block_size, int64_t off, const float* x) {
  const int e = indexer_exponent(abs_max(x, kIndexerHeadDim));
  encode_e4m3_scaled(x, std::ldexp(1.0f, -e), kIndexerHeadDim, page + off * kIndexerHeadDim);
  const float scale = std::ldexp(1.0f, e);
  std::memcpy(page + block_size * kIndexerHeadDim + 4 * off, &scale, 4);
}

}  // namespace dsv4::cpu::DSV4_ISA
