// Lightning-indexer scoring shared by fp8_paged_mqa_logits, fp8_mqa_logits and the fused fp8_paged_mqa_topk:
// a CTA holds a tile of keys decoded to bf16 (exact for e4m3 and for MXFP4, whose keys then have scale 1) in shared
// memory, the query heads decoded to fp32 (e4m3, or MXFP4 with its UE8M0 bytes), and one thread scores one key,
// total = sum_h w[h] * relu(<q[h], k>), each head dot an fmaf chain over the dims in order and the heads summed in
// order. Every op runs this same per-key arithmetic, so the fused op reproduces the unfused logits bit for bit.
#pragma once
#include "cuda/portable/mxfp4.cuh"

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

// Two bytes at p (first in the low byte): one 16-bit load where the address allows it.
DSV4_DEVICE uint32_t load_bytes2(const uint8_t* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const uint16_t*>(p);
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8);
}

// Key t of the tile: dims [4c, 4c + 4) of key t live at keys[c * tile_keys + t]; a null key stores zeros.
DSV4_DEVICE void store_key_quad(uint2* keys, int tile_keys, int t, int c, const uint8_t* key, bool aligned) {
  keys[c * tile_keys + t] = key ? e4m3x4_to_bf16x4(load_bytes4(key + 4 * c, aligned)) : make_uint2(0u, 0u);
}

// The same for an mxfp4 key (codes two per byte) under `scale`, the UE8M0 byte of the block dims 4c.. lie in.
DSV4_DEVICE void store_mxfp4_key_quad(uint2* keys, int tile_keys, int t, int c, const uint8_t* codes, uint8_t scale,
                                      bool aligned) {
  keys[c * tile_keys + t] = codes ? mxfp4x4_to_bf16x4(load_bytes2(codes + 2 * c, aligned), scale) : make_uint2(0u, 0u);
}

// The block of 32 dims a key quad's dims lie in.
DSV4_DEVICE int quad_block(int c) { return 4 * c / kMxfp4Block; }

// One query row: its heads stride_h bytes apart, e4m3 codes (scales null) or mxfp4 codes (dim / 2 bytes per head)
// with their UE8M0 bytes (dim / 32 per head, heads scale_stride_h apart).
struct QueryRow {
  const uint8_t* codes;
  int64_t stride_h;
  const uint8_t* scales = nullptr;
  int64_t scale_stride_h = 0;
};

// Row `row` of a contiguous [rows, heads, dim] query (mxfp4: [rows, heads, dim / 2] with q_scale contiguous
// [rows, heads, dim / 32]; q_scale null for e4m3).
DSV4_DEVICE QueryRow contiguous_query_row(const uint8_t* q, const uint8_t* q_scale, int64_t row, int64_t heads,
                                          int64_t dim) {
  if (q_scale == nullptr) return {q + row * heads * dim, dim};
  const int64_t scale_bytes = dim / kMxfp4Block;
  return {q + row * heads * (dim / 2), dim / 2, q_scale + row * heads * scale_bytes, scale_bytes};
}

// Dim d of head h of a query row, in fp32 (exact).
DSV4_DEVICE float query_value(const QueryRow& q, int64_t h, int d) {
  const uint8_t* head = q.codes + h * q.stride_h;
  if (q.scales == nullptr) return e4m3_to_f32(head[d]);
  const uint32_t pair = head[d / 2];
  return mxfp4_value((d & 1) ? pair >> 4 : pair & 0xfu, q.scales[h * q.scale_stride_h + d / kMxfp4Block]);
}

// Decodes heads [h0, h0 + kScoreHeadChunk) of a query row (zeros past the last head) into q [head][dim].
DSV4_DEVICE void load_query_chunk(float* q, const QueryRow& row, int64_t heads, int64_t h0, int64_t dim) {
  for (int hh = 0; hh < kScoreHeadChunk; ++hh) {
    for (int d = threadIdx.x; d < dim; d += blockDim.x)
      q[hh * dim + d] = h0 + hh < heads ? query_value(row, h0 + hh, d) : 0.0f;
  }
}

// sum_h w[h] * relu(<q[h], key t>) for the key of this thread (when active); called by every thread of the CTA
// after the key tile is stored (the first barrier here publishes it). Leaves the tile in use: callers put a barrier
// before overwriting it.
template <int MaxDim>
__device__ float score_tile_key(ScoreTile<MaxDim>& tile, int tile_keys, bool active, const QueryRow& q_row,
                                const float* w_row, int64_t heads, int64_t dim) {
  const int t = threadIdx.x, quads = int(dim / 4);
  float total = 0.0f;
  for (int64_t h0 = 0; h0 < heads; h0 += kScoreHeadChunk) {
    __syncthreads();  // the previous chunk is consumed; the key tile is stored
    load_query_chunk(reinterpret_cast<float*>(tile.q), q_row, heads, h0, dim);
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

// ---- paged indexer K cache: per page, each entry's data bytes (head_dim e4m3, or head_dim / 2 bytes of e2m1
// pairs), then each entry's 4 scale bytes (one fp32, or one UE8M0 byte per 32 dims) ----

// Byte offset of position pos of request row `request` in the cache (entries of data_bytes), or -1 when its page is
// missing; scale_at receives the byte offset of its 4 scale bytes.
DSV4_DEVICE int64_t paged_key_offset(const PagedCache& cache, const IndexView& table, int64_t request,
                                     int64_t max_blocks, int64_t data_bytes, int64_t pos, int64_t& scale_at) {
  const int64_t page_index = pos / cache.block_size;
  const int64_t block = page_index < max_blocks ? index_at(table, request, page_index) : -1;
  if (block < 0 || block >= cache.num_blocks) return -1;
  const int64_t entry = pos - page_index * cache.block_size, page = block * cache.block_stride;
  scale_at = page + cache.block_size * data_bytes + kIndexerScaleBytes * entry;
  return page + entry * data_bytes;
}

// Valid length of row (b, j): [b, next_n] lens as given, [b] lens by the causal MTP rule; in [0, max_context_len].
DSV4_DEVICE int64_t paged_row_length(const PagedMqaLogitsParams& p, int64_t b, int64_t j) {
  const int64_t given = p.lens_per_row ? index_at(p.context_lens, b, j) : index_at(p.context_lens, b);
  if (given <= 0) return 0;  // also keeps the MTP rule below from wrapping around for a huge negative length
  const int64_t len = p.lens_per_row ? given : given - p.next_n + j + 1;
  return len < 0 ? 0 : (len > p.max_context_len ? p.max_context_len : len);
}

// Shared state of a paged scoring CTA: the tile, the cache offset of each of its keys and (mxfp4 keys) each key's
// 4 UE8M0 bytes, first in the low byte.
struct PagedScoreShared {
  ScoreTile<kIndexerHeadDim> tile;
  int64_t offsets[kScoreThreads];
  uint32_t mxfp4_scales[kScoreThreads];
};

// Stores keys [t0, t0 + kScoreThreads) of a request (positions at or past key_end, or on missing pages, are absent)
// and returns this thread's key offset (-1: absent) with its scale (1 for mxfp4 keys: their block scales are in the
// decoded tile). Opens with a barrier: the previous tile is free. Pages must be on 4-byte boundaries for `aligned`.
DSV4_DEVICE int64_t load_paged_tile(PagedScoreShared& s, const PagedCache& cache, IndexerFormat format,
                                    const IndexView& table, int64_t request, bool request_valid, int64_t max_blocks,
                                    int64_t dim, int64_t t0, int64_t key_end, bool aligned, float& scale) {
  __syncthreads();
  const bool fp4 = format == IndexerFormat::mxfp4;
  const int t = threadIdx.x;
  const int64_t pos = t0 + t;
  int64_t scale_at = 0;
  const int64_t offset = request_valid && pos < key_end
                             ? paged_key_offset(cache, table, request, max_blocks, fp4 ? dim / 2 : dim, pos, scale_at)
                             : -1;
  const uint32_t scale_bytes = offset >= 0 ? load_bytes4(cache.base + scale_at, aligned) : 0u;
  scale = offset < 0 ? 0.0f : (fp4 ? 1.0f : __uint_as_float(scale_bytes));
  s.offsets[t] = offset;
  s.mxfp4_scales[t] = scale_bytes;
  __syncthreads();
  const int quads = int(dim / 4);
  for (int i = t; i < kScoreThreads * quads; i += kScoreThreads) {
    const int key = i / quads, c = i - key * quads;
    const int64_t at = s.offsets[key];
    const uint8_t* bytes = at >= 0 ? cache.base + at : nullptr;
    if (fp4)
      store_mxfp4_key_quad(s.tile.keys, kScoreThreads, key, c, bytes,
                           uint8_t(s.mxfp4_scales[key] >> (8 * quad_block(c))), aligned);
    else
      store_key_quad(s.tile.keys, kScoreThreads, key, c, bytes, aligned);
  }
  return offset;
}

}  // namespace dsv4::cuda
