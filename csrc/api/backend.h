// The device a binding translation unit serves: the same csrc/api sources are compiled once into _C (CPU kernels)
// and once into _C_cuda (CUDA kernels, DSV4_BACKEND_CUDA). Only what differs between the two lives here.
#pragma once
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include "common/kernel_table.h"

#if defined(DSV4_BACKEND_CUDA)
#include "cuda/kernel_table.h"
#define DSV4_BACKEND_IMPL(m) STABLE_TORCH_LIBRARY_IMPL(dsv4, CUDA, m)
#else
#include "cpu/kernel_table.h"
#define DSV4_BACKEND_IMPL(m) STABLE_TORCH_LIBRARY_IMPL(dsv4, CPU, m)
#endif

namespace dsv4::api {

#if defined(DSV4_BACKEND_CUDA)
inline const KernelTable& backend_kernels() { return cuda::kernels(); }
// Index values live on the device: reading them on the host would synchronise, so range checks of values are
// skipped and the kernels treat an out-of-range slot or index as invalid instead.
constexpr bool kHostReadsValues = false;

// Makes the argument's device current (launches and the current stream follow it).
class DeviceScope {
 public:
  explicit DeviceScope(const torch::stable::Tensor& t) : guard_(t.get_device_index()) {}

 private:
  torch::stable::accelerator::DeviceGuard guard_;
};
#else
inline const KernelTable& backend_kernels() { return cpu::kernels(); }
constexpr bool kHostReadsValues = true;

class DeviceScope {
 public:
  explicit DeviceScope(const torch::stable::Tensor&) {}
};
#endif

}  // namespace dsv4::api
