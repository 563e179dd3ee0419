// The small helpers around attention: request-local positions -> global slot ids through a block table (-1 for
// anything unmapped), and the inverse GPT-J RoPE of the attention output's last rope_dim dims (V = K includes RoPE
// dims).
#pragma once
#include "cpu/kernels/numerics.h"

namespace dsv4::cpu::DSV4_ISA {

inline void map_local_to_global_slots(const MapLocalToGlobalSlotsParams& p) {
  parallel(p.rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t req = index_at(p.req_ids, r);
      for (int64_t c = 0; c < p.cols; ++c) {
        const int64_t local = index_at(p.local, r, c);
        const int64_t block = local >= 0 ? local / p.block_size : -1;
        int64_t slot = -1;
        if (block >= 0 && block < p.max_blocks && req >= 0 && req < p.num_reqs) {
          const int64_t page = index_at(p.block_table, req, block);
          if (page >= 0) slot = page * p.block_size + local % p.block_size;
        }
        if (p.out_is_int64) static_cast<int64_t*>(p.out)[r * p.cols + c] = slot;
        else static_cast<int32_t*>(p.out)[r * p.cols + c] = int32_t(slot);
      }
    }
  });
}

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
