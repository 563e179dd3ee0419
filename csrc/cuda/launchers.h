// Host entry points of the CUDA kernels: one per op, over the op's parameter struct and a stream. They only
// launch (no allocation, no synchronisation) and return the launch status. Portable tier: csrc/cuda/portable/
// (sm_80+, hipify-clean); Hopper tier: csrc/cuda/sm90/ (sm_90a).
#pragma once
#if defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif

#include "common/op_list.h"

namespace dsv4::cuda {

// Whether rows at base + i * stride all start on `bytes` boundaries (bytes a power of two).
inline bool rows_aligned(const void* base, int64_t stride, uintptr_t bytes) {
  return ((reinterpret_cast<uintptr_t>(base) | uintptr_t(stride)) & (bytes - 1)) == 0;
}
// Whether every page of a paged cache starts on `bytes` boundaries.
inline bool pages_aligned(const PagedCache& cache, uintptr_t bytes) {
  return rows_aligned(cache.base, cache.block_stride, bytes);
}

// One launcher per op of common/op_list.h (launch_<op>), and launch_<op>_sm90 for the ops with a Hopper kernel
// (the Hopper launchers send shapes their kernel does not take to the portable tier). Notes on some of them:
// - launch_fp8_paged_mqa_topk needs p.workspace (see PagedMqaTopkParams).
// - launch_sparse_mla_decode plans (when p.sched.plan), attends, and combines split pieces;
//   launch_sparse_mla_decode_schedule is its one-thread planner, shared with the Hopper tier.
// - launch_sparse_mla_prefill_sm90 runs MODEL1-shaped prefill (d_qk = d_v = 512, 16-byte aligned kv rows) on the
//   decode's Hopper kernel.
#define DSV4_LAUNCHER(name, Params, hopper) cudaError_t launch_##name(const Params& p, cudaStream_t stream);
DSV4_OPS(DSV4_LAUNCHER)
#undef DSV4_LAUNCHER
#if defined(DSV4_HAVE_SM90)
#define DSV4_LAUNCHER_SM90(name, Params, hopper) \
  DSV4_IF_HOPPER(hopper, cudaError_t launch_##name##_sm90(const Params& p, cudaStream_t stream);)
DSV4_OPS(DSV4_LAUNCHER_SM90)
#undef DSV4_LAUNCHER_SM90
#endif

// The select alone, over rows 0 .. p.rows - 1 (<= workspace_rows) whose scores are already in p.workspace.
cudaError_t launch_fp8_paged_mqa_topk_select(const PagedMqaTopkParams& p, cudaStream_t stream);
// Merges split pieces. `dependent`: launch it as a programmatic dependent of the attention kernel just launched (its
// CTAs are scheduled while that kernel drains), where the combine's code for this device waits for it.
cudaError_t launch_decode_combine(const SparseMlaDecodeParams& p, cudaStream_t stream, bool dependent = false);

}  // namespace dsv4::cuda
