// Compressor: state rows [kv | score + ape] per raw token, then the compressed entry written by the last token of
// each group: per-channel softmax pool over the window rows, RMSNorm, RoPE, quantize into the p.layout record (head
// 512: MODEL1, V4.1 fp8 or fp4) or indexer K (head 128) cache. One CTA per token: all threads pool channels, warp 0
// finishes the row.
#include "cuda/launchers.h"
#include "cuda/portable/records.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kPoolThreads = 128;  // channels in flight per CTA

// Float offset of a state row from the state base, or -1 when the slot is outside the state cache.
DSV4_DEVICE int64_t state_row_offset(const StateCache& s, int64_t slot) {
  if (slot < 0 || slot >= s.num_blocks * s.block_size) return -1;
  const int64_t block = slot / s.block_size;
  return block * s.block_stride + (slot - block * s.block_size) * s.row_stride;
}

__global__ void __launch_bounds__(kCopyThreads) save_partial_states_kernel(SavePartialStatesParams p) {
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int64_t row = state_row_offset(p.state, index_at(p.slots, t)), pos = index_at(p.positions, t);
    if (row < 0 || pos < 0) continue;  // no host check on CUDA: a negative position is skipped like a -1 slot
    float* dst = p.state.base + row;
    const float* ape = p.ape + (pos % p.ratio) * p.width;
    const float* kv = p.kv + t * p.kv_stride;
    const float* score = p.score + t * p.score_stride;
    for (int64_t d = threadIdx.x; d < p.width; d += kCopyThreads) {
      dst[d] = kv[d];
      dst[p.width + d] = score[d] + ape[d];
    }
  }
}

// The entry at slot: the indexer K codes and scale (head 128) or the p.layout record's bytes; data == nullptr when
// the slot is outside the cache.
template <int kDim>
DSV4_DEVICE EntryBytes compressed_entry(const CompressNormRopeStoreParams& p, int64_t slot) {
  if constexpr (kDim == kIndexerHeadDim) {
    uint8_t* codes = slot_entry(p.cache, slot, 0, kIndexerHeadDim);
    if (!codes) return {};
    return {codes, slot_entry(p.cache, slot, p.cache.block_size * kIndexerHeadDim, kIndexerScaleBytes)};
  } else {
    return dsv4::slot_entry(p.layout, p.cache, slot);
  }
}

// Normalizes, rotates and stores one pooled row (warp 0 of the CTA).
template <int kDim>
DSV4_DEVICE void store_compressed(const CompressNormRopeStoreParams& p, const float* pooled, int64_t t,
                                  int64_t rope_pos, const EntryBytes& entry) {
  constexpr int kSteps = lane_steps<kDim>();
  const int lane = lane_id();
  float x[kSteps];
#pragma unroll
  for (int j = 0; j < kSteps; ++j) x[j] = pooled[j * kWarpSize + lane];
  const float inv_rms = 1.0f / sqrtf(warp_sum_squares(x) / float(kDim) + p.eps);
#pragma unroll
  for (int j = 0; j < kSteps; ++j) x[j] = x[j] * inv_rms * p.norm_weight[j * kWarpSize + lane];
  if (p.latent) {  // the normed entry before its rotation (V4.1 projects its indexer keys from it)
    uint16_t* latent = p.latent + t * p.latent_stride;
#pragma unroll
    for (int j = 0; j < kSteps; ++j) latent[j * kWarpSize + lane] = f32_to_bf16(x[j]);
  }
  rope_lanes<kDim - kRopeDim>(x, p.rope, rope_pos, 1.0f);
  if constexpr (kDim == kIndexerHeadDim) {
    round_lanes_bf16(x, 0, kSteps);
    indexer_k_store_lanes(entry.data, entry.scales, x);
  } else {
    // MODEL1 stores the RoPE dims as bf16 itself; the V4.1 records quantize all dims from their bf16 rounding.
    round_lanes_bf16(x, 0, p.layout == KvLayout::model1 ? kModel1NopeDim / kWarpSize : kSteps);
    record512_store_lanes(p.layout, entry, x);
  }
}

template <int kDim>
__global__ void __launch_bounds__(kPoolThreads) compress_norm_rope_store_kernel(CompressNormRopeStoreParams p) {
  static_assert(kDim % kPoolThreads == 0, "whole channels per thread");
  constexpr int kChannels = kDim / kPoolThreads;
  __shared__ int64_t window_rows[kMaxCompressWindow];  // offset of each window row's projection half, -1: invalid
  __shared__ float pooled[kDim];
  const int64_t width = p.coff * kDim;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    // Every condition below is the same in all threads, so skipping a token keeps the barriers aligned.
    const int64_t pos = index_at(p.positions, t);
    if (pos < 0 || pos % p.ratio != p.ratio - 1) continue;  // not an entry's last token (no pos + 1 overflow)
    const int64_t rope_pos = (pos / p.ratio) * p.ratio, slot = index_at(p.kv_slots, t);
    const EntryBytes entry = compressed_entry<kDim>(p, slot);
    if (!entry.data || !rope_row_valid(p.rope, rope_pos)) continue;
    __syncthreads();  // the previous token's readers of the shared arrays are done
    for (int64_t w = threadIdx.x; w < p.window; w += kPoolThreads) {
      const int64_t row = state_row_offset(p.state, index_at(p.gather_slots, t, w));
      window_rows[w] = row < 0 ? -1 : row + (w / p.ratio) * kDim;  // window row w pools projection half w / R
    }
    __syncthreads();
    float run_max[kChannels], acc[kChannels], denom[kChannels];
#pragma unroll
    for (int c = 0; c < kChannels; ++c) run_max[c] = -INFINITY, acc[c] = 0.0f, denom[c] = 0.0f;
    bool any_row = false;
    for (int64_t w = 0; w < p.window; ++w) {
      if (window_rows[w] < 0) continue;
      any_row = true;
      const float* score = p.state.base + window_rows[w] + width;
#pragma unroll
      for (int c = 0; c < kChannels; ++c) {
        const float s = score[c * kPoolThreads + threadIdx.x];
        run_max[c] = s > run_max[c] ? s : run_max[c];
      }
    }
    if (!any_row) continue;  // no state row to pool: nothing is written
    for (int64_t w = 0; w < p.window; ++w) {
      if (window_rows[w] < 0) continue;
      const float* kv = p.state.base + window_rows[w];
#pragma unroll
      for (int c = 0; c < kChannels; ++c) {
        const int d = c * kPoolThreads + threadIdx.x;
        const float weight = expf(kv[width + d] - run_max[c]);
        acc[c] += weight * kv[d];
        denom[c] += weight;
      }
    }
#pragma unroll
    for (int c = 0; c < kChannels; ++c) pooled[c * kPoolThreads + threadIdx.x] = acc[c] / denom[c];
    __syncthreads();
    if (threadIdx.x < kWarpSize) store_compressed<kDim>(p, pooled, t, rope_pos, entry);
  }
}

}  // namespace

cudaError_t launch_save_partial_states(const SavePartialStatesParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  save_partial_states_kernel<<<grid_blocks(p.num_tokens, 1), kCopyThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_compress_norm_rope_store(const CompressNormRopeStoreParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  const unsigned blocks = grid_blocks(p.num_tokens, 1);
  if (p.head_dim == kIndexerHeadDim)
    compress_norm_rope_store_kernel<kIndexerHeadDim><<<blocks, kPoolThreads, 0, stream>>>(p);
  else
    compress_norm_rope_store_kernel<kModel1HeadDim><<<blocks, kPoolThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
