// Small helpers: request-local positions -> global slot ids through a block table (-1 for anything unmapped), and
// the inverse GPT-J RoPE of the attention output's last rope_dim dims.
#include "cuda/launchers.h"
#include "cuda/portable/warp_rows.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kElementThreads = 256;
constexpr int kRopeRowThreads = 128;  // one (token, head) row per CTA step: up to 576 dims

__global__ void __launch_bounds__(kElementThreads) map_local_to_global_slots_kernel(MapLocalToGlobalSlotsParams p) {
  const int64_t total = p.rows * p.cols;
  // The host cannot check the table here: an entry whose page of slots does not fit the output maps to -1 (the
  // bound the CPU checks tables against), computed once per thread.
  const int64_t max_page = ((p.out_is_int64 ? INT64_MAX : INT32_MAX) - (p.block_size - 1)) / p.block_size;
  for (int64_t i = int64_t(blockIdx.x) * kElementThreads + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kElementThreads) {
    const int64_t r = i / p.cols, c = i - r * p.cols;
    const int64_t req = index_at(p.req_ids, r), local = index_at(p.local, r, c);
    const int64_t block = local >= 0 ? local / p.block_size : -1;
    int64_t slot = -1;
    if (block >= 0 && block < p.max_blocks && req >= 0 && req < p.num_reqs) {
      const int64_t page = index_at(p.block_table, req, block);
      if (page >= 0 && page <= max_page) slot = page * p.block_size + local % p.block_size;
    }
    if (p.out_is_int64) static_cast<int64_t*>(p.out)[i] = slot;
    else static_cast<int32_t*>(p.out)[i] = int32_t(slot);
  }
}

__global__ void __launch_bounds__(kRopeRowThreads) inverse_rope_kernel(InverseRopeParams p) {
  const int64_t rows = p.num_tokens * p.num_heads, start = p.head_dim - p.rope.rope_dim, half = p.rope.rope_dim / 2;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = r / p.num_heads, h = r - t * p.num_heads;
    const int64_t pos = index_at(p.positions, t);
    if (!rope_row_valid(p.rope, pos)) continue;  // no host check on CUDA: the row is left unwritten
    const int64_t src = t * p.o_stride_t + h * p.o_stride_h;
    const float* cos_row = p.rope.data + pos * p.rope.row_stride;
    for (int64_t d = threadIdx.x; d < p.head_dim; d += kRopeRowThreads) {
      float v = load_f32(p.o, p.dtype, src + d);
      if (d >= start) {
        const int64_t k = d - start, i = k / 2;
        const float partner = load_f32(p.o, p.dtype, src + start + (k ^ 1));
        const float c = cos_row[i], s = -1.0f * cos_row[half + i];
        v = (k & 1) ? partner * s + v * c : v * c - partner * s;  // pair (2i, 2i + 1) rotated by -theta
      }
      store_f32(p.out, p.out_dtype, r * p.head_dim + d, v);
    }
  }
}

}  // namespace

cudaError_t launch_map_local_to_global_slots(const MapLocalToGlobalSlotsParams& p, cudaStream_t stream) {
  const int64_t total = p.rows * p.cols;
  if (total <= 0) return cudaSuccess;
  map_local_to_global_slots_kernel<<<grid_blocks(total, kElementThreads), kElementThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_inverse_rope(const InverseRopeParams& p, cudaStream_t stream) {
  const int64_t rows = p.num_tokens * p.num_heads;
  if (rows <= 0 || p.head_dim <= 0) return cudaSuccess;
  inverse_rope_kernel<<<grid_blocks(rows, 1), kRopeRowThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
