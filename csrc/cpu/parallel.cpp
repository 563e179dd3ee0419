// The only place CPU kernels reach torch's intra-op thread pool.
#include <torch/csrc/stable/ops.h>

#include "cpu/kernel_table.h"

namespace dsv4::cpu {

void parallel_for(int64_t begin, int64_t end, int64_t grain, RangeFn fn, void* ctx) {
  torch::stable::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { fn(ctx, b, e); });
}

}  // namespace dsv4::cpu
