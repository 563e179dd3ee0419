// Reading int32 / int64 index tensors, for host code and CUDA device code alike. Not for the CPU ISA tiers: they
// keep their own copy inside their namespace so no inline function is shared between tiers with different flags.
#pragma once
#include <cstdint>

#include "common/host_device.h"
#include "common/params.h"

namespace dsv4 {

// Element `at` of an int32 or int64 array, widened to int64.
DSV4_HOST_DEVICE inline int64_t load_index(const void* data, bool is_int64, int64_t at) {
  return is_int64 ? static_cast<const int64_t*>(data)[at] : static_cast<const int32_t*>(data)[at];
}

// Entry (row, col) of an index view.
DSV4_HOST_DEVICE inline int64_t index_at(const IndexView& v, int64_t row, int64_t col = 0) {
  return load_index(v.data, v.is_int64, row * v.row_stride + col * v.col_stride);
}

}  // namespace dsv4
