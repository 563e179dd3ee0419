// Inverse GPT-J RoPE of the attention output's last rope_dim dims (V = K includes RoPE dims).
#pragma once
#include "cpu/kernels/numerics.h"

namespace dsv4::cpu::DSV4_ISA {

inline void inverse_rope(const InverseRopeParams& p) {
  const int64_t esize = dtype_bytes(p.dtype);
  parallel(p.num_tokens * p.num_heads, kGrainRows, [&](int64_t begin, int64_t end) {
    float row[kMaxInverseRopeHeadDim];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / p.num_heads, h = i % p.num_heads;
      load_row_f32(static_cast<const char*>(p.o) + (t * p.o_stride_t + h * p.o_stride_h) * esize, p.dtype, p.head_dim, row);
      rope_rotate(row + p.head_dim - p.rope.rope_dim, p.rope, index_at(p.positions, t), -1.0f);
      char* dst = static_cast<char*>(p.out) + i * p.head_dim * dtype_bytes(p.out_dtype);
      store_row_from_f32(dst, p.out_dtype, p.head_dim, row);
    }
  });
}

}  // namespace dsv4::cpu::DSV4_ISA
