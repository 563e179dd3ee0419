// Compressor: state rows [kv | score + ape] per raw token, then the softmax-pooled, normalized,
// rotated and quantized compressed entry written by the last token of each group.
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/records.h"

namespace dsv4::cpu::DSV4_ISA {

inline float* state_row(const StateCache& s, int64_t slot) {
  if (slot < 0 || slot >= s.num_blocks * s.block_size) return nullptr;
  return s.base + (slot / s.block_size) * s.block_stride + (slot % s.block_size) * s.row_stride;
}

inline void save_partial_states(const SavePartialStatesParams& p) {
  parallel(p.num_tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* dst = state_row(p.state, index_at(p.slots, t));
      if (!dst) continue;
      const float* ape = p.ape + (index_at(p.positions, t) % p.ratio) * p.width;
      const float* kv = p.kv + t * p.kv_stride;
      const float* score = p.score + t * p.score_stride;
      std::memcpy(dst, kv, p.width * sizeof(float));
      for (int64_t d = 0; d < p.width; ++d) dst[p.width + d] = score[d] + ape[d];
    }
  });
}

constexpr int64_t kMaxCompressHeadDim = 512;

inline void compress_norm_rope_store(const CompressNormRopeStoreParams& p) {
  const int64_t dim = p.head_dim, width = p.coff * p.head_dim;
  parallel(p.num_tokens, 4, [&](int64_t begin, int64_t end) {
    float acc[kMaxCompressHeadDim], denom[kMaxCompressHeadDim], run_max[kMaxCompressHeadDim];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = index_at(p.positions, t);
      if ((pos + 1) % p.ratio != 0) continue;
      const int64_t kv_slot = index_at(p.kv_slots, t);
      int64_t off;
      uint8_t* page = slot_page(p.cache, kv_slot, &off);
      if (!page) continue;
      // Per-channel softmax over the valid window rows (max first, then one exp per element);
      // row w uses projection half w / ratio.
      const float* kv_rows[kMaxCompressWindow];
      int64_t num_rows = 0;
      for (int64_t w = 0; w < p.window; ++w) {
        const float* row = state_row(p.state, index_at(p.gather_slots, t, w));
        if (row) kv_rows[num_rows++] = row + (w / p.ratio) * dim;
      }
      if (num_rows == 0) continue;  // no state row to pool: nothing is written
      for (int64_t d = 0; d < dim; ++d) acc[d] = 0.0f, denom[d] = 0.0f, run_max[d] = -INFINITY;
      for (int64_t r = 0; r < num_rows; ++r) {
        const float* score = kv_rows[r] + width;
        for (int64_t d = 0; d < dim; ++d) run_max[d] = score[d] > run_max[d] ? score[d] : run_max[d];
      }
      for (int64_t r = 0; r < num_rows; ++r) {
        const float* kv = kv_rows[r];
        const float* score = kv + width;
        int64_t d = 0;
#if defined(__AVX512F__)
        for (; d + 16 <= dim; d += 16) {
          const __m512 weight = exp16(_mm512_sub_ps(_mm512_loadu_ps(score + d), _mm512_loadu_ps(run_max + d)));
          _mm512_storeu_ps(acc + d, _mm512_add_ps(_mm512_loadu_ps(acc + d), _mm512_mul_ps(weight, _mm512_loadu_ps(kv + d))));
          _mm512_storeu_ps(denom + d, _mm512_add_ps(_mm512_loadu_ps(denom + d), weight));
        }
#endif
        for (; d < dim; ++d) {
          const float weight = std::exp(score[d] - run_max[d]);
          acc[d] += weight * kv[d];
          denom[d] += weight;
        }
      }
      for (int64_t d = 0; d < dim; ++d) acc[d] /= denom[d];
      const float inv_rms = 1.0f / std::sqrt(sum_squares(acc, dim) / float(dim) + p.eps);
      for (int64_t d = 0; d < dim; ++d) acc[d] = acc[d] * inv_rms * p.norm_weight[d];
      if (p.latent) {
        uint16_t* latent = p.latent + t * p.latent_stride;
        for (int64_t d = 0; d < dim; ++d) latent[d] = f32_to_bf16(acc[d]);
      }
      const int64_t rope_start = dim - p.rope.rope_dim;
      rope_rotate(acc + rope_start, p.rope, (pos / p.ratio) * p.ratio, 1.0f);
      if (dim == kIndexerHeadDim) {
        for (int64_t d = 0; d < dim; ++d) acc[d] = round_bf16(acc[d]);
        indexer_k_store(page, p.cache.block_size, off, acc);
      } else {
        // MODEL1 stores the RoPE dims as bf16 itself; the V4.1 records quantize all dims from their bf16 rounding.
        const int64_t rounded = p.layout == KvLayout::model1 ? kModel1NopeDim : dim;
        for (int64_t d = 0; d < rounded; ++d) acc[d] = round_bf16(acc[d]);
        record512_store(p.layout, p.cache, kv_slot, acc);
      }
    }
  });
}

}  // namespace dsv4::cpu::DSV4_ISA
