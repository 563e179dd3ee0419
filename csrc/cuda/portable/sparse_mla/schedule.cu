// The sparse-decode split planner on the device: one thread runs the shared sequential plan, so a plan costs one
// tiny launch and no host synchronisation (CUDA-graph safe).
#include "common/decode_schedule.h"
#include "cuda/launchers.h"

namespace dsv4::cuda {
namespace {

__global__ void decode_schedule_kernel(SparseMlaDecodeParams p) { plan_decode_schedule(p); }

}  // namespace

cudaError_t launch_sparse_mla_decode_schedule(const SparseMlaDecodeParams& p, cudaStream_t stream) {
  decode_schedule_kernel<<<1, 1, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
