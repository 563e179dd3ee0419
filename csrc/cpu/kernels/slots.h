// Request-local positions -> global slot ids through a block table; -1 for anything unmapped.
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

}  // namespace dsv4::cpu::DSV4_ISA
