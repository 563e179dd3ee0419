// Indexer query: RoPE on dims [64, 128), per-(token, head) power-of-two fp8 quantization, with
// the q scale folded into the head weights (the logits kernel then sees raw fp8 q); or mxfp4 per 32 dims, whose
// scale bytes travel with q (the weights then carry no q scale).
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/indexer/mxfp4.h"

namespace dsv4::cpu::DSV4_ISA {

inline void indexer_q_rope_quant(const IndexerQRopeQuantParams& p) {
  const int64_t esize = dtype_bytes(p.dtype);
  parallel(p.num_tokens * p.num_heads, 2 * kGrainRows, [&](int64_t begin, int64_t end) {
    float row[kIndexerHeadDim];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / p.num_heads, h = i % p.num_heads;
      load_row_f32(static_cast<const char*>(p.q) + (t * p.q_stride_t + h * p.q_stride_h) * esize, p.dtype, kIndexerHeadDim, row);
      const int64_t nope = kIndexerHeadDim - kIndexerRopeDim;
      rope_rotate(row + nope, p.rope, index_at(p.positions, t), 1.0f);
      for (int64_t d = nope; d < kIndexerHeadDim; ++d) row[d] = round_bf16(row[d]);
      if (p.query_format == IndexerFormat::mxfp4) {
        mxfp4_store(row, kIndexerHeadDim, p.q_fp8 + i * kIndexerFp4DataBytes, p.q_scale_out + i * kIndexerFp4ScaleBytes);
        p.weights_out[i] = p.weights[t * p.w_stride_t + h] * p.softmax_scale * p.head_scale;
        continue;
      }
      const int e = indexer_exponent(abs_max(row, kIndexerHeadDim));
      encode_e4m3_scaled(row, std::ldexp(1.0f, -e), kIndexerHeadDim, p.q_fp8 + i * kIndexerHeadDim);
      p.weights_out[i] = p.weights[t * p.w_stride_t + h] * std::ldexp(1.0f, e) * p.softmax_scale * p.head_scale;
    }
  });
}

}  // namespace dsv4::cpu::DSV4_ISA
