// Lightning-indexer logits, portable tier: fp8_paged_mqa_logits (decode, paged keys) and fp8_mqa_logits (prefill,
// ragged key ranges), over fp8 or MXFP4 keys with e4m3 or MXFP4 queries. A CTA owns one tile of keys, decoded once
// to shared memory and scored against every query row that sees it (the next_n rows of a request, or a block of
// ragged rows); one thread scores one key.
#include <algorithm>

#include "cuda/launchers.h"
#include "cuda/portable/indexer/score.cuh"

namespace dsv4::cuda {
namespace {

constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 65535;  // within every platform's limits; the kernels stride over the rest
constexpr int64_t kRaggedRowBlock = 16;  // ragged rows sharing one decoded key tile

__global__ void __launch_bounds__(kScoreThreads) paged_mqa_logits_kernel(PagedMqaLogitsParams p, bool aligned) {
  __shared__ PagedScoreShared s;
  const int t = threadIdx.x;
  const int64_t tiles = (p.max_context_len + kScoreThreads - 1) / kScoreThreads;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t t0 = tile * kScoreThreads, pos = t0 + t;
    const int64_t tile_end = std::min(t0 + kScoreThreads, p.max_context_len);
    for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
      int64_t longest = 0;
      for (int64_t j = 0; j < p.next_n; ++j) longest = std::max(longest, paged_row_length(p, b, j));
      if (longest <= t0 && !p.clean_logits) continue;  // uniform: nothing to score or write
      float scale = 0.0f;
      const int64_t offset = load_paged_tile(s, p.cache, p.key_format, p.block_table, b, true, p.max_blocks,
                                             p.head_dim, t0, std::min(tile_end, longest), aligned, scale);
      for (int64_t j = 0; j < p.next_n; ++j) {
        const int64_t row = b * p.next_n + j, len = paged_row_length(p, b, j);
        float logit = -INFINITY;
        if (len > t0) {  // uniform over the CTA: every thread takes part in the scoring barriers
          const float total = score_tile_key(s.tile, kScoreThreads, offset >= 0 && pos < len,
                                             contiguous_query_row(p.q, p.q_scale, row, p.num_heads, p.head_dim),
                                             p.weights + row * p.w_stride, p.num_heads, p.head_dim);
          if (offset >= 0) logit = total * scale;
        }
        // Positions of missing pages inside the valid range are -inf in both modes; past it only when cleaning.
        if (pos < tile_end && (pos < len || p.clean_logits))
          p.out[row * p.out_stride + pos] = pos < len ? logit : -INFINITY;
      }
    }
  }
}

// Row `row` of the ragged op's strided query (and of its scale bytes, for mxfp4 queries).
DSV4_DEVICE QueryRow ragged_query_row(const MqaLogitsParams& p, int64_t row) {
  if (p.q_scale == nullptr) return {p.q + row * p.q_stride_m, p.q_stride_h};
  return {p.q + row * p.q_stride_m, p.q_stride_h, p.q_scale + row * p.q_scale_stride_m, p.q_scale_stride_h};
}

__global__ void __launch_bounds__(kScoreThreads) mqa_logits_kernel(MqaLogitsParams p, bool aligned) {
  __shared__ ScoreTile<kScoreMaxDim> tile;
  const int t = threadIdx.x;
  const int tile_keys = score_tile_keys(p.head_dim), quads = int(p.head_dim / 4);
  const bool fp4 = p.key_format == IndexerFormat::mxfp4;
  const int64_t tiles = (p.num_keys + tile_keys - 1) / tile_keys;
  const int64_t row_blocks = (p.rows + kRaggedRowBlock - 1) / kRaggedRowBlock;
  for (int64_t tile_index = blockIdx.x; tile_index < tiles; tile_index += gridDim.x) {
    const int64_t c0 = tile_index * tile_keys, c1 = std::min(c0 + tile_keys, p.num_keys), col = c0 + t;
    const bool own_col = t < tile_keys && col < c1;
    const float scale = own_col ? (fp4 ? 1.0f : p.k_scale[col]) : 0.0f;  // mxfp4: block scales in the tile
    for (int64_t block = blockIdx.y; block < row_blocks; block += gridDim.y) {
      const int64_t r0 = block * kRaggedRowBlock, r1 = std::min(r0 + kRaggedRowBlock, p.rows);
      int64_t lo = c1, hi = c0;  // union of the block's ranges inside the tile: only those keys are decoded
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t ks = std::max(index_at(p.ks, row), c0), ke = std::min(index_at(p.ke, row), c1);
        if (ks < ke) lo = std::min(lo, ks), hi = std::max(hi, ke);
      }
      if (lo >= hi && !p.clean_logits) continue;  // uniform: nothing to score or write
      __syncthreads();  // the previous block's scoring is done with the tile
      for (int i = t; i < tile_keys * quads; i += blockDim.x) {
        const int key = i / quads, c = i - key * quads;
        const int64_t k = c0 + key;
        const uint8_t* bytes = k >= lo && k < hi ? p.k + k * p.k_stride : nullptr;
        if (fp4)
          store_mxfp4_key_quad(tile.keys, tile_keys, key, c, bytes,
                               bytes ? p.k_scale_ue8m0[k * p.k_scale_stride + quad_block(c)] : uint8_t(0), aligned);
        else
          store_key_quad(tile.keys, tile_keys, key, c, bytes, aligned);
      }
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t ks = index_at(p.ks, row), ke = index_at(p.ke, row);
        const bool inside = own_col && col >= ks && col < ke;
        float logit = -INFINITY;
        if (std::max(ks, c0) < std::min(ke, c1)) {  // uniform over the CTA
          logit = score_tile_key(tile, tile_keys, inside, ragged_query_row(p, row), p.weights + row * p.w_stride,
                                 p.num_heads, p.head_dim) * scale;
        }
        if (own_col && (inside || p.clean_logits)) p.out[row * p.out_stride + col] = inside ? logit : -INFINITY;
      }
    }
  }
}

}  // namespace

cudaError_t launch_fp8_paged_mqa_logits(const PagedMqaLogitsParams& p, cudaStream_t stream) {
  if (p.batch * p.next_n <= 0 || p.max_context_len <= 0) return cudaSuccess;
  const dim3 grid(unsigned(std::min(ceil_div(p.max_context_len, kScoreThreads), kMaxGridX)),
                  unsigned(std::min(p.batch, kMaxGridY)));
  paged_mqa_logits_kernel<<<grid, kScoreThreads, 0, stream>>>(p, pages_aligned(p.cache, 4));
  return cudaGetLastError();
}

cudaError_t launch_fp8_mqa_logits(const MqaLogitsParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.num_keys <= 0) return cudaSuccess;
  const int64_t tile_keys = score_tile_keys(p.head_dim);
  const dim3 grid(unsigned(std::min(ceil_div(p.num_keys, tile_keys), kMaxGridX)),
                  unsigned(std::min(ceil_div(p.rows, kRaggedRowBlock), kMaxGridY)));
  // Key words are 4 code bytes (e4m3) or 2 (mxfp4: a quad's two code bytes).
  const uintptr_t word = p.key_format == IndexerFormat::mxfp4 ? 2 : 4;
  mqa_logits_kernel<<<grid, kScoreThreads, 0, stream>>>(p, rows_aligned(p.k, p.k_stride, word));
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
