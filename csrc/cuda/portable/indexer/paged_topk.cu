// Fused prefill indexer, portable tier: CTA c scores rows c, c + workspace_rows, ... one at a time into its fp32
// workspace row (the per-key arithmetic of fp8_paged_mqa_logits, so the scores are bit-identical) and runs the CTA
// top-k of topk_transform on it. Rows of length <= k need no scores: 0 .. L-1 then -1. With `scored`, another tier
// has already written the scores of rows 0 .. workspace_rows - 1 and only the select runs.
#include <algorithm>

#include "cuda/launchers.h"
#include "cuda/portable/indexer/score.cuh"
#include "cuda/portable/topk.cuh"

namespace dsv4::cuda {
namespace {

static_assert(topk_threads_supported(kScoreThreads), "the CTA top-k's thread count");

union PagedTopkShared {
  PagedScoreShared score;
  TopkShared topk;
};

__global__ void __launch_bounds__(kScoreThreads, 1)
    paged_mqa_topk_kernel(PagedMqaTopkParams p, bool aligned, bool scored) {
  __shared__ PagedTopkShared s;
  const int t = threadIdx.x;
  // Scored rows are bounded by the workspace: what the block table addresses (and int32 raw indices).
  const int64_t width = std::min<int64_t>(p.max_blocks * p.cache.block_size, INT32_MAX);
  float* scores = p.workspace + blockIdx.x * p.max_blocks * p.cache.block_size;
  for (int64_t row = blockIdx.x; row < p.rows; row += p.workspace_rows) {
    int32_t* out = p.out + row * p.out_stride;
    const int64_t requested = index_at(p.lengths, row);
    const int64_t length = requested > p.k ? std::min(requested, width) : std::max<int64_t>(requested, 0);
    if (length <= p.k) {  // uniform over the CTA
      for (int64_t j = t; j < p.k; j += blockDim.x) out[j] = j < length ? int32_t(j) : -1;
      continue;
    }
    const int64_t request = index_at(p.row_requests, row);
    const bool request_valid = request >= 0 && request < p.num_requests;  // else every page is missing: -inf
    const QueryRow q_row = contiguous_query_row(p.q, p.q_scale, row, p.num_heads, p.head_dim);
    const float* w_row = p.weights + row * p.w_stride;
    for (int64_t t0 = 0; !scored && t0 < length; t0 += kScoreThreads) {
      const int64_t pos = t0 + t;
      float scale = 0.0f;
      const int64_t offset = load_paged_tile(s.score, p.cache, p.key_format, p.block_table, request, request_valid,
                                             p.max_blocks, p.head_dim, t0, length, aligned, scale);
      const float total = score_tile_key(s.score.tile, kScoreThreads, offset >= 0, q_row, w_row, p.num_heads,
                                         p.head_dim);
      if (pos < length) scores[pos] = offset >= 0 ? total * scale : -INFINITY;
    }
    __syncthreads();  // the scores are complete and visible; the scoring tile is free for the select
    topk_select_sorted(s.topk, scores, length, int(p.k));
    for (int64_t j = t; j < p.k; j += blockDim.x) out[j] = int32_t(topk_pair_index(s.topk.pairs[j]));
    __syncthreads();  // the pairs are read before the next row's scoring overwrites them
  }
}

}  // namespace

cudaError_t launch_fp8_paged_mqa_topk(const PagedMqaTopkParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.workspace_rows <= 0) return cudaSuccess;
  paged_mqa_topk_kernel<<<unsigned(p.workspace_rows), kScoreThreads, 0, stream>>>(p, pages_aligned(p.cache, 4), false);
  return cudaGetLastError();
}

cudaError_t launch_fp8_paged_mqa_topk_select(const PagedMqaTopkParams& p, cudaStream_t stream) {
  if (p.rows <= 0 || p.rows > p.workspace_rows) return p.rows <= 0 ? cudaSuccess : cudaErrorInvalidValue;
  paged_mqa_topk_kernel<<<unsigned(p.rows), kScoreThreads, 0, stream>>>(p, true, true);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
