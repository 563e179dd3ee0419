// topk_transform, portable tier: one CTA per row. Rows of length <= k give 0 .. L-1 then -1 without reading their
// scores; longer rows run the CTA top-k of topk.cuh. Raw indices are relative to the row start; slot ids go through
// the page table.
#include <algorithm>

#include "cuda/launchers.h"
#include "cuda/portable/topk.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kTopkThreads = 512;
static_assert(topk_threads_supported(kTopkThreads), "the CTA top-k's thread count");
constexpr int64_t kMaxGrid = 65535;  // within every platform's limits; the kernel strides over the rest

// The largest table entry whose whole page of slots fits in int32 (the bound the CPU checks tables against).
DSV4_DEVICE int64_t topk_max_block(const TopkTransformParams& p) {
  return p.slots ? (INT32_MAX - (p.page_size - 1)) / p.page_size : 0;
}

// table[i / page_size] * page_size + i % page_size for raw index i; -1 for i < 0, a page past the table, a
// negative entry or an entry past max_block (the CPU rejects such tables; the device cannot read them first).
DSV4_DEVICE int32_t topk_slot(const TopkTransformParams& p, int64_t row, int32_t raw, int64_t max_block) {
  if (raw < 0) return -1;
  const int64_t page = raw / p.page_size;
  if (page >= p.max_pages) return -1;
  const int64_t block = index_at(p.page_table, row, page);
  return block >= 0 && block <= max_block ? int32_t(block * p.page_size + (raw - page * p.page_size)) : -1;
}

DSV4_DEVICE void topk_write(const TopkTransformParams& p, int64_t row, int64_t j, int32_t raw, int64_t max_block) {
  p.raw[row * p.raw_stride + j * p.raw_col_stride] = raw;
  if (p.slots) p.slots[row * p.slot_stride + j * p.slot_col_stride] = topk_slot(p, row, raw, max_block);
}

__global__ void __launch_bounds__(kTopkThreads, 1) topk_transform_kernel(TopkTransformParams p) {
  __shared__ TopkShared s;
  const int64_t max_block = topk_max_block(p);  // once per thread, not per slot
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t start = p.row_starts.data ? std::clamp<int64_t>(index_at(p.row_starts, row), 0, p.width) : 0;
    const int64_t room = std::min<int64_t>(p.width - start, INT32_MAX);  // raw indices are int32
    const float* scores = p.scores + row * p.score_stride + start;
    TopkHeldKeys held;
    held.load(scores, room);  // issued before the length arrives; unused for rows of length <= k
    const int64_t length = std::clamp<int64_t>(index_at(p.lengths, row), 0, room);
    if (length <= p.k) {  // uniform over the CTA
      for (int64_t j = threadIdx.x; j < p.k; j += blockDim.x) topk_write(p, row, j, j < length ? int32_t(j) : -1, max_block);
      continue;
    }
    if (length <= topk_held_capacity()) {
      topk_select_sorted(s, held, scores, length, int(p.k));
    } else {
      topk_select_sorted(s, scores, length, int(p.k));
    }
    for (int64_t j = threadIdx.x; j < p.k; j += blockDim.x) topk_write(p, row, j, int32_t(topk_pair_index(s.pairs[j])), max_block);
    __syncthreads();  // the pairs are read before the next row's select overwrites them
  }
}

}  // namespace

cudaError_t launch_topk_transform(const TopkTransformParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  topk_transform_kernel<<<unsigned(std::min(p.rows, kMaxGrid)), kTopkThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
