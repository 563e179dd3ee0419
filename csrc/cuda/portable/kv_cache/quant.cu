// Generic cache writers and reader: MODEL1 / V32 quantize + insert, their dequantizing gather to bf16, and the
// indexer K insert. One warp per row; rows are bf16-rounded before quantizing, like the CPU kernels.
#include "cuda/launchers.h"
#include "cuda/portable/records.cuh"

namespace dsv4::cuda {
namespace {

template <KvLayout kLayout>
__global__ void __launch_bounds__(kRowBlockThreads) quantize_kv_insert_kernel(QuantizeKvInsertParams p) {
  constexpr int kDim = kLayout == KvLayout::model1 ? kModel1HeadDim : kV32HeadDim;
  constexpr int kSteps = lane_steps<kDim>();
  for (int64_t t = first_warp_row(); t < p.num_tokens; t += warp_row_step()) {
    const int64_t slot = index_at(p.slots, t);
    const int64_t entry_bytes = kLayout == KvLayout::model1 ? kModel1DataBytes : kV32BytesPerEntry;
    uint8_t* entry = slot_entry(p.cache, slot, 0, entry_bytes);
    if (!entry) continue;
    float x[kSteps];
    load_lanes(p.kv, p.dtype, t * p.kv_stride, x);
    round_lanes_bf16(x, 0, kSteps);
    if constexpr (kLayout == KvLayout::model1)
      model1_store_lanes(entry, slot_entry(p.cache, slot, p.cache.block_size * kModel1DataBytes, kModel1ScaleBytes), x);
    else
      v32_store_lanes(entry, x);
  }
}

template <KvLayout kLayout>
__global__ void __launch_bounds__(kRowBlockThreads) dequantize_kv_gather_kernel(DequantizeKvGatherParams p) {
  constexpr int kDim = kLayout == KvLayout::model1 ? kModel1HeadDim : kV32HeadDim;
  constexpr int kSteps = lane_steps<kDim>();
  for (int64_t s = first_warp_row(); s < p.num_slots; s += warp_row_step()) {
    const int64_t slot = index_at(p.slots, s);
    const int64_t entry_bytes = kLayout == KvLayout::model1 ? kModel1DataBytes : kV32BytesPerEntry;
    const uint8_t* entry = slot_entry(p.cache, slot, 0, entry_bytes);
    float x[kSteps];
    if (!entry) {
      for (float& v : x) v = 0.0f;  // invalid slots read as +0
    } else if constexpr (kLayout == KvLayout::model1) {
      model1_load_lanes(entry, slot_entry(p.cache, slot, p.cache.block_size * kModel1DataBytes, kModel1ScaleBytes), x);
    } else {
      v32_load_lanes(entry, x);
    }
    store_lanes(p.out, DType::bf16, s * kDim, x);
  }
}

__global__ void __launch_bounds__(kRowBlockThreads) indexer_k_quant_insert_kernel(IndexerKQuantInsertParams p) {
  for (int64_t t = first_warp_row(); t < p.num_tokens; t += warp_row_step()) {
    const int64_t slot = index_at(p.slots, t);
    uint8_t* codes = slot_entry(p.cache, slot, 0, kIndexerHeadDim);
    if (!codes) continue;
    float x[lane_steps<kIndexerHeadDim>()];
    load_lanes(p.k, p.dtype, t * p.k_stride, x);
    round_lanes_bf16(x, 0, lane_steps<kIndexerHeadDim>());
    indexer_k_store_lanes(codes, slot_entry(p.cache, slot, p.cache.block_size * kIndexerHeadDim, 4), x);
  }
}

}  // namespace

cudaError_t launch_quantize_kv_insert(const QuantizeKvInsertParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  const unsigned blocks = grid_blocks(p.num_tokens, kRowsPerBlock);
  if (p.layout == KvLayout::model1)
    quantize_kv_insert_kernel<KvLayout::model1><<<blocks, kRowBlockThreads, 0, stream>>>(p);
  else
    quantize_kv_insert_kernel<KvLayout::v32><<<blocks, kRowBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_kv_gather(const DequantizeKvGatherParams& p, cudaStream_t stream) {
  if (p.num_slots <= 0) return cudaSuccess;
  const unsigned blocks = grid_blocks(p.num_slots, kRowsPerBlock);
  if (p.layout == KvLayout::model1)
    dequantize_kv_gather_kernel<KvLayout::model1><<<blocks, kRowBlockThreads, 0, stream>>>(p);
  else
    dequantize_kv_gather_kernel<KvLayout::v32><<<blocks, kRowBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_indexer_k_quant_insert(const IndexerKQuantInsertParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  indexer_k_quant_insert_kernel<<<grid_blocks(p.num_tokens, kRowsPerBlock), kRowBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
