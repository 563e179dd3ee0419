// Warpgroup MMA (wgmma, sm_90a) of the Hopper tier: 64 x N x 16 bf16 / f16 products with fp32 accumulators in the
// mma.sync C layout per warp (warp w of the warpgroup holds rows 16w .. 16w + 15; n8 tile t in d[t]), operands in
// 128-byte-swizzled shared tiles described by matrix descriptors.
#pragma once
#include <cstdint>

#include "cuda/sm90/warp_mma.cuh"

namespace dsv4::cuda::sm90 {

constexpr uint32_t kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes, 16-byte chunks XOR-permuted by the row

// Descriptor of a 128-byte-swizzled operand at shared address `address` (1024-aligned atoms): `leading` and
// `stride` are the byte strides between atoms (K-major: stride = next 8 rows; MN-major: leading = next 64
// columns, stride = next 8 k rows).
DSV4_SM90_DEVICE uint64_t swizzled_descriptor(uint32_t address, uint32_t leading, uint32_t stride) {
  constexpr uint64_t kSwizzle128 = 1;
  return uint64_t((address & 0x3ffff) >> 4) | uint64_t(leading >> 4) << 16 | uint64_t(stride >> 4) << 32 |
         kSwizzle128 << 62;
}

// Accumulator operand lists of the inline wgmma: n8 tile t of d is four fp32 registers; a list names n8 tiles
// first .. first + 3 (16 registers), first .. first + 7 (32) or first .. first + 15 (64).
#define DSV4_WGMMA_N8(d, t) "+f"(d[t][0]), "+f"(d[t][1]), "+f"(d[t][2]), "+f"(d[t][3])
#define DSV4_WGMMA_N32(d, f) \
  DSV4_WGMMA_N8(d, (f)), DSV4_WGMMA_N8(d, (f) + 1), DSV4_WGMMA_N8(d, (f) + 2), DSV4_WGMMA_N8(d, (f) + 3)
#define DSV4_WGMMA_N64(d, f) DSV4_WGMMA_N32(d, (f)), DSV4_WGMMA_N32(d, (f) + 4)
#define DSV4_WGMMA_N128(d, f) DSV4_WGMMA_N64(d, (f)), DSV4_WGMMA_N64(d, (f) + 8)

DSV4_SM90_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DSV4_SM90_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
DSV4_SM90_DEVICE void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// d (64 x 64) += A (64 x 16, K-major smem) * B (16 x 64 given as 64 x 16 K-major smem).
DSV4_SM90_DEVICE void wgmma_64x64x16_ss(float (&d)[8][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      " %32, %33, p, 1, 1, 0, 0;\n}\n"
      : DSV4_WGMMA_N64(d, 0)
      : "l"(a), "l"(b), "r"(1));
}

// d[kFirst .. kFirst + 16) += A (64 x 16 bf16 in registers, mma.sync A layout per warp) * B (16 x 128, N-major smem
// spanning two 64-column atoms).
template <int kFirst, int kTiles>
DSV4_SM90_DEVICE void wgmma_64x128x16_rs_tn(float (&d)[kTiles][4], const uint32_t (&a)[4], uint64_t b) {
  static_assert(kFirst + 16 <= kTiles, "sixteen n8 tiles");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : DSV4_WGMMA_N128(d, kFirst)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// d (64 x 64) = A B + (accumulate ? d : 0): A (64 x 16 f16 in registers, mma.sync A layout per warp), B (16 x 64
// given as 64 x 16, K-major smem).
DSV4_SM90_DEVICE void wgmma_64x64x16_f16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b,
                                           uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : DSV4_WGMMA_N64(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// d (64 x 128) = A B + (accumulate ? d : 0): A (64 x 16 f16 in registers, mma.sync A layout per warp), B (16 x 128
// given as 128 x 16, K-major smem).
DSV4_SM90_DEVICE void wgmma_64x128x16_f16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b,
                                           uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : DSV4_WGMMA_N128(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

}  // namespace dsv4::cuda::sm90
