// PTX building blocks of the Hopper tier: bf16 mma.sync m16n8k16 with its ldmatrix operand loads, 8-byte
// cp.async gathers, pair barriers, and the e4m3 / bf16 packed conversions.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#define DSV4_SM90_DEVICE __device__ __forceinline__

namespace dsv4::cuda::sm90 {

DSV4_SM90_DEVICE uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives it.
DSV4_SM90_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
// The same, each matrix transposed: rows in smem become the k dimension of a B operand.
DSV4_SM90_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a (16x16 bf16, row) * b (16x8 bf16, col), fp32 accumulators.
DSV4_SM90_DEVICE void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Asynchronous 8- / 16-byte global -> shared copies (both ends aligned to the size), completed by
// cp_async_wait_all; the 16-byte one bypasses L1 (gathered rows are read once).
DSV4_SM90_DEVICE void cp_async_8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}
DSV4_SM90_DEVICE void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
DSV4_SM90_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
DSV4_SM90_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Barrier of `threads` threads (a multiple of 32) on hardware barrier `id` (0 is __syncthreads').
DSV4_SM90_DEVICE void named_barrier(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// (lo, hi) -> bf16x2, round to nearest even; lo in the low half.
DSV4_SM90_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two e4m3 codes (low byte first) -> their exact fp32 values.
DSV4_SM90_DEVICE void e4m3x2_to_f32(uint16_t codes, float& lo, float& hi) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(codes));
  const uint16_t h_lo = uint16_t(halves & 0xffffu), h_hi = uint16_t(halves >> 16);
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(lo) : "h"(h_lo));
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(hi) : "h"(h_hi));
}

// UE8M0 scale byte b -> 2^(b - 127) (byte 0 is the fp32 denormal 2^-127, 255 is NaN).
DSV4_SM90_DEVICE float ue8m0_to_f32(uint8_t b) {
  constexpr uint8_t kNanByte = 255;
  constexpr uint32_t kTwoToMinus127 = 0x00400000u;
  if (b == kNanByte) return __uint_as_float(0x7fc00000u);
  return __uint_as_float(b == 0 ? kTwoToMinus127 : uint32_t(b) << 23);
}

}  // namespace dsv4::cuda::sm90
