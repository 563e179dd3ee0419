// DeepSeek-V4.1's index key writer: per group-closing token, weighted RMSNorm (the sum of squares in float64, exact
// for bf16 inputs, so it matches the CPU kernels and the reference bit for bit), RoPE on dims [64, 128) at the
// group's first position, each rounded to bf16, then the fp8 or MXFP4 key. One warp per token.
#include "cuda/launchers.h"
#include "cuda/portable/records.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kMxfp4Lanes = 32;  // one 32-dim block per 32 neighbouring lanes (a whole warp on NVIDIA)
constexpr float kMxfp4AmaxFloor = 6.0f * 0x1p-126f;

// e2m1 code of y: nearest magnitude with ties to the lower one, saturating at 6; NaN -> 0; no sign on magnitude 0.
DSV4_DEVICE uint32_t mxfp4_code(float y) {
  const float a = fabsf(y);
  const uint32_t m = uint32_t(a > 0.25f) + uint32_t(a > 0.75f) + uint32_t(a > 1.25f) + uint32_t(a > 1.75f) +
                     uint32_t(a > 2.5f) + uint32_t(a > 3.5f) + uint32_t(a > 5.0f);
  return m != 0u && signbit(y) ? m | kE2m1SignBit : m;
}

// 128 lane-strided values -> 64 code bytes (even dim in the low nibble) and 4 UE8M0 bytes, one per 32 dims:
// exponent ceil(log2(max(amax, 6 * 2^-126) / 6)) (NaN left out of amax; an infinite amax gives 127).
DSV4_DEVICE void mxfp4_store_lanes(uint8_t* codes, uint8_t* scales, const float (&x)[lane_steps<kIndexerHeadDim>()]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < lane_steps<kIndexerHeadDim>(); ++j) {
    float amax = fabsf(x[j]);
    for (int m = kMxfp4Lanes / 2; m > 0; m >>= 1) amax = fmaxf(amax, warp_xor(amax, m));  // fmaxf drops NaN
    amax = fmaxf(amax, kMxfp4AmaxFloor);
    const int e = isinf(amax) ? 127 : min(127, ceil_log2(amax / 6.0f));
    const uint32_t code = mxfp4_code(ldexpf(x[j], -e));
    const uint32_t odd = warp_down(code, 1);
    const int dim = j * kWarpSize + lane;
    if ((lane & 1) == 0) codes[dim / 2] = uint8_t(code | odd << 4);
    if (dim % kMxfp4Lanes == 0) scales[dim / kMxfp4Lanes] = uint8_t(e + 127);
  }
}

DSV4_DEVICE double warp_sum_f64(double v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += warp_xor(v, m);
  return v;
}

__global__ void __launch_bounds__(kRowBlockThreads) indexer_k_norm_rope_store_kernel(IndexerKNormRopeStoreParams p) {
  constexpr int kSteps = lane_steps<kIndexerHeadDim>();
  const bool fp4 = p.key_format == IndexerFormat::mxfp4;
  const int64_t data_bytes = fp4 ? kIndexerFp4DataBytes : kIndexerHeadDim;
  const int64_t scale_bytes = fp4 ? kIndexerFp4ScaleBytes : kIndexerScaleBytes;
  for (int64_t t = first_warp_row(); t < p.num_tokens; t += warp_row_step()) {
    const int64_t pos = index_at(p.positions, t);
    if (!rope_row_valid(p.rope, pos) || (pos + 1) % p.ratio != 0) continue;  // no host check on CUDA
    const int64_t slot = index_at(p.slots, t);
    uint8_t* data = slot_entry(p.cache, slot, 0, data_bytes);
    if (data == nullptr) continue;
    uint8_t* scales = slot_entry(p.cache, slot, p.cache.block_size * data_bytes, scale_bytes);
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
    if (fp4)
      mxfp4_store_lanes(data, scales, x);
    else
      indexer_k_store_lanes(data, scales, x);
  }
}

}  // namespace

cudaError_t launch_indexer_k_norm_rope_store(const IndexerKNormRopeStoreParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  indexer_k_norm_rope_store_kernel<<<grid_blocks(p.num_tokens, kRowsPerBlock), kRowBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
