// Merge of the split pieces of a sparse decode: every request the plan cut into more than one piece gets its
// output and lse from the pieces' fp32 partials through their lse (requests with one piece were written by the
// attention kernel). One CTA per (query row, head); fixed-order reductions keep it deterministic.
#include "cuda/launchers.h"
#include "cuda/portable/sparse_mla_common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kCombineThreads = 128;  // 4 of the 512 output dims each
constexpr int kDimsPerThread = mla::kValueDim / kCombineThreads;
constexpr int kWeightChunk = 256;  // piece weights staged in shared memory at a time
constexpr int64_t kMaxRowBlocks = 1 << 20;  // grid.x; larger batches loop
static_assert(kDimsPerThread == 4, "one float4 of every partial per thread");

// Reduces v over the CTA in a fixed tree order; every thread gets the result.
template <bool kMax>
DSV4_DEVICE float cta_reduce(float v, float* scratch) {
  const int t = threadIdx.x;
  scratch[t] = v;
  __syncthreads();
  for (int stride = kCombineThreads / 2; stride > 0; stride /= 2) {
    if (t < stride) scratch[t] = kMax ? fmaxf(scratch[t], scratch[t + stride]) : scratch[t] + scratch[t + stride];
    __syncthreads();
  }
  const float result = scratch[0];
  __syncthreads();
  return result;
}

__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(SparseMlaDecodeParams p) {
  __shared__ float scratch[kCombineThreads];
  __shared__ float weight[kWeightChunk];
  const int t = threadIdx.x;
  const int64_t h = blockIdx.y, rows = p.b * p.s_q, split_rows = p.b + p.sched.num_parts;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t r = row / p.s_q, s = row - r * p.s_q;
    const int64_t first = p.sched.num_splits[r], pieces = p.sched.num_splits[r + 1] - first;
    if (pieces <= 1 || first < 0 || first + pieces > split_rows) continue;
    const float* lse_of = p.sched.lse_accum + mla::accum_row(p, first, s, h);
    const int64_t lse_step = p.s_q * p.h_q;  // one split row further
    float best = -INFINITY;
    for (int64_t i = t; i < pieces; i += kCombineThreads) best = fmaxf(best, lse_of[i * lse_step]);
    best = cta_reduce<true>(best, scratch);
    uint16_t* out = p.out + (row * p.h_q + h) * mla::kValueDim;
    float* lse_out = p.lse + (r * p.h_q + h) * p.s_q + s;
    if (best == -INFINITY) {  // no piece attended a valid entry
      for (int k = 0; k < kDimsPerThread; ++k) out[t * kDimsPerThread + k] = 0;
      if (t == 0) *lse_out = INFINITY;
      continue;
    }
    float total = 0.0f;
    for (int64_t i = t; i < pieces; i += kCombineThreads) {
      const float l = lse_of[i * lse_step];
      if (l != -INFINITY) total += expf(l - best);
    }
    total = cta_reduce<false>(total, scratch);
    const float lse = best + logf(total);
    const float sink_factor = p.attn_sink ? 1.0f / (1.0f + expf(p.attn_sink[h] - lse)) : 1.0f;
    float acc[kDimsPerThread] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t c0 = 0; c0 < pieces; c0 += kWeightChunk) {
      const int64_t n = pieces - c0 < kWeightChunk ? pieces - c0 : kWeightChunk;
      for (int64_t i = t; i < n; i += kCombineThreads) {
        const float l = lse_of[(c0 + i) * lse_step];
        weight[i] = l == -INFINITY ? 0.0f : expf(l - lse) * sink_factor;
      }
      __syncthreads();
      for (int64_t i = 0; i < n; ++i) {
        if (weight[i] == 0.0f) continue;
        const float4 o = *reinterpret_cast<const float4*>(
            p.sched.o_accum + mla::accum_row(p, first + c0 + i, s, h) * mla::kValueDim + t * kDimsPerThread);
        acc[0] = fmaf(weight[i], o.x, acc[0]);
        acc[1] = fmaf(weight[i], o.y, acc[1]);
        acc[2] = fmaf(weight[i], o.z, acc[2]);
        acc[3] = fmaf(weight[i], o.w, acc[3]);
      }
      __syncthreads();
    }
    uint32_t* out_pairs = reinterpret_cast<uint32_t*>(out) + t * kDimsPerThread / 2;
    out_pairs[0] = mla::scaled_bf16_pair(acc[0], acc[1], 1.0f);
    out_pairs[1] = mla::scaled_bf16_pair(acc[2], acc[3], 1.0f);
    if (t == 0) *lse_out = lse;
  }
}

}  // namespace

cudaError_t launch_decode_combine(const SparseMlaDecodeParams& p, cudaStream_t stream) {
  const int64_t rows = p.b * p.s_q;
  if (rows == 0 || p.h_q == 0) return cudaSuccess;
  const dim3 grid(unsigned(rows < kMaxRowBlocks ? rows : kMaxRowBlocks), unsigned(p.h_q));
  decode_combine_kernel<<<grid, kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
