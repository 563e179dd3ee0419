// The CUDA kernel table (same shape as a CPU tier's) and the device facts the bindings need.
#pragma once
#include <cstdint>

#include "common/kernel_table.h"

namespace dsv4::cuda {

const KernelTable& kernels();
// Streaming multiprocessors of the current device.
int64_t num_sms();
// Columns of the per-CTA score workspace of the fused indexer, and how many CTAs (rows in flight) it has.
int64_t paged_topk_workspace_ctas(int64_t rows);

}  // namespace dsv4::cuda
