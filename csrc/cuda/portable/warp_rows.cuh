// Warp-per-row kernels of the portable tier: a warp owns one row at a time and keeps it lane-strided in registers
// (lane l holds elements l, l + kWarpSize, l + 2 * kWarpSize, ...), so 64- and 128-wide tiles are whole register
// steps reduced across the warp, and the GPT-J pair (2i, 2i + 1) sits in two neighbouring lanes.
#pragma once
#include "cuda/portable/common.cuh"

namespace dsv4::cuda {

constexpr int kRowBlockThreads = 256;  // a multiple of 64: whole wavefronts on AMD
constexpr int kRowsPerBlock = kRowBlockThreads / kWarpSize;
constexpr int64_t kMaxGridBlocks = 65536;  // larger launches loop (grid-stride)
constexpr int kRopeDim = 64;  // the RoPE width of every cache writer (the bindings check the table)

// Register steps per lane of an n-element row.
template <int N>
constexpr int lane_steps() {
  static_assert(N % 64 == 0, "rows must split evenly over 32- and 64-lane warps");
  return N / kWarpSize;
}

// Blocks of a grid-stride launch over `items` with `per_block` items per block (at least one block).
inline unsigned grid_blocks(int64_t items, int64_t per_block) {
  const int64_t blocks = ceil_div(items, per_block);
  return unsigned(blocks < kMaxGridBlocks ? blocks : kMaxGridBlocks);
}

DSV4_DEVICE int lane_id() { return int(threadIdx.x) % kWarpSize; }
// The first row of this warp and the distance to its next one, over a grid of kRowBlockThreads-thread blocks.
DSV4_DEVICE int64_t first_warp_row() { return int64_t(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kWarpSize; }
DSV4_DEVICE int64_t warp_row_step() { return int64_t(gridDim.x) * kRowsPerBlock; }

DSV4_DEVICE bool rope_row_valid(const RopeTable& rope, int64_t pos) { return pos >= 0 && pos < rope.rows; }

// x[j] = element first + j * kWarpSize + lane of a bf16 / f16 / f32 array.
template <int J>
DSV4_DEVICE void load_lanes(const void* base, DType dtype, int64_t first, float (&x)[J]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < J; ++j) x[j] = load_f32(base, dtype, first + j * kWarpSize + lane);
}

template <int J>
DSV4_DEVICE void store_lanes(void* base, DType dtype, int64_t first, const float (&x)[J]) {
  const int lane = lane_id();
#pragma unroll
  for (int j = 0; j < J; ++j) store_f32(base, dtype, first + j * kWarpSize + lane, x[j]);
}

// Rounds register steps [begin, end) to bf16.
template <int J>
DSV4_DEVICE void round_lanes_bf16(float (&x)[J], int begin, int end) {
#pragma unroll
  for (int j = 0; j < J; ++j)
    if (j >= begin && j < end) x[j] = round_bf16(x[j]);
}

// Max |x| over register steps [begin, begin + n) of the whole warp (every lane gets it).
template <int J>
DSV4_DEVICE float warp_abs_max(const float (&x)[J], int begin, int n) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < J; ++j)
    if (j >= begin && j < begin + n) m = fabsf(x[j]) > m ? fabsf(x[j]) : m;
  return warp_max(m);
}

// Sum of squares of the whole row (every lane gets it).
template <int J>
DSV4_DEVICE float warp_sum_squares(const float (&x)[J]) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < J; ++j) s = fmaf(x[j], x[j], s);
  return warp_sum(s);
}

// GPT-J rotation of elements [kStart, kStart + kRopeDim) at table row pos (sign -1 inverts it); the partner of
// an even element is the next lane's, of an odd one the previous lane's. Whole warp only (it shuffles).
template <int kStart, int J>
DSV4_DEVICE void rope_lanes(float (&x)[J], const RopeTable& rope, int64_t pos, float sign) {
  static_assert(kStart % kWarpSize == 0 && kRopeDim % kWarpSize == 0, "RoPE pairs must fill whole steps");
  constexpr int kFirst = kStart / kWarpSize, kSteps = kRopeDim / kWarpSize;
  static_assert(kFirst + kSteps <= J, "RoPE dims past the row");
  const int lane = lane_id();
  const float* cos_row = rope.data + pos * rope.row_stride;
#pragma unroll
  for (int j = kFirst; j < kFirst + kSteps; ++j) {
    const float partner = warp_xor(x[j], 1);
    const int i = ((j - kFirst) * kWarpSize + lane) / 2;
    const float c = cos_row[i], s = sign * cos_row[rope.rope_dim / 2 + i];
    x[j] = (lane & 1) ? partner * s + x[j] * c : x[j] * c - partner * s;
  }
}

}  // namespace dsv4::cuda
