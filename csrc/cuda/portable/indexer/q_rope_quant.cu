// Indexer query: RoPE on dims [64, 128) (rounded to bf16), then per-(token, head) power-of-two fp8 quantization with
// the q scale folded into the head weight, or MXFP4 per 32 dims with the UE8M0 bytes beside the codes (the weight
// then carries no q scale). One warp per (token, head) row.
#include "cuda/launchers.h"
#include "cuda/portable/mxfp4.cuh"

namespace dsv4::cuda {
namespace {

__global__ void __launch_bounds__(kRowBlockThreads) indexer_q_rope_quant_kernel(IndexerQRopeQuantParams p) {
  constexpr int kSteps = lane_steps<kIndexerHeadDim>();
  const int64_t rows = p.num_tokens * p.num_heads;
  for (int64_t r = first_warp_row(); r < rows; r += warp_row_step()) {
    const int64_t t = r / p.num_heads, h = r - t * p.num_heads;
    const int64_t pos = index_at(p.positions, t);
    if (!rope_row_valid(p.rope, pos)) continue;  // no host check on CUDA: the row is left unwritten
    float x[kSteps];
    load_lanes(p.q, p.dtype, t * p.q_stride_t + h * p.q_stride_h, x);
    rope_lanes<kIndexerNopeDim>(x, p.rope, pos, 1.0f);
    round_lanes_bf16(x, kIndexerNopeDim / kWarpSize, kSteps);  // the NoPE half keeps q's values
    const float w = p.weights[t * p.w_stride_t + h];
    if (p.query_format == IndexerFormat::mxfp4) {
      mxfp4_store_lanes(p.q_fp8 + r * kIndexerFp4DataBytes, p.q_scale_out + r * kIndexerFp4ScaleBytes, x);
      if (lane_id() == 0) p.weights_out[r] = w * p.softmax_scale * p.head_scale;
      continue;
    }
    const int e = indexer_quantize_lanes(x, p.q_fp8 + r * kIndexerHeadDim);
    if (lane_id() == 0) p.weights_out[r] = w * exp2_int(e) * p.softmax_scale * p.head_scale;
  }
}

}  // namespace

cudaError_t launch_indexer_q_rope_quant(const IndexerQRopeQuantParams& p, cudaStream_t stream) {
  const int64_t rows = p.num_tokens * p.num_heads;
  if (rows <= 0) return cudaSuccess;
  indexer_q_rope_quant_kernel<<<grid_blocks(rows, kRowsPerBlock), kRowBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
