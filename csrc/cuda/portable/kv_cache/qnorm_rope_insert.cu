// Fused SWA step: q heads RMS-normalized (no weight; V4.0 only, p.q_norm) and rotated into q_out (padded heads
// exactly 0), kv rows rotated and quantized into the cache's record (MODEL1, V4.1 fp8 or fp4). One warp per q head
// row, one warp per kv row.
#include "cuda/launchers.h"
#include "cuda/portable/records.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kSteps = lane_steps<kModel1HeadDim>();

__global__ void __launch_bounds__(kRowBlockThreads) qnorm_rope_kernel(QNormRopeKvInsertParams p) {
  const int64_t rows = p.num_tokens * p.padded_heads;
  for (int64_t r = first_warp_row(); r < rows; r += warp_row_step()) {
    const int64_t t = r / p.padded_heads, h = r - t * p.padded_heads;
    float x[kSteps];
    if (h >= p.num_heads) {
      for (float& v : x) v = 0.0f;
      store_lanes(p.q_out, p.dtype, r * kModel1HeadDim, x);
      continue;
    }
    const int64_t pos = index_at(p.positions, t);
    if (!rope_row_valid(p.rope, pos)) continue;  // no host check on CUDA: the row is left unwritten
    load_lanes(p.q, p.dtype, t * p.q_stride_t + h * p.q_stride_h, x);
    if (p.q_norm) {
      const float inv_rms = 1.0f / sqrtf(warp_sum_squares(x) / float(kModel1HeadDim) + p.eps);
#pragma unroll
      for (int j = 0; j < kSteps; ++j) x[j] *= inv_rms;
    }
    rope_lanes<kModel1NopeDim>(x, p.rope, pos, 1.0f);
    store_lanes(p.q_out, p.dtype, r * kModel1HeadDim, x);
  }
}

template <KvLayout kLayout>
__global__ void __launch_bounds__(kRowBlockThreads) kv_rope_insert_kernel(QNormRopeKvInsertParams p) {
  for (int64_t t = first_warp_row(); t < p.num_kv_tokens; t += warp_row_step()) {
    const int64_t pos = index_at(p.positions, t);
    const EntryBytes e = dsv4::slot_entry(kLayout, p.cache, index_at(p.slots, t));
    if (!e.data || !rope_row_valid(p.rope, pos)) continue;
    float x[kSteps];
    load_lanes(p.kv, p.dtype, t * p.kv_stride_t, x);
    round_lanes_bf16(x, 0, kModel1NopeDim / kWarpSize);  // the RoPE dims rotate un-rounded
    rope_lanes<kModel1NopeDim>(x, p.rope, pos, 1.0f);
    if constexpr (kLayout != KvLayout::model1) round_lanes_bf16(x, kModel1NopeDim / kWarpSize, kSteps);
    record512_store_lanes(kLayout, e, x);
  }
}

}  // namespace

cudaError_t launch_qnorm_rope_kv_insert(const QNormRopeKvInsertParams& p, cudaStream_t stream) {
  const int64_t q_rows = p.num_tokens * p.padded_heads;
  if (q_rows > 0) qnorm_rope_kernel<<<grid_blocks(q_rows, kRowsPerBlock), kRowBlockThreads, 0, stream>>>(p);
  if (p.num_kv_tokens > 0) {
    const unsigned blocks = grid_blocks(p.num_kv_tokens, kRowsPerBlock);
    if (p.layout == KvLayout::v41_fp8)
      kv_rope_insert_kernel<KvLayout::v41_fp8><<<blocks, kRowBlockThreads, 0, stream>>>(p);
    else if (p.layout == KvLayout::v41_fp4)
      kv_rope_insert_kernel<KvLayout::v41_fp4><<<blocks, kRowBlockThreads, 0, stream>>>(p);
    else
      kv_rope_insert_kernel<KvLayout::model1><<<blocks, kRowBlockThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
