// Lightning-indexer scoring shared by fp8_paged_mqa_logits, fp8_mqa_logits and the fused fp8_paged_mqa_topk:
// a CTA holds a tile of keys decoded to bf16 (exact for e4m3) in shared memory and one thread scores one key,
// total = sum_h w[h] * relu(<q[h], k>), each head dot an fmaf chain over the dims in order and the heads summed in
// order. Every op runs this same per-key arithmetic, so the fused op reproduces the unfused logits bit for bit.
#pragma once
#include "cuda/portable/common.cuh"

namespace dsv4::cuda {

constexpr int kScoreThreads = 128;  // threads of a scoring CTA; one key per thread
constexpr int kScoreHeadChunk = 16;  // query heads decoded to shared memory at a time (one accumulator each)
constexpr int kScoreKeyQuads = 4096;  // bf16x4 key words a tile holds: 128 keys of 128 dims, or 64 of 256
constexpr int kScoreMaxDim = 256;  // widest head dim of fp8_mqa_logits

// Key tile of bf16x4 words [dim / 4][keys] and one chunk of query heads in fp32 [head][dim], for dims up to MaxDim.
template <int MaxDim>
struct ScoreTile {
  uint2 keys[kScoreKeyQuads];
  float4 q[kScoreHeadChunk * MaxDim / 4];
};

// Keys a tile holds for a head dim (one thread each).
__host__ __device__ inline int score_tile_keys(int64_t dim) {
  return int(dim <= 128 ? 128 : kScoreKeyQuads * 4 / dim);
}

// Four e4m3 codes (first in the low byte) as four bf16 values: dims 0, 1 in .x (low half first), 2, 3 in .y.
DSV4_DEVICE uint2 e4m3x4_to_bf16x4(uint32_t codes) {
  uint32_t h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __float_as_uint(e4m3_to_f32(uint8_t(codes >> (8 * i)))) >> 16;
  return make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
}

// Four bytes at p (first in the low byte): one word load where the address allows it.
DSV4_DEVICE uint32_t load_bytes4(const uint8_t* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const uint32_t*>(p);
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

DSV4_DEVICE float load_f32_bytes(const uint8_t* p, bool aligned) { return __uint_as_float(load_bytes4(p, aligned)); }

// Key t of the tile: dims [4c, 4c + 4) of key t live at keys[c * tile_keys + t].
DSV4_DEVICE void store_key_quad(uint2* keys, int tile_keys, int t, int c, const uint8_t* key, bool aligned) {
  keys[c * tile_keys + t] = key ? e4m3x4_to_bf16x4(load_bytes4(key + 4 * c, aligned)) : make_uint2(0u, 0u);
}

// Decodes heads [h0, h0 + kScoreHeadChunk) of a query row (zeros past the last head) into q [head][dim].
DSV4_DEVICE void load_query_chunk(float* q, const uint8_t* row, int64_t stride_h, int64_t heads, int64_t h0,
                                  int64_t dim) {
  for (int hh = 0; hh < kScoreHeadChunk; ++hh) {
    const uint8_t* head = row + (h0 + hh) * stride_h;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) q[hh * dim + d] = h0 + hh < heads ? e4m3_to_f32(head[d]) : 0.0f;
  }
}

// sum_h w[h] * relu(<q[h], key t>) for the key of this thread (when active); called by every thread of the CTA
// after the key tile is stored (the first barrier here publishes it). Leaves the tile in use: callers put a barrier
// before overwriting it.
template <int MaxDim>
__device__ float score_tile_key(ScoreTile<MaxDim>& tile, int tile_keys, bool active, const uint8_t* q_row,
                                int64_t q_stride_h, const float* w_row, int64_t heads, int64_t dim) {
  const int t = threadIdx.x, quads = int(dim / 4);
  float total = 0.0f;
  for (int64_t h0 = 0; h0 < heads; h0 += kScoreHeadChunk) {
    __syncthreads();  // the previous chunk is consumed; the key tile is stored
    load_query_chunk(reinterpret_cast<float*>(tile.q), q_row, q_stride_h, heads, h0, dim);
    __syncthreads();
    if (!active) continue;
    float acc[kScoreHeadChunk];
#pragma unroll
    for (int hh = 0; hh < kScoreHeadChunk; ++hh) acc[hh] = 0.0f;
    for (int c = 0; c < quads; ++c) {
      const uint2 kw = tile.keys[c * tile_keys + t];
      const float k0 = __uint_as_float(kw.x << 16), k1 = __uint_as_float(kw.x & 0xffff0000u);
      const float k2 = __uint_as_float(kw.y << 16), k3 = __uint_as_float(kw.y & 0xffff0000u);
#pragma unroll
      for (int hh = 0; hh < kScoreHeadChunk; ++hh) {
        const float4 qv = tile.q[hh * quads + c];
        acc[hh] = fmaf(qv.w, k3, fmaf(qv.z, k2, fmaf(qv.y, k1, fmaf(qv.x, k0, acc[hh]))));
      }
    }
#pragma unroll
    for (int hh = 0; hh < kScoreHeadChunk; ++hh) {
      if (h0 + hh < heads) total += w_row[h0 + hh] * (acc[hh] > 0.0f ? acc[hh] : 0.0f);  // NaN dots count 0
    }
  }
  return total;
}

// ---- paged indexer K cache: head_dim e4m3 bytes per entry, then one fp32 scale per entry, per page ----

// Byte offset of position pos of request row `request` in the cache, or -1 when its page is missing; scale_at
// receives the byte offset of its fp32 scale.
DSV4_DEVICE int64_t paged_key_offset(const PagedCache& cache, const IndexView& table, int64_t request,
                                     int64_t max_blocks, int64_t dim, int64_t pos, int64_t& scale_at) {
  const int64_t page_index = pos / cache.block_size;
  const int64_t block = page_index < max_blocks ? index_at(table, request, page_index) : -1;
  if (block < 0 || block >= cache.num_blocks) return -1;
  const int64_t entry = pos - page_index * cache.block_size, page = block * cache.block_stride;
  scale_at = page + cache.block_size * dim + 4 * entry;
  return page + entry * dim;
}

// Valid length of row (b, j): [b, next_n] lens as given, [b] lens by the causal MTP rule; in [0, max_context_len].
DSV4_DEVICE int64_t paged_row_length(const PagedMqaLogitsParams& p, int64_t b, int64_t j) {
  const int64_t given = p.lens_per_row ? index_at(p.context_lens, b, j) : index_at(p.context_lens, b);
  if (given <= 0) return 0;  // also keeps the MTP rule below from wrapping around for a huge negative length
  const int64_t len = p.lens_per_row ? given : given - p.next_n + j + 1;
  return len < 0 ? 0 : (len > p.max_context_len ? p.max_context_len : len);
}

// Shared state of a paged scoring CTA: the tile and the cache offset of each of its keys.
struct PagedScoreShared {
  ScoreTile<128> tile;
  int64_t offsets[kScoreThreads];
};

// Stores keys [t0, t0 + kScoreThreads) of a request (positions at or past key_end, or on missing pages, are absent)
// and returns this thread's key offset (-1: absent) with its scale. Opens with a barrier: the previous tile is free.
DSV4_DEVICE int64_t load_paged_tile(PagedScoreShared& s, const PagedCache& cache, const IndexView& table,
                                    int64_t request, bool request_valid, int64_t max_blocks, int64_t dim, int64_t t0,
                                    int64_t key_end, bool aligned, float& scale) {
  __syncthreads();
  const int t = threadIdx.x;
  const int64_t pos = t0 + t;
  int64_t scale_at = 0;
  const int64_t offset =
      request_valid && pos < key_end ? paged_key_offset(cache, table, request, max_blocks, dim, pos, scale_at) : -1;
  scale = offset >= 0 ? load_f32_bytes(cache.base + scale_at, aligned) : 0.0f;
  s.offsets[t] = offset;
  __syncthreads();
  const int quads = int(dim / 4);
  for (int i = t; i < kScoreThreads * quads; i += kScoreThreads) {
    const int key = i / quads, c = i - key * quads;
    const int64_t at = s.offsets[key];
    store_key_quad(s.tile.keys, kScoreThreads, key, c, at >= 0 ? cache.base + at : nullptr, aligned);
  }
  return offset;
}

}  // namespace dsv4::cuda
