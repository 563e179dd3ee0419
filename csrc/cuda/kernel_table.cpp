// The CUDA kernel table: wraps each launcher with the current stream and a launch-status check, and picks the
// tier of sparse decode and the paged indexer (Hopper on compute capability 9.0 when built, else portable;
// DSV4_CUDA_TIER=portable forces it).
#include "cuda/kernel_table.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "common/error.h"
#include "cuda/launchers.h"

namespace dsv4::cuda {
namespace {

cudaStream_t current_stream() {
  int device = 0;
  DSV4_REQUIRE(cudaGetDevice(&device) == cudaSuccess, "dsv4: cannot read the current CUDA device");
  void* stream = nullptr;
  DSV4_REQUIRE(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS,
                  "dsv4: cannot read the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

void check_launch(const char* op, cudaError_t status) {
  DSV4_REQUIRE(status == cudaSuccess, "dsv4::", op, ": CUDA kernel launch failed: ", cudaGetErrorString(status));
}

struct DeviceFacts {
  int sms = 0, major = 0, minor = 0;
};

const DeviceFacts& device_facts() {
  constexpr int kMaxDevices = 64;
  static DeviceFacts facts[kMaxDevices];
  int device = 0;
  DSV4_REQUIRE(cudaGetDevice(&device) == cudaSuccess && device < kMaxDevices, "dsv4: bad current CUDA device");
  DeviceFacts& f = facts[device];
  if (f.sms == 0) {  // benign race: every thread writes the same values
    (void)cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device);
    (void)cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, device);
    (void)cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device);
  }
  return f;
}

#if defined(DSV4_HAVE_SM90)
bool use_sm90() {
  const char* forced = std::getenv("DSV4_CUDA_TIER");
  if (forced != nullptr && std::strcmp(forced, "portable") == 0) return false;
  const DeviceFacts& f = device_facts();
  return f.major == 9 && f.minor == 0;
}
#endif

// A table entry: the op's launcher on the current stream, its status checked. The lambda is generic, so it converts
// to the entry's function-pointer type with the op's parameter struct.
#define DSV4_WRAP_0(name) [](const auto& p) { check_launch(#name, launch_##name(p, current_stream())); }

// A table entry with a Hopper kernel: the sm90 launcher on compute capability 9.0, else the portable one.
#if defined(DSV4_HAVE_SM90)
#define DSV4_WRAP_1(name)                                                                         \
  [](const auto& p) {                                                                             \
    const cudaStream_t stream = current_stream();                                                 \
    check_launch(#name, use_sm90() ? launch_##name##_sm90(p, stream) : launch_##name(p, stream)); \
  }
#else
#define DSV4_WRAP_1(name) DSV4_WRAP_0(name)
#endif

}  // namespace

const KernelTable& kernels() {
  static const KernelTable table{
      "cuda",
#define DSV4_CUDA_ENTRY(name, Params, hopper) DSV4_WRAP_##hopper(name),
      DSV4_OPS(DSV4_CUDA_ENTRY)
#undef DSV4_CUDA_ENTRY
  };
  return table;
}

int64_t num_sms() { return device_facts().sms; }

int64_t paged_topk_workspace_ctas(int64_t rows) {
  const int64_t ctas = 2 * num_sms();
  return rows < ctas ? rows : ctas;
}

}  // namespace dsv4::cuda
