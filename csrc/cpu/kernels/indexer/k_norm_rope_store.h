// DeepSeek-V4.1's index key writer: per group-closing token, weighted RMSNorm of k_pre, RoPE on dims [64, 128) at
// the group's first position, each step rounded to bf16, then the key in the cache's format (fp8 or mxfp4).
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/indexer/mxfp4.h"

namespace dsv4::cpu::DSV4_ISA {

inline void indexer_k_norm_rope_store(const IndexerKNormRopeStoreParams& p) {
  parallel(p.num_tokens, 16, [&](int64_t begin, int64_t end) {
    float row[kIndexerHeadDim];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = index_at(p.positions, t);
      if ((pos + 1) % p.ratio != 0) continue;
      int64_t off;
      uint8_t* page = slot_page(p.cache, index_at(p.slots, t), &off);
      if (!page) continue;
      const uint16_t* src = p.k_pre + t * p.k_stride;
      double sum = 0.0;  // exact for bf16 inputs: every summation order agrees with the reference
      for (int64_t d = 0; d < kIndexerHeadDim; ++d) {
        row[d] = bf16_to_f32(src[d]);
        sum += double(row[d]) * double(row[d]);
      }
      const float inv_rms = float(1.0 / std::sqrt(sum / double(kIndexerHeadDim) + p.eps));
      for (int64_t d = 0; d < kIndexerHeadDim; ++d) row[d] = round_bf16(row[d] * inv_rms * p.norm_weight[d]);
      rope_rotate(row + kIndexerNopeDim, p.rope, (pos / p.ratio) * p.ratio, 1.0f);
      for (int64_t d = kIndexerNopeDim; d < kIndexerHeadDim; ++d) row[d] = round_bf16(row[d]);
      indexer_key_store(p.key_format, page, p.cache.block_size, off, row);
    }
  });
}

}  // namespace dsv4::cpu::DSV4_ISA
