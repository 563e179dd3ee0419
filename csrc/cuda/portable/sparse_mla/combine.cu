// Merge of the split pieces of a sparse decode: every request the plan cut into more than one piece gets its
// output and lse from the pieces' fp32 partials through their lse (requests with one piece were written by the
// attention kernel). One warp per (query row, head), kHeadsPerCta heads per CTA; with a plan without split requests
// its CTAs read two plan words and leave. Fixed-order reductions keep it deterministic.
#include <atomic>

#include "cuda/launchers.h"
#include "cuda/portable/sparse_mla/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kHeadsPerCta = 8;  // one warp each
constexpr int kCombineThreads = kHeadsPerCta * kWarpSize;
constexpr int kDimsPerLane = mla::kValueDim / kWarpSize;
// grid.x; larger batches loop: the CTAs (128 registers, two per SM) of rows without splits only read the plan, and
// fewer of them looping costs less than more waves
constexpr int64_t kMaxRowBlocks = 64;
constexpr int kPiecesInFlight = 4;  // partial rows loaded before the first is summed
static_assert(kDimsPerLane % 4 == 0, "whole float4 of every partial per lane");

__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(SparseMlaDecodeParams p) {
#if !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent: the attention grid and its writes first. Every CTA waits, also when it
  // has nothing to merge, so that the combine's completion implies the attention grid's for the work after it.
  cudaGridDependencySynchronize();
#endif
  if (mla::plan_splits_nothing(p)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t h = int64_t(blockIdx.y) * kHeadsPerCta + threadIdx.x / kWarpSize;
  const int64_t rows = p.b * p.s_q, split_rows = p.b + p.sched.num_parts;
  if (h >= p.h_q) return;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t r = row / p.s_q, s = row - r * p.s_q;
    const int64_t first = p.sched.num_splits[r], pieces = p.sched.num_splits[r + 1] - first;
    if (pieces <= 1 || first < 0 || first + pieces > split_rows) continue;
    const float* lse_of = p.sched.lse_accum + mla::accum_row(p, first, s, h);
    const int64_t lse_step = p.s_q * p.h_q;  // one split row further
    float best = -INFINITY;
    bool nan = false;  // a piece saw a NaN score: the row is NaN, as in the reference
    for (int64_t i = lane; i < pieces; i += kWarpSize) {
      const float l = lse_of[i * lse_step];
      best = fmaxf(best, l), nan = nan || l != l;
    }
    best = warp_max(best);
    uint16_t* out = p.out + (row * p.h_q + h) * mla::kValueDim;
    float* lse_out = p.lse + (r * p.h_q + h) * p.s_q + s;
    nan = warp_ballot(nan) != 0;
    if (nan || best == -INFINITY) {  // a NaN piece: a NaN row; no piece attended a valid entry: 0 and +inf
      for (int k = 0; k < kDimsPerLane; ++k) out[lane * kDimsPerLane + k] = nan ? kBf16QuietNan : 0;
      if (lane == 0) *lse_out = nan ? __uint_as_float(kF32QuietNanBits) : INFINITY;
      continue;
    }
    float total = 0.0f;
    for (int64_t i = lane; i < pieces; i += kWarpSize) {
      const float l = lse_of[i * lse_step];
      if (l != -INFINITY) total += expf(l - best);
    }
    total = warp_sum(total);
    const float lse = best + logf(total);
    const float sink_factor = p.attn_sink ? 1.0f / (1.0f + expf(p.attn_sink[h] - lse)) : 1.0f;
    float acc[kDimsPerLane] = {};
    for (int64_t base = 0; base < pieces; base += kWarpSize) {
      // Lane i holds the weight of piece base + i (bit i of `skipped`: no attended entry); the partials of
      // kPiecesInFlight pieces are loaded before any is summed, and summed in piece order (deterministic).
      const int64_t mine = base + lane;
      const float l = mine < pieces ? lse_of[mine * lse_step] : -INFINITY;
      const float my_weight = l == -INFINITY ? 0.0f : expf(l - lse) * sink_factor;
      const uint64_t skipped = warp_ballot(l == -INFINITY);
      const int n = int(pieces - base < kWarpSize ? pieces - base : kWarpSize);
      for (int j = 0; j < n; j += kPiecesInFlight) {
        float4 v[kPiecesInFlight][kDimsPerLane / 4];
        float weight[kPiecesInFlight];
        bool skip[kPiecesInFlight];
#pragma unroll
        for (int u = 0; u < kPiecesInFlight; ++u) {
          weight[u] = warp_broadcast(my_weight, (j + u) % kWarpSize);
          skip[u] = j + u >= n || ((skipped >> (j + u)) & 1u);
          if (skip[u]) continue;
          const float* o = p.sched.o_accum + mla::accum_row(p, first + base + j + u, s, h) * mla::kValueDim + lane * 4;
#pragma unroll
          for (int k = 0; k < kDimsPerLane / 4; ++k)  // float4 k of this lane: dims 4 lane + kWarpSize * 4k
            v[u][k] = *reinterpret_cast<const float4*>(o + k * kWarpSize * 4);
        }
#pragma unroll
        for (int u = 0; u < kPiecesInFlight; ++u) {
          if (skip[u]) continue;
#pragma unroll
          for (int k = 0; k < kDimsPerLane / 4; ++k) {
            acc[4 * k] = fmaf(weight[u], v[u][k].x, acc[4 * k]);
            acc[4 * k + 1] = fmaf(weight[u], v[u][k].y, acc[4 * k + 1]);
            acc[4 * k + 2] = fmaf(weight[u], v[u][k].z, acc[4 * k + 2]);
            acc[4 * k + 3] = fmaf(weight[u], v[u][k].w, acc[4 * k + 3]);
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kDimsPerLane / 4; ++k) {
      uint32_t* pairs = reinterpret_cast<uint32_t*>(out + lane * 4 + k * kWarpSize * 4);
      pairs[0] = mla::scaled_bf16_pair(acc[4 * k], acc[4 * k + 1], 1.0f);
      pairs[1] = mla::scaled_bf16_pair(acc[4 * k + 2], acc[4 * k + 3], 1.0f);
    }
    if (lane == 0) *lse_out = lse;
  }
}

#if !defined(__HIP_PLATFORM_AMD__)
// Whether the combine's code on the current device was built for compute 9.0 or newer, i.e. waits for the grid it
// depends on (code JIT-compiled from older PTX does not, and must not be launched as a programmatic dependent).
bool combine_waits_for_predecessor() {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};  // 0 not asked yet, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return false;
  if (known[device].load() == 0) {
    cudaFuncAttributes attributes = {};
    const bool waits = cudaFuncGetAttributes(&attributes, decode_combine_kernel) == cudaSuccess &&
                       attributes.ptxVersion >= 90;
    known[device].store(waits ? 2 : 1);
  }
  return known[device].load() == 2;
}
#endif

}  // namespace

cudaError_t launch_decode_combine(const SparseMlaDecodeParams& p, cudaStream_t stream, bool dependent) {
  const int64_t rows = p.b * p.s_q;
  // A whole-request plan writes every output row in the attention kernel: no launch (and no kernel boundary).
  if (rows == 0 || p.h_q == 0 || decode_plan_keeps_requests_whole(p)) return cudaSuccess;
  const dim3 grid(unsigned(rows < kMaxRowBlocks ? rows : kMaxRowBlocks), unsigned(ceil_div(p.h_q, kHeadsPerCta)));
#if !defined(__HIP_PLATFORM_AMD__)
  if (dependent && combine_waits_for_predecessor()) {
    // Programmatic dependent launch: the combine's CTAs are scheduled while the attention kernel drains (the
    // kernel waits for it with cudaGridDependencySynchronize), which hides the launch gap between the two.
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(kCombineThreads);
    config.stream = stream;
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, decode_combine_kernel, p);
  }
#else
  (void)dependent;
#endif
  decode_combine_kernel<<<grid, kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
