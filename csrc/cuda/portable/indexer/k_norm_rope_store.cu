// DeepSeek-V4.1's index key writer: per group-closing token, weighted RMSNorm (the sum of squares in float64, exact
// for bf16 inputs, so it matches the CPU kernels and the reference bit for bit), RoPE on dims [64, 128) at the
// group's first position, each rounded to bf16, then the fp8 or MXFP4 key. One warp per token.
#include "cuda/launchers.h"
#include "cuda/portable/mxfp4.cuh"

namespace dsv4::cuda {
namespace {

DSV4_DEVICE double warp_sum_f64(double v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += warp_xor(v, m);
  return v;
}

__global__ void __launch_bounds__(kRowBlockThreads) indexer_k_norm_rope_store_kernel(IndexerKNormRopeStoreParams p) {
  constexpr int kSteps = lane_steps<kIndexerHeadDim>();
  for (int64_t t = first_warp_row(); t < p.num_tokens; t += warp_row_step()) {
    const int64_t pos = index_at(p.positions, t);
    if (!rope_row_valid(p.rope, pos) || (pos + 1) % p.ratio != 0) continue;  // no host check on CUDA
    const IndexerKeyBytes entry = indexer_key_entry(p.key_format, p.cache, index_at(p.slots, t));
    if (entry.data == nullptr) continue;
    float x[kSteps];
    load_lanes(p.k_pre, DType::bf16, t * p.k_stride, x);
    double squares = 0.0;
#pragma unroll
    for (int j = 0; j < kSteps; ++j) squares += double(x[j]) * double(x[j]);
    const float inv_rms = float(1.0 / sqrt(warp_sum_f64(squares) / double(kIndexerHeadDim) + p.eps));
#pragma unroll
    for (int j = 0; j < kSteps; ++j) x[j] = round_bf16(x[j] * inv_rms * p.norm_weight[j * kWarpSize + lane_id()]);
    rope_lanes<kIndexerNopeDim>(x, p.rope, (pos / p.ratio) * p.ratio, 1.0f);
    round_lanes_bf16(x, kIndexerNopeDim / kWarpSize, kSteps);
    indexer_key_store_lanes(p.key_format, entry, x);
  }
}

}  // namespace

cudaError_t launch_indexer_k_norm_rope_store(const IndexerKNormRopeStoreParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  indexer_k_norm_rope_store_kernel<<<grid_blocks(p.num_tokens, kRowsPerBlock), kRowBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
