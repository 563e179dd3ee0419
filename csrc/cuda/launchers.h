// Host entry points of the CUDA kernels: one per op, over the op's parameter struct and a stream. They only
// launch (no allocation, no synchronisation) and return the launch status. Portable tier: csrc/cuda/portable/
// (sm_80+, hipify-clean); Hopper tier: csrc/cuda/sm90/ (sm_90a).
#pragma once
#if defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif

#include "common/params.h"

namespace dsv4::cuda {

// Whether rows at base + i * stride all start on `bytes` boundaries (bytes a power of two).
inline bool rows_aligned(const void* base, int64_t stride, uintptr_t bytes) {
  return ((reinterpret_cast<uintptr_t>(base) | uintptr_t(stride)) & (bytes - 1)) == 0;
}
// Whether every page of a paged cache starts on `bytes` boundaries.
inline bool pages_aligned(const PagedCache& cache, uintptr_t bytes) {
  return rows_aligned(cache.base, cache.block_stride, bytes);
}

cudaError_t launch_qnorm_rope_kv_insert(const QNormRopeKvInsertParams& p, cudaStream_t stream);
cudaError_t launch_indexer_q_rope_quant(const IndexerQRopeQuantParams& p, cudaStream_t stream);
cudaError_t launch_save_partial_states(const SavePartialStatesParams& p, cudaStream_t stream);
cudaError_t launch_compress_norm_rope_store(const CompressNormRopeStoreParams& p, cudaStream_t stream);
cudaError_t launch_quantize_kv_insert(const QuantizeKvInsertParams& p, cudaStream_t stream);
cudaError_t launch_dequantize_kv_gather(const DequantizeKvGatherParams& p, cudaStream_t stream);
cudaError_t launch_indexer_k_quant_insert(const IndexerKQuantInsertParams& p, cudaStream_t stream);
cudaError_t launch_map_local_to_global_slots(const MapLocalToGlobalSlotsParams& p, cudaStream_t stream);
cudaError_t launch_inverse_rope(const InverseRopeParams& p, cudaStream_t stream);
cudaError_t launch_fp8_paged_mqa_logits(const PagedMqaLogitsParams& p, cudaStream_t stream);
cudaError_t launch_fp8_mqa_logits(const MqaLogitsParams& p, cudaStream_t stream);
cudaError_t launch_topk_transform(const TopkTransformParams& p, cudaStream_t stream);
// Needs p.workspace: see PagedMqaTopkParams.
cudaError_t launch_fp8_paged_mqa_topk(const PagedMqaTopkParams& p, cudaStream_t stream);
// The select alone, over rows 0 .. p.rows - 1 (<= workspace_rows) whose scores are already in p.workspace.
cudaError_t launch_fp8_paged_mqa_topk_select(const PagedMqaTopkParams& p, cudaStream_t stream);
cudaError_t launch_sparse_mla_prefill(const SparseMlaPrefillParams& p, cudaStream_t stream);

// Sparse decode: plans (when p.sched.plan), attends, and combines split pieces.
cudaError_t launch_sparse_mla_decode(const SparseMlaDecodeParams& p, cudaStream_t stream);
// The pieces the Hopper tier shares with the portable one.
cudaError_t launch_decode_schedule(const SparseMlaDecodeParams& p, cudaStream_t stream);  // one-thread planner
// Merges split pieces. `dependent`: launch it as a programmatic dependent of the attention kernel just launched (its
// CTAs are scheduled while that kernel drains), where the combine's code for this device waits for it.
cudaError_t launch_decode_combine(const SparseMlaDecodeParams& p, cudaStream_t stream, bool dependent = false);
#if defined(DSV4_HAVE_SM90)
cudaError_t launch_sparse_mla_decode_sm90(const SparseMlaDecodeParams& p, cudaStream_t stream);
// MODEL1-shaped prefill (d_qk = d_v = 512, 16-byte aligned kv rows) on the decode's Hopper kernel; else portable.
cudaError_t launch_sparse_mla_prefill_sm90(const SparseMlaPrefillParams& p, cudaStream_t stream);
// Indexer scores on Hopper; shapes the kernel does not take go to the portable tier.
cudaError_t launch_fp8_paged_mqa_logits_sm90(const PagedMqaLogitsParams& p, cudaStream_t stream);
cudaError_t launch_fp8_paged_mqa_topk_sm90(const PagedMqaTopkParams& p, cudaStream_t stream);
#endif

}  // namespace dsv4::cuda
