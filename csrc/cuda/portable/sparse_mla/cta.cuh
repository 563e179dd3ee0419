// The attention core of the portable sparse MLA kernels: one CTA attends one query for kHeadsPerCta heads, a
// tile of kTileEntries entries at a time. Each tile is decoded once into shared memory as bf16 and shared by the
// heads; scores come from per-thread dot products (thread = head x entry lane); an fp32 online softmax per head
// (P rounded to bf16 for P.V, sums of the unrounded P); O accumulates in registers, thread t owning output dims
// 2t and 2t + 1 of every head.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/portable/sparse_mla/common.cuh"

namespace dsv4::cuda::mla {

constexpr int kHeadsPerCta = 16;
constexpr int kCtaThreads = 256;
constexpr int kTileEntries = 32;
constexpr int kEntryLanes = kCtaThreads / kHeadsPerCta;  // score-phase threads per head
constexpr int kEntriesPerLane = kTileEntries / kEntryLanes;
constexpr int kMaxQkWords = 576 / 2;  // packed bf16 pairs of the widest row (V32)
constexpr int kKeyRowWords = kMaxQkWords + 4;  // rows 4 banks apart: score-phase key reads never conflict
constexpr int kQueryRowWords = kMaxQkWords + 1;  // heads 1 bank apart: the 16 heads of a warp read in parallel
constexpr int kValueWords = kValueDim / 2;
static_assert(kValueWords == kCtaThreads, "thread t owns value word t of every head");
static_assert(kEntriesPerLane * kEntryLanes == kTileEntries, "whole tiles per lane");

struct CtaShared {
  uint32_t keys[kTileEntries][kKeyRowWords];  // decoded entries, packed bf16; zero rows for invalid entries
  uint32_t query[kHeadsPerCta][kQueryRowWords];  // packed bf16; zero rows for heads past h_q
  float probs[kTileEntries][kHeadsPerCta];  // bf16-rounded P of the tile
  float lane_max[kEntryLanes][kHeadsPerCta];
  float lane_sum[kEntryLanes][kHeadsPerCta];
  float alpha[kHeadsPerCta];  // rescale of the accumulators by the raised running max
  float row_max[kHeadsPerCta], row_sum[kHeadsPerCta];  // final state of a query's rows
  EntryRef entries[kTileEntries];  // data == nullptr: invalid entry
};
static_assert(sizeof(CtaShared) <= 64 * 1024, "fits the 64 KiB of a HIP workgroup");
static_assert(offsetof(CtaShared, probs) % 16 == 0 && (kKeyRowWords * 4) % 16 == 0, "16-byte vector accesses");

// One thread's share of a query's state: the running max and sum of head (t % kHeadsPerCta) (score-phase role)
// and the unnormalised output dims 2t, 2t + 1 of every head (P.V role).
struct CtaState {
  float max, sum;
  float acc[kHeadsPerCta][2];
};

DSV4_DEVICE int head_of_thread() { return int(threadIdx.x) % kHeadsPerCta; }
DSV4_DEVICE int lane_of_thread() { return int(threadIdx.x) / kHeadsPerCta; }

// Starts a query: q rows of `heads` heads (row stride q_stride_h elements, words packed pairs each) into shared
// memory, the state reset. Waits first, so the previous query's final state has been read.
DSV4_DEVICE void begin_query(CtaShared& sm, CtaState& st, const uint16_t* q, int64_t q_stride_h, int heads,
                             int words) {
  __syncthreads();
  for (int i = threadIdx.x; i < kHeadsPerCta * words; i += kCtaThreads) {
    const int h = i / words, w = i - h * words;
    uint32_t pair = 0;
    if (h < heads) {
      const uint16_t* row = q + h * q_stride_h + 2 * w;
      pair = pack_bf16(row[0], row[1]);
    }
    sm.query[h][w] = pair;
  }
  st.max = -INFINITY, st.sum = 0.0f;
  for (int h = 0; h < kHeadsPerCta; ++h) st.acc[h][0] = 0.0f, st.acc[h][1] = 0.0f;
}

// Attends the `count` (<= kTileEntries) candidate columns from `first` of the current query. Source:
//   bool locate(int64_t column, EntryRef*) const  -- false for an invalid entry
//   void chunk(const EntryRef&, int chunk, uint32_t out[kChunkWords]) const  -- dims [16 chunk, 16 chunk + 16)
// words: d_qk / 2. Every thread of the CTA calls it.
template <class Source>
DSV4_DEVICE void attend_tile(CtaShared& sm, CtaState& st, const Source& src, int64_t first, int count, int words,
                             float sm_scale) {
  const int t = threadIdx.x;
  if (t < kTileEntries) {
    EntryRef e;
    if (t >= count || !src.locate(first + t, &e)) e.data = nullptr;
    sm.entries[t] = e;
  }
  __syncthreads();
  const int chunks = words / kChunkWords;
  for (int task = t; task < kTileEntries * chunks; task += kCtaThreads) {
    const int e = task / chunks, c = task - e * chunks;
    uint32_t v[kChunkWords] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (sm.entries[e].data != nullptr) src.chunk(sm.entries[e], c, v);
    uint4* dst = reinterpret_cast<uint4*>(&sm.keys[e][c * kChunkWords]);
    dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
    dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
  }
  __syncthreads();

  // Scores of (head, entries lane + i * kEntryLanes); even and odd dims in separate sums for more parallel work.
  const int head = head_of_thread(), lane = lane_of_thread();
  float score[kEntriesPerLane];
  {
    float even[kEntriesPerLane], odd[kEntriesPerLane];
    for (int i = 0; i < kEntriesPerLane; ++i) even[i] = 0.0f, odd[i] = 0.0f;
    const uint32_t* qrow = sm.query[head];
#pragma unroll 4
    for (int w = 0; w < words; ++w) {
      const uint32_t qw = qrow[w];
      const float qe = bf16_lo(qw), qo = bf16_hi(qw);
      for (int i = 0; i < kEntriesPerLane; ++i) {
        const uint32_t kw = sm.keys[lane + i * kEntryLanes][w];
        even[i] = fmaf(qe, bf16_lo(kw), even[i]);
        odd[i] = fmaf(qo, bf16_hi(kw), odd[i]);
      }
    }
    for (int i = 0; i < kEntriesPerLane; ++i)
      score[i] = sm.entries[lane + i * kEntryLanes].data != nullptr ? (even[i] + odd[i]) * sm_scale : -INFINITY;
  }
  float local_max = -INFINITY;
  for (int i = 0; i < kEntriesPerLane; ++i) local_max = fmaxf(local_max, score[i]);
  sm.lane_max[lane][head] = local_max;
  __syncthreads();

  // Online softmax: every lane of a head derives the same new max (same reads, same order).
  float tile_max = -INFINITY;
  for (int l = 0; l < kEntryLanes; ++l) tile_max = fmaxf(tile_max, sm.lane_max[l][head]);
  const float new_max = fmaxf(st.max, tile_max);
  const float alpha = new_max == st.max ? 1.0f : expf(st.max - new_max);  // -inf to finite: 0
  float lane_sum = 0.0f;
  for (int i = 0; i < kEntriesPerLane; ++i) {
    const float pr = score[i] == -INFINITY ? 0.0f : expf(score[i] - new_max);
    lane_sum += pr;
    sm.probs[lane + i * kEntryLanes][head] = round_bf16(pr);
  }
  sm.lane_sum[lane][head] = lane_sum;
  if (lane == 0) sm.alpha[head] = alpha;
  st.max = new_max;
  __syncthreads();

  float tile_sum = 0.0f;
  for (int l = 0; l < kEntryLanes; ++l) tile_sum += sm.lane_sum[l][head];
  st.sum = st.sum * alpha + tile_sum;

  // acc = acc * alpha + P V over the tile's entries, for value word t of every head.
  for (int h = 0; h < kHeadsPerCta; ++h) {
    const float a = sm.alpha[h];
    st.acc[h][0] *= a;
    st.acc[h][1] *= a;
  }
  for (int e = 0; e < kTileEntries; ++e) {
    const uint32_t vw = sm.keys[e][t];
    const float v0 = bf16_lo(vw), v1 = bf16_hi(vw);
    const float4* pr4 = reinterpret_cast<const float4*>(sm.probs[e]);
    for (int g = 0; g < kHeadsPerCta / 4; ++g) {
      const float4 pr = pr4[g];
      const float ps[4] = {pr.x, pr.y, pr.z, pr.w};
      for (int k = 0; k < 4; ++k) {
        st.acc[4 * g + k][0] = fmaf(ps[k], v0, st.acc[4 * g + k][0]);
        st.acc[4 * g + k][1] = fmaf(ps[k], v1, st.acc[4 * g + k][1]);
      }
    }
  }
}

// Publishes the query's final max and sum per head in sm.row_max / sm.row_sum for every thread.
DSV4_DEVICE void end_query(CtaShared& sm, const CtaState& st) {
  if (lane_of_thread() == 0) sm.row_max[head_of_thread()] = st.max, sm.row_sum[head_of_thread()] = st.sum;
  __syncthreads();
}

// Writes head h's (h < kHeadsPerCta) output row: final bf16 dims 2t, 2t + 1 (out_row: [d_v] bf16).
DSV4_DEVICE void store_output_dims(const CtaState& st, int h, float out_scale, uint16_t* out_row) {
  reinterpret_cast<uint32_t*>(out_row)[threadIdx.x] = scaled_bf16_pair(st.acc[h][0], st.acc[h][1], out_scale);
}

// Writes head h's fp32 partial dims 2t, 2t + 1 (row: [d_v] fp32).
DSV4_DEVICE void store_partial_dims(const CtaState& st, int h, float out_scale, float* row) {
  reinterpret_cast<float2*>(row)[threadIdx.x] = make_float2(st.acc[h][0] * out_scale, st.acc[h][1] * out_scale);
}

// Entries of bf16 rows [rows, d_qk] (row stride in elements): the prefill's kv.
struct Bf16RowSource {
  const uint16_t* kv;
  int64_t rows, row_stride;
  const void* indices;  // the query's column c at indices[query_offset + c * col_stride]
  bool is_int64;
  int64_t query_offset, col_stride;

  DSV4_DEVICE bool locate(int64_t column, EntryRef* e) const {
    const int64_t at = query_offset + column * col_stride;
    const int64_t row = load_index(indices, is_int64, at);
    if (row < 0 || row >= rows) return false;
    e->data = reinterpret_cast<const uint8_t*>(kv + row * row_stride);
    return true;
  }
  DSV4_DEVICE void chunk(const EntryRef& e, int c, uint32_t out[kChunkWords]) const {
    load_16_bytes(e.data + c * 2 * kChunkDims, out);
    load_16_bytes(e.data + c * 2 * kChunkDims + 16, out + 4);
  }
};

// Entries of one index set of a decode query (r, s) in a paged cache of the set's record (MODEL1, V32, V4.1 fp8 or
// fp4; main and extra sets may differ).
struct CacheEntrySource {
  SparseIndexSet set;  // a copy: pointers into kernel parameters would move them to local memory
  KvLayout layout;
  int64_t r, s;

  DSV4_DEVICE bool locate(int64_t column, EntryRef* e) const {
    return locate_entry(layout, set.cache, set_slot(set, r, s, column), e);
  }
  DSV4_DEVICE void chunk(const EntryRef& e, int c, uint32_t out[kChunkWords]) const {
    decode_entry_chunk(layout, e, c, out);
  }
};

}  // namespace dsv4::cuda::mla
