// Generic cache writers and reader: MODEL1 / V32 / V4.1 fp8 / V4.1 fp4 quantize + insert (V4.1 in either placement),
// their dequantizing gather to bf16, and the indexer K insert (fp8 or MXFP4 keys). One warp per row; rows are
// bf16-rounded before quantizing, like the CPU kernels.
#include "cuda/launchers.h"
#include "cuda/portable/mxfp4.cuh"

namespace dsv4::cuda {
namespace {

template <KvLayout kLayout>
constexpr int kRecordDim = kLayout == KvLayout::v32 ? kV32HeadDim : kV41HeadDim;

template <KvLayout kLayout>
__global__ void __launch_bounds__(kRowBlockThreads) quantize_kv_insert_kernel(QuantizeKvInsertParams p) {
  constexpr int kSteps = lane_steps<kRecordDim<kLayout>>();
  for (int64_t t = first_warp_row(); t < p.num_tokens; t += warp_row_step()) {
    const EntryBytes e = dsv4::slot_entry(kLayout, p.cache, index_at(p.slots, t));
    if (!e.data) continue;
    float x[kSteps];
    load_lanes(p.kv, p.dtype, t * p.kv_stride, x);
    round_lanes_bf16(x, 0, kSteps);
    if constexpr (kLayout == KvLayout::v32)
      v32_store_lanes(e.data, x);
    else
      record512_store_lanes(kLayout, e, x);
  }
}

template <KvLayout kLayout>
__global__ void __launch_bounds__(kRowBlockThreads) dequantize_kv_gather_kernel(DequantizeKvGatherParams p) {
  constexpr int kDim = kRecordDim<kLayout>;
  constexpr int kSteps = lane_steps<kDim>();
  for (int64_t s = first_warp_row(); s < p.num_slots; s += warp_row_step()) {
    const EntryBytes e = dsv4::slot_entry(kLayout, p.cache, index_at(p.slots, s));
    float x[kSteps];
    if (!e.data) {
      for (float& v : x) v = 0.0f;  // invalid slots read as +0
    } else if constexpr (kLayout == KvLayout::model1) {
      model1_load_lanes(e.data, e.scales, x);
    } else if constexpr (kLayout == KvLayout::v32) {
      v32_load_lanes(e.data, x);
    } else if constexpr (kLayout == KvLayout::v41_fp8) {
      v41_fp8_load_lanes(e, x);
    } else {
      v41_fp4_load_lanes(e, x);
    }
    store_lanes(p.out, DType::bf16, s * kDim, x);
  }
}

__global__ void __launch_bounds__(kRowBlockThreads) indexer_k_quant_insert_kernel(IndexerKQuantInsertParams p) {
  for (int64_t t = first_warp_row(); t < p.num_tokens; t += warp_row_step()) {
    const IndexerKeyBytes entry = indexer_key_entry(p.key_format, p.cache, index_at(p.slots, t));
    if (!entry.data) continue;
    float x[lane_steps<kIndexerHeadDim>()];
    load_lanes(p.k, p.dtype, t * p.k_stride, x);
    round_lanes_bf16(x, 0, lane_steps<kIndexerHeadDim>());
    indexer_key_store_lanes(p.key_format, entry, x);
  }
}

}  // namespace

cudaError_t launch_quantize_kv_insert(const QuantizeKvInsertParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  const unsigned blocks = grid_blocks(p.num_tokens, kRowsPerBlock);
  switch (p.layout) {
    case KvLayout::model1:
      quantize_kv_insert_kernel<KvLayout::model1><<<blocks, kRowBlockThreads, 0, stream>>>(p);
      break;
    case KvLayout::v32: quantize_kv_insert_kernel<KvLayout::v32><<<blocks, kRowBlockThreads, 0, stream>>>(p); break;
    case KvLayout::v41_fp8:
      quantize_kv_insert_kernel<KvLayout::v41_fp8><<<blocks, kRowBlockThreads, 0, stream>>>(p);
      break;
    case KvLayout::v41_fp4:
      quantize_kv_insert_kernel<KvLayout::v41_fp4><<<blocks, kRowBlockThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_dequantize_kv_gather(const DequantizeKvGatherParams& p, cudaStream_t stream) {
  if (p.num_slots <= 0) return cudaSuccess;
  const unsigned blocks = grid_blocks(p.num_slots, kRowsPerBlock);
  switch (p.layout) {
    case KvLayout::model1:
      dequantize_kv_gather_kernel<KvLayout::model1><<<blocks, kRowBlockThreads, 0, stream>>>(p);
      break;
    case KvLayout::v32: dequantize_kv_gather_kernel<KvLayout::v32><<<blocks, kRowBlockThreads, 0, stream>>>(p); break;
    case KvLayout::v41_fp8:
      dequantize_kv_gather_kernel<KvLayout::v41_fp8><<<blocks, kRowBlockThreads, 0, stream>>>(p);
      break;
    case KvLayout::v41_fp4:
      dequantize_kv_gather_kernel<KvLayout::v41_fp4><<<blocks, kRowBlockThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_indexer_k_quant_insert(const IndexerKQuantInsertParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  indexer_k_quant_insert_kernel<<<grid_blocks(p.num_tokens, kRowsPerBlock), kRowBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
