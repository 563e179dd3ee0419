// Sparse MLA pieces shared by the portable and Hopper decode tiers: a cache entry of any record (MODEL1, V32, V4.1
// fp8 or fp4, in its placement) decoded to the bf16-exact values the CPU kernels attend with (16 dims at a time or
// one value), the 64-entry blocks and split
// pieces of the decode plan (common/decode_schedule.h), and the finalisation of one (query, head) row from its
// online-softmax state into the bf16 output or an fp32 split partial.
#pragma once
#include <cstdint>

#include "common/cache_layouts.h"
#include "common/decode_schedule.h"
#include "common/records.h"
#include "cuda/portable/common.cuh"

namespace dsv4::cuda::mla {

// ---- cache entry layouts (geometry: common/cache_layouts.h, common/records.h) ----
constexpr int kValueDim = 512;  // V is the first 512 dims of an entry in every record
constexpr int kChunkDims = 16;  // dims decoded per chunk
constexpr int kChunkWords = kChunkDims / 2;  // packed bf16 pairs per chunk
constexpr uint8_t kNanScaleByte = 255;
static_assert(kChunkDims == kV41Fp4Tile && kV41Fp8Tile % kChunkDims == 0, "a chunk lies within one scale tile");

inline DSV4_HOST_DEVICE int entry_dims(KvLayout layout) { return record_head_dim(layout); }
inline DSV4_HOST_DEVICE int entry_chunks(KvLayout layout) { return entry_dims(layout) / kChunkDims; }

// Where one entry's bytes are: data (V32: codes, then scales, then RoPE) and scales (MODEL1, V4.1: the scale
// bytes, in the page's scale rows or after the data by placement; V32: the fp32 scales).
struct EntryRef {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
};

// The entry at slot of a paged cache; false (and nothing read) when the slot is outside the cache.
DSV4_DEVICE bool locate_entry(KvLayout layout, const PagedCache& c, int64_t slot, EntryRef* e) {
  const EntryBytes bytes = dsv4::slot_entry(layout, c, slot);
  if (!bytes.data) return false;
  e->data = bytes.data;
  e->scales = bytes.scales;
  return true;
}

// 16 bytes as 4 little-endian words; pages need not be 16-byte aligned (any page stride is allowed).
DSV4_DEVICE void load_16_bytes(const uint8_t* p, uint32_t w[4]) {
  if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    return;
  }
  for (int k = 0; k < 4; ++k)
    w[k] = uint32_t(p[4 * k]) | uint32_t(p[4 * k + 1]) << 8 | uint32_t(p[4 * k + 2]) << 16 |
           uint32_t(p[4 * k + 3]) << 24;
}

// 8 bytes as 2 little-endian words, at any alignment.
DSV4_DEVICE void load_8_bytes(const uint8_t* p, uint32_t w[2]) {
  if ((reinterpret_cast<uintptr_t>(p) & 7u) == 0) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
    return;
  }
  for (int k = 0; k < 2; ++k)
    w[k] = uint32_t(p[4 * k]) | uint32_t(p[4 * k + 1]) << 8 | uint32_t(p[4 * k + 2]) << 16 |
           uint32_t(p[4 * k + 3]) << 24;
}

DSV4_DEVICE float load_unaligned_f32(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) return *reinterpret_cast<const float*>(p);
  return __uint_as_float(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}

// 2^(b - 127) of a UE8M0 scale byte (255 is NaN, 0 the denormal 2^-127), as the CPU's model1_load.
DSV4_DEVICE float ue8m0_scale(uint8_t b) {
  if (b == kNanScaleByte) return __uint_as_float(kF32QuietNanBits);
  return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(uint32_t(b) << 23);
}

// bf16 bits of e4m3(code) * scale, the product rounded once in fp32 and then to bf16 (the CPU's order).
DSV4_DEVICE uint32_t scaled_code_bf16(uint32_t code, float scale) {
  return f32_to_bf16(e4m3_to_f32(uint8_t(code)) * scale);
}

// bf16 bits of e2m1(code) * scale (exact in fp32 and in bf16).
DSV4_DEVICE uint32_t scaled_e2m1_bf16(uint32_t code, float scale) { return f32_to_bf16(e2m1_to_f32(code) * scale); }

DSV4_DEVICE float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
DSV4_DEVICE float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }
DSV4_DEVICE uint32_t pack_bf16(uint32_t lo, uint32_t hi) { return lo | hi << 16; }

// Dims [16 * chunk, 16 * chunk + 16) of an entry as 8 packed bf16 pairs (low half: the even dim); chunk below
// entry_chunks(layout). e4m3 chunks are bf16(e4m3 * tile scale), e2m1 chunks bf16(e2m1 * tile scale) (one V4.1 fp4
// tile: 8 bytes of nibbles, dim 2i low), RoPE chunks (MODEL1, V32) the stored bf16 values.
DSV4_DEVICE void decode_entry_chunk(KvLayout layout, const EntryRef& e, int chunk, uint32_t out[kChunkWords]) {
  if (layout == KvLayout::v41_fp4) {
    const float scale = e4m3_to_f32(e.scales[chunk]);
    uint32_t nibbles[2];
    load_8_bytes(e.data + chunk * kChunkDims / 2, nibbles);
    for (int i = 0; i < kChunkWords; ++i) {
      const uint32_t pair = (nibbles[i / 4] >> (8 * (i % 4))) & 0xffu;
      out[i] = pack_bf16(scaled_e2m1_bf16(pair & 0xfu, scale), scaled_e2m1_bf16(pair >> 4, scale));
    }
    return;
  }
  const bool model1 = layout == KvLayout::model1, v41 = layout == KvLayout::v41_fp8;
  const int nope_chunks = (model1 ? kModel1NopeDim : v41 ? kV41HeadDim : kV32NopeDim) / kChunkDims;
  if (chunk >= nope_chunks) {
    const uint8_t* rope = e.data + (model1 ? kModel1NopeDim : kV32RopeOffset) + (chunk - nope_chunks) * 2 * kChunkDims;
    load_16_bytes(rope, out);
    load_16_bytes(rope + 16, out + 4);
    return;
  }
  const float scale = model1 ? ue8m0_scale(e.scales[chunk * kChunkDims / kModel1Tile])
                      : v41  ? ue8m0_scale(e.scales[chunk * kChunkDims / kV41Fp8Tile])
                             : load_unaligned_f32(e.scales + 4 * (chunk * kChunkDims / kV32Tile));
  uint32_t codes[4];
  load_16_bytes(e.data + chunk * kChunkDims, codes);
  for (int i = 0; i < kChunkWords; ++i) {
    const uint32_t two = codes[i / 2] >> (16 * (i % 2));
    out[i] = pack_bf16(scaled_code_bf16(two & 0xffu, scale), scaled_code_bf16((two >> 8) & 0xffu, scale));
  }
}

// Dim i of an entry as fp32 (bf16-exact), one value at a time.
DSV4_DEVICE float decode_entry_value(KvLayout layout, const EntryRef& e, int i) {
  if (layout == KvLayout::v41_fp4) {
    const uint32_t pair = e.data[i / 2], code = (i & 1) ? pair >> 4 : pair & 0xfu;
    return bf16_to_f32(uint16_t(scaled_e2m1_bf16(code, e4m3_to_f32(e.scales[i / kV41Fp4Tile]))));
  }
  if (layout == KvLayout::v41_fp8)
    return bf16_to_f32(uint16_t(scaled_code_bf16(e.data[i], ue8m0_scale(e.scales[i / kV41Fp8Tile]))));
  const bool model1 = layout == KvLayout::model1;
  const int nope = model1 ? kModel1NopeDim : kV32NopeDim;
  if (i >= nope) {
    const uint8_t* rope = e.data + (model1 ? kModel1NopeDim : kV32RopeOffset) + 2 * (i - nope);
    return bf16_to_f32(uint16_t(rope[0] | rope[1] << 8));
  }
  const float scale =
      model1 ? ue8m0_scale(e.scales[i / kModel1Tile]) : load_unaligned_f32(e.scales + 4 * (i / kV32Tile));
  return bf16_to_f32(uint16_t(scaled_code_bf16(e.data[i], scale)));
}

// ---- the decode plan: pieces of a partition, entries of a block ----

// Requests and blocks partition `part` attends (sched_meta row), clamped so a stale plan stays inside the tensors.
struct PartitionRange {
  int64_t begin_req = 0, end_req = -1, begin_block = 0, end_block = 0, begin_piece = 0;
};

DSV4_DEVICE PartitionRange partition_range(const SparseMlaDecodeParams& p, int64_t part) {
  const int32_t* m = p.sched.sched_meta + part * kDecodeSchedWords;
  PartitionRange r;
  r.begin_req = m[0] < 0 ? 0 : m[0];
  r.end_req = m[1] < p.b ? m[1] : p.b - 1;
  r.begin_block = m[2], r.end_block = m[3], r.begin_piece = m[4];
  return r;
}

// Request r's piece in a partition: blocks [block_begin, block_end), written straight to the output (direct) or
// to split row split_row of o_accum / lse_accum; valid false when the plan points outside o_accum.
struct DecodePiece {
  int64_t block_begin = 0, block_end = 0, split_row = 0;
  bool direct = true, valid = false;
};

DSV4_DEVICE DecodePiece request_piece(const SparseMlaDecodeParams& p, const PartitionRange& range, int64_t r) {
  DecodePiece piece;
  const int64_t blocks = request_blocks(p, r);
  piece.block_begin = r == range.begin_req ? (range.begin_block < 0 ? 0 : range.begin_block) : 0;
  piece.block_end = r == range.end_req ? (range.end_block < blocks ? range.end_block : blocks) : blocks;
  const int64_t first = p.sched.num_splits[r];
  piece.direct = p.sched.num_splits[r + 1] - first == 1;
  piece.split_row = first + (r == range.begin_req ? range.begin_piece : 0);
  piece.valid = piece.direct || (piece.split_row >= 0 && piece.split_row < p.b + p.sched.num_parts);
  return piece;
}

// Whether the plan split no request: as many pieces as requests (the planner gives every request at least one),
// so the combine has nothing to merge.
DSV4_DEVICE bool plan_splits_nothing(const SparseMlaDecodeParams& p) {
  return p.sched.num_splits[p.b] - p.sched.num_splits[0] == p.b;
}

// The index set (extra or main), first column and candidate columns (at most 64) of block `block` of request r:
// the main set's blocks come first (at least one), then the extra set's.
struct BlockColumns {
  bool extra = false;
  int64_t first = 0, count = 0;
};

DSV4_DEVICE BlockColumns block_columns(const SparseMlaDecodeParams& p, int64_t r, int64_t block) {
  const int64_t mb = main_blocks(p, r);
  BlockColumns b;
  b.extra = block >= mb;
  b.first = (b.extra ? block - mb : block) * kDecodeBlockEntries;
  const int64_t left = set_length(b.extra ? p.extra : p.main, r) - b.first;
  b.count = left < 0 ? 0 : (left < kDecodeBlockEntries ? left : kDecodeBlockEntries);
  return b;
}

// Slot id at column c of an index set for query (r, s).
DSV4_DEVICE int64_t set_slot(const SparseIndexSet& set, int64_t r, int64_t s, int64_t c) {
  const int64_t i = r * set.stride_b + s * set.stride_s + c * set.stride_k;
  return load_index(set.indices, set.is_int64, i);
}

// Offset of (split row, s, h) in o_accum (times d_v) and lse_accum ([b + num_parts, s_q, h_q]).
DSV4_DEVICE int64_t accum_row(const SparseMlaDecodeParams& p, int64_t split_row, int64_t s, int64_t h) {
  return (split_row * p.s_q + s) * p.h_q + h;
}

// ---- finalising one (query, head) row ----

// From a row's online-softmax state (running max, sum of exp(score - max), unnormalised output acc):
// out = acc * out_scale and its natural-log lse.
struct RowFinish {
  float lse;
  float out_scale;
  float max_logit;  // the row's largest score (prefill's max_logits), NaN with a NaN lse
};

// The final row: lse = max + ln(sum), out_scale = 1 / sum times the sink factor 1 / (1 + exp(sink - lse)) (the
// lse excludes the sink); no valid entry: out exactly 0 and lse +inf. A NaN score (in q or an attended row) makes
// the sum NaN, and with it lse and out, as in the reference.
// has_sink false: no sink (the factor is exactly 1). peak: the row's largest score, for max_logit, where `max` (the
// weights' offset) may lag it (the Hopper tier raises its offset lazily).
DSV4_DEVICE RowFinish finish_output_row(float max, float sum, bool has_sink, float sink, float peak) {
  if (sum == 0.0f) return {INFINITY, 0.0f, peak};
  const float lse = max + logf(sum);
  const float sink_factor = has_sink ? 1.0f / (1.0f + expf(sink - lse)) : 1.0f;
  return {lse, (1.0f / sum) * sink_factor, lse != lse ? lse : peak};
}
DSV4_DEVICE RowFinish finish_output_row(float max, float sum, bool has_sink, float sink) {
  return finish_output_row(max, sum, has_sink, sink, max);
}
DSV4_DEVICE RowFinish finish_output_row(float max, float sum, const float* attn_sink, int64_t head) {
  return finish_output_row(max, sum, attn_sink != nullptr, attn_sink != nullptr ? attn_sink[head] : 0.0f);
}

// A split partial: o = acc / sum and its lse; no valid entry: zeros and lse -inf (the combine skips it); a NaN
// sum gives a NaN lse, which the combine passes on.
DSV4_DEVICE RowFinish finish_partial_row(float max, float sum) {
  if (sum == 0.0f) return {-INFINITY, 0.0f, max};
  const float lse = max + logf(sum);
  return {lse, 1.0f / sum, lse != lse ? lse : max};
}

// Two output dims scaled and packed as bf16 (a zero scale writes +0, never -0).
DSV4_DEVICE uint32_t scaled_bf16_pair(float a, float b, float scale) {
  if (scale == 0.0f) return 0u;
  return pack_bf16(f32_to_bf16(a * scale), f32_to_bf16(b * scale));
}

}  // namespace dsv4::cuda::mla
