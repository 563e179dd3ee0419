// Pieces of the Hopper sparse decode: the q tile's 128-byte-swizzled layout for wgmma, a request's attended index
// sets, and the exact e4m3 -> bf16 decode of MODEL1 nope codes.
#pragma once
#include <cstdint>

#include "common/decode_schedule.h"
#include "common/params.h"
#include "cuda/sm90/warp_mma.cuh"

namespace dsv4::cuda::sm90 {

constexpr int kHeadsPerCta = 64;  // q rows of one tile: h_q 128 takes two head groups
constexpr int kEntriesPerBlock = int(kDecodeBlockEntries);
constexpr int kDim = 512;  // d_qk and d_v of MODEL1
constexpr int kChunkElems = 8;  // bf16 per 16-byte swizzle chunk
constexpr int kChunksPerRow = kDim / kChunkElems;
constexpr int kTileBytes = kHeadsPerCta * kDim * 2;  // 64 rows of 512 bf16; the K tile has the same shape

constexpr int kNopeDim = 448;
constexpr int kEntryDataBytes = 576, kEntryScaleBytes = 8;
constexpr int kVectorBytes = 16;
constexpr int kPieceBytes = 8;  // gather granularity of pages that are only 8-byte aligned
constexpr int kNopeChunks = kNopeDim / kChunkElems;

// Byte offset of chunk c of row r in a tile: 8 column slabs of 64 values, each 64 rows of 128 bytes whose 16-byte
// chunks are XOR-permuted by the row (wgmma's 128-byte swizzle, K-major for Q and K, N-major for V).
constexpr int kSlabChunks = 8;
constexpr int kRowBytes = kSlabChunks * 16;
constexpr int kSlabBytes = kHeadsPerCta * kRowBytes;
DSV4_SM90_DEVICE uint32_t tile_offset(int row, int chunk) {
  return uint32_t((chunk / kSlabChunks) * kSlabBytes + row * kRowBytes + (((chunk % kSlabChunks) ^ (row & 7)) * 16));
}

// Request r's attended entries as blocks of 64: main-set blocks first, then extra-set blocks.
struct RequestSets {
  int64_t main_length, extra_length, main_blocks, blocks;
};

DSV4_SM90_DEVICE RequestSets request_sets(const SparseMlaDecodeParams& p, int64_t r) {
  const int64_t main_length = set_length(p.main, r), extra_length = set_length(p.extra, r);
  const int64_t mb = main_blocks(p, r);
  return {main_length, extra_length, mb, mb + entry_blocks(extra_length)};
}

// Four e4m3 codes -> two bf16x2 words holding code * 2^-120 exactly (sign to bit 15, exponent and mantissa to
// bits 4-10 of each half: e4m3 normals and subnormals both land on the bf16 value with the bias moved by 120). One
// prmt per pair puts each code in the low byte of its half with its sign copied over the high byte; shifted by 4,
// bit 15 is then the sign and the mask clears the sign's other copies.
DSV4_SM90_DEVICE void e4m3x4_to_bf16_biased(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kLowPair = 0x9180, kHighPair = 0xb3a2;  // bytes (0, sign 0, 1, sign 1) and (2, sign 2, 3, sign 3)
  constexpr uint32_t kMask = 0x87f087f0u;
  uint32_t pairs[2];
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(pairs[0]) : "r"(codes), "n"(kLowPair));
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(pairs[1]) : "r"(codes), "n"(kHighPair));
  lo = (pairs[0] << 4) & kMask, hi = (pairs[1] << 4) & kMask;
}

constexpr uint32_t kMaxDirectScale = 134, kBiasShift = 120;

// Bit 7 of each byte of the result is set where that byte of `codes` is an e4m3 NaN (low 7 bits all ones): adding 1
// flips bit 7 exactly there (a carry into a byte needs a NaN code below it). Two instructions per word.
DSV4_SM90_DEVICE uint32_t nan_code_bits(uint32_t codes) { return (codes + 0x01010101u) ^ codes; }

// Whether 16 codes under scale byte b take the direct bf16 route (no e4m3 NaN code, 2^(b - 7) a bf16 normal).
DSV4_SM90_DEVICE bool decodes_directly(uint4 codes, uint32_t scale_byte) {
  const uint32_t nan_bits = nan_code_bits(codes.x) | nan_code_bits(codes.y) | nan_code_bits(codes.z) |
                            nan_code_bits(codes.w);
  return (nan_bits & 0x80808080u) == 0 && scale_byte <= kMaxDirectScale;
}

// The bf16x2 factor 2^(b - 7) (both halves) of scale byte b of `biased_scales`, the scale bytes plus kBiasShift
// each (bytes of at most kMaxDirectScale: no carries).
DSV4_SM90_DEVICE uint32_t direct_factor(uint32_t biased_scales, int byte) {
  uint32_t halves;  // the byte at bits 8-15 and 24-31; shifted right by one it is each half's bf16 exponent
  const uint32_t selector = 0x0404u | uint32_t(byte) << 4 | uint32_t(byte) << 12;  // (zero, byte, zero, byte)
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(halves) : "r"(biased_scales), "r"(selector));
  return halves >> 1;
}

// The direct route with the factor of direct_factor: bf16 code * 2^-120 times bf16 2^(b - 7), exact for every
// finite code (decodes_directly).
DSV4_SM90_DEVICE void decode_nope_16_factor(uint4 codes, uint32_t factor, uint4& first, uint4& second) {
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t out[8];
  for (int i = 0; i < 4; ++i) {
    uint32_t lo, hi;
    e4m3x4_to_bf16_biased(words[i], lo, hi);
    out[2 * i] = mul_bf16x2(lo, factor), out[2 * i + 1] = mul_bf16x2(hi, factor);
  }
  first = make_uint4(out[0], out[1], out[2], out[3]);
  second = make_uint4(out[4], out[5], out[6], out[7]);
}

DSV4_SM90_DEVICE void decode_nope_16_direct(uint4 codes, uint32_t scale_byte, uint4& first, uint4& second) {
  decode_nope_16_factor(codes, direct_factor(scale_byte + kBiasShift, 0), first, second);
}

// 16 nope codes sharing scale byte b -> 16 bf16 values e4m3 * 2^(b - 127) rounded once, as two 16-byte chunks.
// The direct route when it applies, else (an e4m3 NaN code or a large scale) the exact fp32 route.
DSV4_SM90_DEVICE void decode_nope_16(uint4 codes, uint8_t scale_byte, uint4& first, uint4& second) {
  if (decodes_directly(codes, scale_byte)) return decode_nope_16_direct(codes, scale_byte, first, second);
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t out[8];
  const float scale = ue8m0_to_f32(scale_byte);
  for (int i = 0; i < 8; ++i) {
    float lo, hi;
    e4m3x2_to_f32(uint16_t(words[i / 2] >> (16 * (i % 2))), lo, hi);
    out[i] = pack_bf16x2(lo * scale, hi * scale);
  }
  first = make_uint4(out[0], out[1], out[2], out[3]);
  second = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace dsv4::cuda::sm90
