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

DSV4_SM90_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DSV4_SM90_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
DSV4_SM90_DEVICE void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// d (64 x 32) += A (64 x 16, K-major smem) * B (16 x 32 given as 32 x 16 K-major smem).
DSV4_SM90_DEVICE void wgmma_64x32x16_ss(float (&d)[4][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      " %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a), "l"(b), "r"(1));
}

// d (64 x 64) += A (64 x 16, K-major smem) * B (16 x 64 given as 64 x 16 K-major smem).
DSV4_SM90_DEVICE void wgmma_64x64x16_ss(float (&d)[8][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      " %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "r"(1));
}

// d[kFirst .. kFirst + 8) += A (64 x 16 bf16 in registers, mma.sync A layout per warp) * B (16 x 64, N-major smem).
template <int kFirst, int kTiles>
DSV4_SM90_DEVICE void wgmma_64x64x16_rs_tn(float (&d)[kTiles][4], const uint32_t (&a)[4], uint64_t b) {
  static_assert(kFirst + 8 <= kTiles, "eight n8 tiles");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      " {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[kFirst + 0][0]), "+f"(d[kFirst + 0][1]), "+f"(d[kFirst + 0][2]), "+f"(d[kFirst + 0][3]),
        "+f"(d[kFirst + 1][0]), "+f"(d[kFirst + 1][1]), "+f"(d[kFirst + 1][2]), "+f"(d[kFirst + 1][3]),
        "+f"(d[kFirst + 2][0]), "+f"(d[kFirst + 2][1]), "+f"(d[kFirst + 2][2]), "+f"(d[kFirst + 2][3]),
        "+f"(d[kFirst + 3][0]), "+f"(d[kFirst + 3][1]), "+f"(d[kFirst + 3][2]), "+f"(d[kFirst + 3][3]),
        "+f"(d[kFirst + 4][0]), "+f"(d[kFirst + 4][1]), "+f"(d[kFirst + 4][2]), "+f"(d[kFirst + 4][3]),
        "+f"(d[kFirst + 5][0]), "+f"(d[kFirst + 5][1]), "+f"(d[kFirst + 5][2]), "+f"(d[kFirst + 5][3]),
        "+f"(d[kFirst + 6][0]), "+f"(d[kFirst + 6][1]), "+f"(d[kFirst + 6][2]), "+f"(d[kFirst + 6][3]),
        "+f"(d[kFirst + 7][0]), "+f"(d[kFirst + 7][1]), "+f"(d[kFirst + 7][2]), "+f"(d[kFirst + 7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// d (64 x 64) = A B + (accumulate ? d : 0), A (64 x 16 f16 in registers, mma.sync A layout per warp) * B (16 x 64 given as 64 x 16,
// K-major smem).
DSV4_SM90_DEVICE void wgmma_64x64x16_f16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b,
                                           uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// d (64 x 128) = A B + (accumulate ? d : 0), A (64 x 16 f16 in registers, mma.sync A layout per warp) * B (16 x 128 given as 128 x 16,
// K-major smem).
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
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

}  // namespace dsv4::cuda::sm90
