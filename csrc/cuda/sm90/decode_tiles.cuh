// Shared-memory tiles of the Hopper sparse decode: the bf16 q tile and K/V tile (swizzled for ldmatrix), and
// the 64-entry MODEL1 gather: raw entry bytes copied asynchronously into a staging area, then decoded to bf16.
#pragma once
#include <cstdint>

#include "common/decode_schedule.h"
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

// Byte offset of chunk c of row r in a swizzled tile: the 8 chunks of a 128-byte line are XOR-permuted by the
// row, so 8 rows read at the same chunk (one ldmatrix matrix) hit 8 distinct bank groups.
DSV4_SM90_DEVICE uint32_t tile_offset(int row, int chunk) {
  return uint32_t(row * (kDim * 2) + ((chunk ^ (row & 7)) * 16));
}

// Loads the q rows of heads [head0, head0 + 64) of query (b, s) into the tile; heads past h_q are zero.
DSV4_SM90_DEVICE void load_q_tile(const SparseMlaDecodeParams& p, int64_t b, int64_t s, int64_t head0, bool q_aligned,
                                  uint8_t* tile) {
  const uint16_t* q = p.q + b * p.q_stride_b + s * p.q_stride_s;
  for (int u = threadIdx.x; u < kHeadsPerCta * kChunksPerRow; u += kThreads) {
    const int row = u / kChunksPerRow, chunk = u % kChunksPerRow;
    const int64_t head = head0 + row;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (head < p.h_q) {
      const uint16_t* src = q + head * p.q_stride_h + chunk * kChunkElems;
      if (q_aligned) {
        v = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        uint16_t e[kChunkElems];
        for (int i = 0; i < kChunkElems; ++i) e[i] = __ldg(src + i);
        v = make_uint4(e[0] | uint32_t(e[1]) << 16, e[2] | uint32_t(e[3]) << 16, e[4] | uint32_t(e[5]) << 16,
                       e[6] | uint32_t(e[7]) << 16);
      }
    }
    *reinterpret_cast<uint4*>(tile + tile_offset(row, chunk)) = v;
  }
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

// Data bytes of entry e of block j of query (r, s) and, through *scales, its scale bytes; nullptr when the entry
// is invalid (past the set's length, negative, outside the cache): such entries are never read.
DSV4_SM90_DEVICE const uint8_t* block_entry(const SparseMlaDecodeParams& p, const RequestSets& sets, int64_t r,
                                            int64_t s, int64_t j, int e, const uint8_t** scales) {
  const bool in_main = j < sets.main_blocks;
  const SparseIndexSet& set = in_main ? p.main : p.extra;
  const int64_t column = (in_main ? j : j - sets.main_blocks) * kEntriesPerBlock + e;
  if (column >= (in_main ? sets.main_length : sets.extra_length)) return nullptr;
  const int64_t at = r * set.stride_b + s * set.stride_s + column * set.stride_k;
  const int64_t slot =
      set.is_int64 ? static_cast<const int64_t*>(set.indices)[at] : static_cast<const int32_t*>(set.indices)[at];
  const PagedCache& c = set.cache;
  if (slot < 0 || slot >= c.num_blocks * c.block_size) return nullptr;
  const int64_t block = slot / c.block_size, offset = slot - block * c.block_size;
  const uint8_t* page = c.base + block * c.block_stride;
  *scales = page + c.block_size * kEntryDataBytes + offset * kEntryScaleBytes;
  return page + offset * kEntryDataBytes;
}

// Starts copying the raw bytes of block j's 64 entries into staging (entry e's 576 data bytes at e * 576, its 8
// scale bytes at kStagedScaleOffset + e * 8), four threads per entry, 16-byte copies where the page allows;
// entry_ok[e] says whether entry e is valid.
DSV4_SM90_DEVICE void issue_block_gather(const SparseMlaDecodeParams& p, const RequestSets& sets, int64_t r,
                                         int64_t s, int64_t j, uint8_t* staging, uint8_t* entry_ok) {
  const int e = threadIdx.x / kThreadsPerEntry, part = threadIdx.x % kThreadsPerEntry;
  const uint8_t* scales = nullptr;
  const uint8_t* data = block_entry(p, sets, r, s, j, e, &scales);
  if (part == 0) entry_ok[e] = data != nullptr;
  if (data != nullptr) {
    const uint32_t dst = shared_address(staging + e * kEntryDataBytes);
    if (reinterpret_cast<uintptr_t>(data) % kVectorBytes == 0) {
      for (int piece = part; piece < kEntryDataBytes / kVectorBytes; piece += kThreadsPerEntry)
        cp_async_16(dst + piece * kVectorBytes, data + piece * kVectorBytes);
    } else {
      for (int piece = part; piece < kDataPieces; piece += kThreadsPerEntry)
        cp_async_8(dst + piece * kPieceBytes, data + piece * kPieceBytes);
    }
    if (part == 0) cp_async_8(shared_address(staging + kStagedScaleOffset + e * kEntryScaleBytes), scales);
  }
  cp_async_commit();
}

// Decodes the staged entries into the K/V tile (row e = entry e, bf16 e4m3 * 2^(scale-127) rounded once; RoPE
// bf16 copied); invalid entries become zero rows (0 * NaN would poison P.V) and are flagged in valid[e].
DSV4_SM90_DEVICE void decode_staged_block(const uint8_t* staging, const uint8_t* entry_ok, uint8_t* tile,
                                          uint8_t* valid) {
  for (int u = threadIdx.x; u < kEntriesPerBlock * kChunksPerRow; u += kThreads) {
    const int e = u / kChunksPerRow, chunk = u % kChunksPerRow;
    const uint8_t* entry = staging + e * kEntryDataBytes;
    const bool ok = entry_ok[e] != 0;
    if (chunk == 0) valid[e] = ok;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (ok && chunk < kNopeChunks) {
      const uint2 codes = *reinterpret_cast<const uint2*>(entry + chunk * kChunkElems);
      const float scale =
          ue8m0_to_f32(staging[kStagedScaleOffset + e * kEntryScaleBytes + chunk * kChunkElems / kNopeTile]);
      const uint32_t words[2] = {codes.x, codes.y};
      uint32_t out[4];
      for (int i = 0; i < 4; ++i) {
        float lo, hi;
        e4m3x2_to_f32(uint16_t(words[i / 2] >> (16 * (i % 2))), lo, hi);
        out[i] = pack_bf16x2(lo * scale, hi * scale);
      }
      v = make_uint4(out[0], out[1], out[2], out[3]);
    } else if (ok) {
      v = *reinterpret_cast<const uint4*>(entry + kNopeDim + (chunk - kNopeChunks) * kVectorBytes);
    }
    *reinterpret_cast<uint4*>(tile + tile_offset(e, chunk)) = v;
  }
}

}  // namespace dsv4::cuda::sm90
