// PTX building blocks of the Hopper tier: cp.async gathers, the async-proxy fence that makes
// plain shared-memory stores visible to wgmma, and the e4m3 / bf16 packed conversions.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#define DSV4_SM90_DEVICE __device__ __forceinline__

namespace dsv4::cuda::sm90 {

DSV4_SM90_DEVICE uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Asynchronous 4- / 8- / 16-byte global -> shared copies (both ends aligned to the size), completed by
// cp_async_wait_all; the 16-byte one bypasses L1 (gathered rows are read once).
DSV4_SM90_DEVICE void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
DSV4_SM90_DEVICE void cp_async_8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}
DSV4_SM90_DEVICE void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
DSV4_SM90_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
DSV4_SM90_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits for all but the kPending most recently committed groups.
template <int kPending>
DSV4_SM90_DEVICE void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Shared-memory barriers (mbarrier) with phase parity: init once, then arrive / wait per phase.
DSV4_SM90_DEVICE void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
DSV4_SM90_DEVICE void mbarrier_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives once all of this thread's earlier cp.async copies have landed (counted in the barrier's init count).
DSV4_SM90_DEVICE void cp_async_mbarrier_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Whether the phase of parity `parity` has completed (a test: never waits).
DSV4_SM90_DEVICE bool mbarrier_ready(uint32_t bar, uint32_t parity) {
  uint32_t ready;
  asm volatile(
      "{\n.reg .pred done;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 done, [%1], %2;\n"
      "selp.u32 %0, 1, 0, done;\n}\n"
      : "=r"(ready)
      : "r"(bar), "r"(parity)
      : "memory");
  return ready != 0;
}
// Pulls the line holding `address` into L2 (a hint: nothing waits for it).
DSV4_SM90_DEVICE void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
}
// Waits until the phase of parity `parity` has completed.
DSV4_SM90_DEVICE void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Arrives and adds `bytes` to the transactions the current phase waits for (bulk copies complete them).
DSV4_SM90_DEVICE void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Makes barrier initialisations visible to the async proxy (bulk copies) before first use.
DSV4_SM90_DEVICE void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// Bulk global -> shared copy of `bytes` (multiple of 16, both ends 16-byte aligned), completing on barrier `bar`.
DSV4_SM90_DEVICE void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Tensor copy of the box at coordinates (c0, c1, c2, c3) of a 4-D tensor map into shared memory at dst (the map's
// swizzle), completing on barrier `bar`; `map` is the address of a __grid_constant__ kernel parameter.
DSV4_SM90_DEVICE void tensor_copy_4d(uint32_t dst, const void* map, int c0, int c1, int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Bulk shared -> global copy of `bytes` (multiple of 16, both ends 16-byte aligned) in this thread's bulk group;
// bulk_wait_all waits for the thread's groups to complete.
DSV4_SM90_DEVICE void bulk_copy_to_global(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
DSV4_SM90_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
DSV4_SM90_DEVICE void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Orders this thread's earlier shared-memory stores before later wgmma reads of them (after a barrier).
DSV4_SM90_DEVICE void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// (lo, hi) -> bf16x2, round to nearest even; lo in the low half.
DSV4_SM90_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Lane-wise bf16x2 product, rounded to nearest even (subnormals kept).
DSV4_SM90_DEVICE uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
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
