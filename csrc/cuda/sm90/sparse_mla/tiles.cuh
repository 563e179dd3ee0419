// Pieces of the Hopper sparse decode: the q tile's 128-byte-swizzled layout for wgmma, a request's attended index
// sets, the exact e4m3 -> bf16 decode of MODEL1 nope codes and of V4.1 fp8 codes, and the exact e2m1 -> bf16 decode
// of V4.1 fp4 codes.
#pragma once
#include <cstdint>

#include "common/cache_layouts.h"
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

// ---- V4.1 records: all 512 dims are codes (no bf16 RoPE values), decoded 16 dims (one item) at a time ----
constexpr int kV41Items = kV41HeadDim / 16;  // items of an entry; a decoder thread takes items part + 4 k

// The scale bytes of a decoder thread's fp8 items, byte k of the pair for item part + 4 k: scale (part + 4 k) / 2
// = (part >> 1) + 2 k of the entry's 16, i.e. bytes (part >> 1) and (part >> 1) + 2 of each word.
DSV4_SM90_DEVICE uint2 v41_fp8_item_scales(uint4 scales, int part) {
  const uint32_t selector = 0x6420u + 0x1111u * uint32_t(part >> 1);
  return make_uint2(__byte_perm(scales.x, scales.y, selector), __byte_perm(scales.z, scales.w, selector));
}

// The scale bytes of a decoder thread's fp4 items, byte k of the pair for item part + 4 k: byte `part` of each of
// the entry's eight scale words.
DSV4_SM90_DEVICE uint2 v41_fp4_item_scales(const uint4 (&scales)[2], int part) {
  const uint32_t pick = uint32_t(part) | uint32_t(part + 4) << 4;  // byte `part` of either word into bytes 0, 1
  const uint32_t a = __byte_perm(scales[0].x, scales[0].y, pick), b = __byte_perm(scales[0].z, scales[0].w, pick);
  const uint32_t c = __byte_perm(scales[1].x, scales[1].y, pick), d = __byte_perm(scales[1].z, scales[1].w, pick);
  return make_uint2(__byte_perm(a, b, 0x5410), __byte_perm(c, d, 0x5410));
}

// Four non-NaN e4m3 scales -> their exact bf16 values (lo: bytes 0, 1; hi: bytes 2, 3), subnormal e4m3 and zero
// included: the biased decode (value * 2^-120) times 2^120, exact.
DSV4_SM90_DEVICE void e4m3x4_to_bf16(uint32_t scales, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kTwoTo120 = 0x7b807b80u;
  e4m3x4_to_bf16_biased(scales, lo, hi);
  lo = mul_bf16x2(lo, kTwoTo120), hi = mul_bf16x2(hi, kTwoTo120);
}

// e4m3x4_to_bf16 for any four scale bytes: NaN (bf16 0x7fc0) where a byte is NaN, found per byte with the signs
// cleared (low seven bits all ones: adding 1 sets bit 7, and no byte carries into the next). The masks spread each
// byte's bit 7 over its half by prmt's sign-replicating selectors, in asm: __byte_perm clears bit 3 of every
// selector nibble (selector & 0x7777), so through it the masks were the raw bytes and NaN scales stayed finite.
DSV4_SM90_DEVICE void e4m3x4_scales_to_bf16(uint32_t scales, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kNanPair = 0x7fc07fc0u;
  constexpr uint32_t kSpreadLow = 0x9988, kSpreadHigh = 0xbbaa;  // signs of bytes (0, 0, 1, 1) and (2, 2, 3, 3)
  e4m3x4_to_bf16(scales, lo, hi);
  const uint32_t nan = (scales & 0x7f7f7f7fu) + 0x01010101u;
  uint32_t nan_lo, nan_hi;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(nan_lo) : "r"(nan), "n"(kSpreadLow));
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(nan_hi) : "r"(nan), "n"(kSpreadHigh));
  lo = (lo & ~nan_lo) | (kNanPair & nan_lo), hi = (hi & ~nan_hi) | (kNanPair & nan_hi);
}

// Half h of a bf16x2 word in both halves.
DSV4_SM90_DEVICE uint32_t bf16_broadcast(uint32_t pair, int h) { return __byte_perm(pair, 0, h ? 0x3232u : 0x1010u); }

// The two e2m1 codes of byte `byte` of `codes` (dim 2i in the low nibble) -> bf16x2 of each code's value * 2^-126,
// exactly: the magnitude (2 exponent bits, 1 mantissa bit) to bits 6-8 and the sign to bit 15 of its half (code 1,
// 0.5, lands on the bf16 subnormal 2^-127). The multiplies place the byte's copies (b << 6, b << 18 for the
// magnitudes, b << 12, b << 24 for the signs) where they never overlap, so no carries.
DSV4_SM90_DEVICE uint32_t e2m1x2_to_bf16_tiny(uint32_t codes, int byte) {
  const uint32_t b = __byte_perm(codes, 0, 0x4440u | uint32_t(byte));
  return ((b * 0x40040u) & 0x01c001c0u) | ((b * 0x1001000u) & 0x80008000u);
}

constexpr uint32_t kTwoTo126 = 0x7e807e80u;  // bf16x2 2^126: raises the tiny form to the code's value

// 16 e2m1 codes (8 bytes) -> two 16-byte chunks of their bf16 values times `factor` (both halves): each pair's tiny
// form (code * 2^-126) raised by 2^126 first when kRaise, else `factor` already holds the scale times 2^126.
// Exact either way: e2m1 x e4m3 has at most 5 significant bits and stays in bf16's normal range, and each product
// on the way is a code times a power of two or that exact result.
template <bool kRaise>
DSV4_SM90_DEVICE void decode_e2m1_16(uint2 codes, uint32_t factor, uint4& first, uint4& second) {
  const uint32_t words[2] = {codes.x, codes.y};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t tiny = e2m1x2_to_bf16_tiny(words[i / 4], i % 4);
    out[i] = mul_bf16x2(kRaise ? mul_bf16x2(tiny, kTwoTo126) : tiny, factor);
  }
  first = make_uint4(out[0], out[1], out[2], out[3]);
  second = make_uint4(out[4], out[5], out[6], out[7]);
}

// Whether four e4m3 scale bytes are all below 4 in magnitude (NaN not): their bf16 values times 2^126 are then
// finite, so decode_e2m1_16 takes one product per pair. A byte's low seven bits plus 0x38 reach bit 7 exactly from
// 0x48 (4.0) up, without carries between bytes.
DSV4_SM90_DEVICE bool e4m3x4_below_four(uint32_t scales) {
  return (((scales & 0x7f7f7f7fu) + 0x38383838u) & 0x80808080u) == 0;
}

}  // namespace dsv4::cuda::sm90
