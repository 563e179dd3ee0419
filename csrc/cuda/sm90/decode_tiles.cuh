// Shared-memory tiles of the Hopper sparse decode: the bf16 q tile and K/V tile (128-byte swizzled for wgmma), and
// the 64-entry MODEL1 gather: raw entry bytes copied asynchronously into a staging area, then decoded to bf16.
#pragma once
#include <cstdint>

#include "common/decode_schedule.h"
#include "common/indices.h"
#include "common/params.h"
#include "cuda/sm90/warp_mma.cuh"

namespace dsv4::cuda::sm90 {

constexpr int kHeadsPerCta = 64;  // q rows of one tile: h_q 128 takes two head groups
constexpr int kEntriesPerBlock = int(kDecodeBlockEntries);
constexpr int kDim = 512;  // d_qk and d_v of MODEL1
constexpr int kThreads = 256;  // 8 warps: (16-head row group) x (256-dim half of the output)
constexpr int kChunkElems = 8;  // bf16 per 16-byte swizzle chunk
constexpr int kChunksPerRow = kDim / kChunkElems;
constexpr int kTileBytes = kHeadsPerCta * kDim * 2;  // 64 rows of 512 bf16; the K tile has the same shape

constexpr int kNopeDim = 448, kNopeTile = 64;
constexpr int kEntryDataBytes = 576, kEntryScaleBytes = 8;
constexpr int kStagedScaleOffset = kDecodeBlockEntries * kEntryDataBytes;  // staging: all data, then all scales
constexpr int kStagingBytes = kStagedScaleOffset + kDecodeBlockEntries * kEntryScaleBytes;
constexpr int kVectorBytes = 16;
constexpr int kPieceBytes = 8;  // gather granularity of pages that are only 8-byte aligned
constexpr int kDataPieces = kEntryDataBytes / kPieceBytes;
constexpr int kThreadsPerEntry = kThreads / kEntriesPerBlock;
constexpr int kNopeChunks = kNopeDim / kChunkElems;

// Byte offset of chunk c of row r in a tile: 8 column slabs of 64 values, each 64 rows of 128 bytes whose 16-byte
// chunks are XOR-permuted by the row (wgmma's 128-byte swizzle, K-major for Q and K, N-major for V).
constexpr int kSlabChunks = 8;
constexpr int kRowBytes = kSlabChunks * 16;
constexpr int kSlabBytes = kHeadsPerCta * kRowBytes;
DSV4_SM90_DEVICE uint32_t tile_offset(int row, int chunk) {
  return uint32_t((chunk / kSlabChunks) * kSlabBytes + row * kRowBytes + (((chunk % kSlabChunks) ^ (row & 7)) * 16));
}

// Loads the q rows of heads [head0, head0 + 64) of query (b, s) into the tile; heads past h_q are zero. Aligned
// rows are copied by cp.async (all in flight at once; completed by the first block's wait).
DSV4_SM90_DEVICE void load_q_tile(const SparseMlaDecodeParams& p, int64_t b, int64_t s, int64_t head0, bool q_aligned,
                                  uint8_t* tile) {
  const uint16_t* q = p.q + b * p.q_stride_b + s * p.q_stride_s;
  for (int u = threadIdx.x; u < kHeadsPerCta * kChunksPerRow; u += kThreads) {
    const int row = u / kChunksPerRow, chunk = u % kChunksPerRow;
    const int64_t head = head0 + row;
    uint8_t* dst = tile + tile_offset(row, chunk);
    const uint16_t* src = q + head * p.q_stride_h + chunk * kChunkElems;
    if (head < p.h_q && q_aligned) {
      cp_async_16(shared_address(dst), src);
      continue;
    }
    uint4 v = make_uint4(0, 0, 0, 0);
    if (head < p.h_q) {
      uint16_t e[kChunkElems];
      for (int i = 0; i < kChunkElems; ++i) e[i] = __ldg(src + i);
      v = make_uint4(e[0] | uint32_t(e[1]) << 16, e[2] | uint32_t(e[3]) << 16, e[4] | uint32_t(e[5]) << 16,
                     e[6] | uint32_t(e[7]) << 16);
    }
    *reinterpret_cast<uint4*>(dst) = v;
  }
  cp_async_commit();
}

// Request r's attended entries as blocks of 64: main-set blocks first, then extra-set blocks.
struct RequestSets {
  int64_t main_length, extra_length, main_blocks, blocks;
};

DSV4_SM90_DEVICE RequestSets request_sets(const SparseMlaDecodeParams& p, int64_t r) {
  const int64_t main_length = set_length(p.main, r), extra_length = set_length(p.extra, r);
  const int64_t mb = main_blocks(p, r);
  return {main_length, extra_length, mb, mb + (extra_length + kEntriesPerBlock - 1) / kEntriesPerBlock};
}

// Index value of entry e of block j of query (r, s), or -1 past the set's length. Loaded a block ahead of its use;
// issue_block_gather rejects values outside the cache.
DSV4_SM90_DEVICE int64_t block_index(const SparseMlaDecodeParams& p, const RequestSets& sets, int64_t r, int64_t s,
                                     int64_t j, int e) {
  const bool in_main = j < sets.main_blocks;
  const SparseIndexSet& set = in_main ? p.main : p.extra;
  const int64_t column = (in_main ? j : j - sets.main_blocks) * kEntriesPerBlock + e;
  if (column >= (in_main ? sets.main_length : sets.extra_length)) return -1;
  const int64_t at = r * set.stride_b + s * set.stride_s + column * set.stride_k;
  return load_index(set.indices, set.is_int64, at);
}

// Starts copying the raw bytes of block j's entries into staging (entry e's 576 data bytes at e * 576, its 8
// scale bytes at kStagedScaleOffset + e * 8), four threads per entry, 16-byte copies where the page allows;
// `slot` is this thread's entry's block_index, entry_ok[e] says whether entry e is valid (negative, past the
// length or outside the cache: never read).
DSV4_SM90_DEVICE void issue_block_gather(const SparseMlaDecodeParams& p, const RequestSets& sets, int64_t j,
                                         int64_t slot, uint8_t* staging, uint8_t* entry_ok) {
  const int e = threadIdx.x / kThreadsPerEntry, part = threadIdx.x % kThreadsPerEntry;
  const PagedCache& c = (j < sets.main_blocks ? p.main : p.extra).cache;
  const bool ok = slot >= 0 && slot < c.num_blocks * c.block_size;
  if (part == 0) entry_ok[e] = ok;
  if (ok) {
    const int64_t block = slot / c.block_size, offset = slot - block * c.block_size;
    const uint8_t* page = c.base + block * c.block_stride;
    const uint8_t* data = page + offset * kEntryDataBytes;
    const uint32_t dst = shared_address(staging + e * kEntryDataBytes);
    if (reinterpret_cast<uintptr_t>(data) % kVectorBytes == 0) {
      for (int piece = part; piece < kEntryDataBytes / kVectorBytes; piece += kThreadsPerEntry)
        cp_async_16(dst + piece * kVectorBytes, data + piece * kVectorBytes);
    } else {
      for (int piece = part; piece < kDataPieces; piece += kThreadsPerEntry)
        cp_async_8(dst + piece * kPieceBytes, data + piece * kPieceBytes);
    }
    if (part == 0)
      cp_async_8(shared_address(staging + kStagedScaleOffset + e * kEntryScaleBytes),
                 page + c.block_size * kEntryDataBytes + offset * kEntryScaleBytes);
  }
  cp_async_commit();
}

// Four e4m3 codes -> two bf16x2 words holding code * 2^-120 exactly (sign to bit 15, exponent and mantissa to
// bits 4-10 of each half: e4m3 normals and subnormals both land on the bf16 value with the bias moved by 120).
DSV4_SM90_DEVICE void e4m3x4_to_bf16_biased(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  const uint32_t pairs[2] = {__byte_perm(codes, 0, 0x4140), __byte_perm(codes, 0, 0x4342)};
  uint32_t out[2];
  for (int i = 0; i < 2; ++i) {
    const uint32_t shifted = pairs[i] << 4, sign = shifted & 0x08000800u;
    out[i] = shifted + sign * 15u;  // bit 11 -> bit 15
  }
  lo = out[0], hi = out[1];
}

constexpr uint32_t kMaxDirectScale = 134, kBiasShift = 120, kBf16ExponentShift = 7;

// Whether 16 codes under scale byte b take the direct bf16 route (no e4m3 NaN code, 2^(b - 7) a bf16 normal).
DSV4_SM90_DEVICE bool decodes_directly(uint4 codes, uint32_t scale_byte) {
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t nan_bits = 0;
  for (int i = 0; i < 4; ++i) nan_bits |= ((words[i] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  return nan_bits == 0 && scale_byte <= kMaxDirectScale;
}

// The direct route: bf16 code * 2^-120 times bf16 2^(b - 7), exact for every finite code (decodes_directly).
DSV4_SM90_DEVICE void decode_nope_16_direct(uint4 codes, uint32_t scale_byte, uint4& first, uint4& second) {
  const uint32_t factor_half = (scale_byte + kBiasShift) << kBf16ExponentShift;
  const uint32_t factor = factor_half | factor_half << 16;
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

// Decodes the staged entries into the K/V tile (row e = entry e; RoPE bf16 copied); invalid entries become zero
// rows (0 * NaN would poison P.V) and are flagged in valid[e]. One work item = 16 staged bytes: 16 nope codes
// (two chunks) or one RoPE chunk. Ends with the async-proxy fence: the tile is read by wgmma after a barrier.
DSV4_SM90_DEVICE void decode_staged_block(const uint8_t* staging, const uint8_t* entry_ok, uint8_t* tile,
                                          uint8_t* valid) {
  constexpr int kItemsPerEntry = kEntryDataBytes / kVectorBytes, kNopeItems = kNopeDim / kVectorBytes;
  static_assert(kEntriesPerBlock * kItemsPerEntry % kThreads == 0, "whole rounds of work items");
  for (int u = threadIdx.x; u < kEntriesPerBlock * kItemsPerEntry; u += kThreads) {
    const int e = u / kItemsPerEntry, item = u % kItemsPerEntry;
    const bool ok = entry_ok[e] != 0;
    if (item == 0) valid[e] = ok;
    const uint4 raw = ok ? *reinterpret_cast<const uint4*>(staging + e * kEntryDataBytes + item * kVectorBytes)
                         : make_uint4(0, 0, 0, 0);
    if (item < kNopeItems) {
      uint4 first = make_uint4(0, 0, 0, 0), second = first;
      if (ok) {
        const uint8_t scale = staging[kStagedScaleOffset + e * kEntryScaleBytes + item * kVectorBytes / kNopeTile];
        decode_nope_16(raw, scale, first, second);
      }
      // Odd groups of four items store their second chunk first: 8 neighbouring lanes then hit 8 bank groups.
      const bool swap = (item / 4) % 2 != 0;
      *reinterpret_cast<uint4*>(tile + tile_offset(e, 2 * item + swap)) = swap ? second : first;
      *reinterpret_cast<uint4*>(tile + tile_offset(e, 2 * item + !swap)) = swap ? first : second;
    } else {
      *reinterpret_cast<uint4*>(tile + tile_offset(e, kNopeChunks + item - kNopeItems)) = raw;
    }
  }
  fence_async_shared();
}

}  // namespace dsv4::cuda::sm90
