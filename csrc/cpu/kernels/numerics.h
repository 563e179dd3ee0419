// Scalar and vector numerics shared by the CPU kernels of one tier, and what every kernel header starts from: the
// standard and intrinsics headers, the parameter structs, the record geometry and the tier's namespace name.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/cache_layouts.h"
#include "common/params.h"
#include "cpu/kernel_table.h"

// CMake names the tier (-DDSV4_ISA=<isa>) in every translation unit of a tier; a header opened on its own (an
// editor, a syntax check) is read as the generic tier.
#ifndef DSV4_ISA
#define DSV4_ISA generic
#endif

namespace dsv4::cpu::DSV4_ISA {

constexpr float kFp8Max = 448.0f;
constexpr float kScaleFloor = 1e-4f;  // MODEL1/V32 tiles: floor of amax / 448
constexpr float kIndexerAmaxFloor = 1e-4f;  // indexer K/Q: floor of amax
constexpr float kFp8MinNormal = 0.015625f;  // 2^-6

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) return bits_f32(sign) + (sign ? -1.0f : 1.0f) * std::ldexp(float(man), -24);
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
inline uint16_t f32_to_f16(float f) {  // round to nearest even
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return uint16_t(sign | 0x7e00u);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00u);
  if (a < 6.103515625e-05f) return uint16_t(sign | uint16_t(std::nearbyint(a * 16777216.0f)));
  uint32_t b = f32_bits(a);
  b += 0xfffu + ((b >> 13) & 1u);
  return uint16_t(sign | uint16_t((b >> 13) - (112u << 10)));
}

// Row conversions with the dtype switch hoisted out of the loop, so each loop vectorizes.
inline void load_row_f32(const void* p, DType dtype, int64_t n, float* dst) {
  const uint16_t* half = static_cast<const uint16_t*>(p);
  switch (dtype) {
    case DType::bf16: for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(half[i]); break;
    case DType::f16: for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(half[i]); break;
    default: std::memcpy(dst, p, n * sizeof(float));
  }
}
inline void store_row_from_f32(void* p, DType dtype, int64_t n, const float* src) {
  uint16_t* half = static_cast<uint16_t*>(p);
  switch (dtype) {
    case DType::bf16: for (int64_t i = 0; i < n; ++i) half[i] = f32_to_bf16(src[i]); break;
    case DType::f16: for (int64_t i = 0; i < n; ++i) half[i] = f32_to_f16(src[i]); break;
    default: std::memcpy(p, src, n * sizeof(float));
  }
}

// Bytes per element of a float input or output.
inline int64_t dtype_bytes(DType d) { return d == DType::f32 ? 4 : 2; }

inline int64_t index_at(const IndexView& v, int64_t row, int64_t col = 0) {
  const int64_t i = row * v.row_stride + col * v.col_stride;
  return v.is_int64 ? static_cast<const int64_t*>(v.data)[i] : static_cast<const int32_t*>(v.data)[i];
}

// Exact ceil(log2(x)) for finite x > 0.
inline int ceil_log2(float x) {
  int e;
  const float m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return m == 0.5f ? e - 1 : e;
}

// Scale exponent of a MODEL1/V32 tile: ceil(log2(max(amax / 448, 1e-4))).
inline int tile_exponent(float amax) {
  const float q = amax / kFp8Max;
  return ceil_log2(q > kScaleFloor ? q : kScaleFloor);
}
// Scale exponent of an indexer K/Q vector: ceil(log2(max(amax, 1e-4) / 448)).
inline int indexer_exponent(float amax) {
  return ceil_log2((amax > kIndexerAmaxFloor ? amax : kIndexerAmaxFloor) / kFp8Max);
}

// fp32 -> e4m3fn, round to nearest even, saturating at +-448, subnormals kept.
inline uint8_t f32_to_e4m3(float x) {
  const uint32_t sign = (f32_bits(x) >> 24) & 0x80u;
  float a = std::fabs(x);
  a = a < kFp8Max ? a : kFp8Max;
  uint32_t code;
  if (a < kFp8MinNormal) {
    code = uint32_t(std::nearbyint(a * 512.0f));  // multiples of 2^-9; 8 is the smallest normal
  } else {
    uint32_t b = f32_bits(a);
    b += 0x7ffffu + ((b >> 20) & 1u);
    code = (b >> 20) - (120u << 3);
  }
  return uint8_t(sign | code);
}

inline float e4m3_to_f32_exact(uint8_t c) {
  const uint32_t exp = (c >> 3) & 0xfu, man = c & 7u;
  float v;
  if (exp == 0) v = std::ldexp(float(man), -9);
  else if (exp == 15 && man == 7) v = NAN;
  else v = std::ldexp(float(8u + man), int(exp) - 10);
  return (c & 0x80u) ? -v : v;
}

// All 256 e4m3 values, built once: decoding is one table load.
struct E4m3Table {
  float value[256];
  E4m3Table() {
    for (int c = 0; c < 256; ++c) value[c] = e4m3_to_f32_exact(uint8_t(c));
  }
};
inline float e4m3_to_f32(uint8_t c) {
  static const E4m3Table table;
  return table.value[c];
}

inline float abs_max(const float* x, int64_t n) {
  int64_t i = 0;
  float m = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(acc, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  m = _mm512_reduce_max_ps(acc);
#elif defined(__AVX2__)
  const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_and_ps(mask, _mm256_loadu_ps(x + i)));
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  for (float l : lanes) m = l > m ? l : m;
#endif
  for (; i < n; ++i) m = std::fabs(x[i]) > m ? std::fabs(x[i]) : m;
  return m;
}

inline float sum_squares(const float* x, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  for (float l : lanes) s += l;
#endif
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

#if defined(__AVX512F__)
// 16 lanes of f32_to_e4m3 (bit-identical to the scalar encoder).
inline __m128i e4m3_encode16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
  const __m512 a = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(kFp8Max));
  const __m512i sub = _mm512_cvtps_epi32(_mm512_roundscale_ps(
      _mm512_mul_ps(a, _mm512_set1_ps(512.0f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m512i b = _mm512_castps_si512(a);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 20), _mm512_set1_epi32(1));
  b = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff), lsb));
  const __m512i norm = _mm512_sub_epi32(_mm512_srli_epi32(b, 20), _mm512_set1_epi32(120 << 3));
  const __mmask16 is_sub = _mm512_cmp_ps_mask(a, _mm512_set1_ps(kFp8MinNormal), _CMP_LT_OQ);
  const __m512i code = _mm512_or_si512(_mm512_mask_blend_epi32(is_sub, norm, sub), sign);
  return _mm512_cvtepi32_epi8(code);
}
#endif

#if defined(__AVX512F__)
// 16 lanes of exp(x) for finite x (about 1 ulp): x = n ln2 + r, |r| <= ln2 / 2, degree-7 Taylor in r.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), _mm512_min_ps(_mm512_set1_ps(88.0f), x));  // NaN passes through
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);  // Cody-Waite split of ln 2
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  static const float taylor[] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
  __m512 poly = _mm512_set1_ps(1.0f / 5040.0f);
  for (float c : taylor) poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(poly, n);
}
#endif

#if defined(__AVX512BW__)
constexpr int kBf16ExponentShift = 7, kE4m3ToBf16Shift = 4, kE4m3ExponentBias = 7, kUe8m0Bias = 127;
constexpr int kE4m3SubnormalCodes = 8;  // magnitudes 0-7: zero and the subnormals m * 2^-9
constexpr uint16_t kBf16Nan = 0x7fc0, kBf16Sign = 0x8000, kE4m3Magnitude = 0x7f;

// bf16 bits of e4m3 magnitudes 0-7 (0, then m * 2^-9) at scale byte 127, in the first 8 of 32 word lanes.
inline __m512i e4m3_subnormal_bf16() {
  alignas(64) uint16_t table[32] = {};
  for (int m = 1; m < kE4m3SubnormalCodes; ++m) table[m] = f32_to_bf16(std::ldexp(float(m), -9));
  return _mm512_load_si512(table);
}

// 32 e4m3 codes times 2^(b - 127) as bf16: normal codes by moving their bits (the exponent rebased by
// bias = (b - 7) << 7), zero and subnormals from the small table rebased by (b - 127) << 7, NaN kept.
inline __m512i e4m3x32_direct(const uint8_t* codes, __m512i bias, __m512i subnormals) {
  const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
  const __m512i magnitude = _mm512_and_si512(x, _mm512_set1_epi16(kE4m3Magnitude));
  __m512i bits = _mm512_add_epi16(_mm512_slli_epi16(magnitude, kE4m3ToBf16Shift), bias);
  const __mmask32 small = _mm512_cmplt_epu16_mask(magnitude, _mm512_set1_epi16(kE4m3SubnormalCodes));
  bits = _mm512_mask_permutexvar_epi16(bits, small, magnitude, subnormals);
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(magnitude, _mm512_set1_epi16(kE4m3Magnitude));
  bits = _mm512_mask_mov_epi16(bits, nan, _mm512_set1_epi16(int16_t(kBf16Nan)));
  constexpr int kOrAnd = 0xf8;  // a | (b & c)
  return _mm512_ternarylogic_epi32(bits, x, _mm512_set1_epi16(int16_t(kBf16Sign)), kOrAnd);
}
#endif

// out[i] = e4m3(x[i] * mult) for i < n.
inline void encode_e4m3_scaled(const float* x, float mult, int64_t n, uint8_t* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 m = _mm512_set1_ps(mult);
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), e4m3_encode16(_mm512_mul_ps(_mm512_loadu_ps(x + i), m)));
#endif
  for (; i < n; ++i) out[i] = f32_to_e4m3(x[i] * mult);
}

// GPT-J (interleaved) rotation of x[0:rope_dim] in place at table row pos; sign -1 inverts it.
inline void rope_rotate(float* x, const RopeTable& rope, int64_t pos, float sign) {
  const int64_t half = rope.rope_dim / 2;
  const float* cos_row = rope.data + pos * rope.row_stride;
  const float* sin_row = cos_row + half;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cos_row[i], s = sign * sin_row[i];
    const float e = x[2 * i], o = x[2 * i + 1];
    x[2 * i] = e * c - o * s;
    x[2 * i + 1] = e * s + o * c;
  }
}

// Rows of ~512 values per parallel chunk at least: waking a second thread costs more than a few rows.
constexpr int64_t kGrainRows = 64;

constexpr int64_t kBufferAlign = 64;

// A grow-only, 64-byte aligned byte buffer: a thread's scratch, kept across calls (an allocation per call costs
// page faults and, zeroed, a memset of the whole buffer).
struct ScratchBuffer {
  uint8_t* memory = nullptr;
  int64_t capacity = 0;
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { delete[] memory; }
  // At least `bytes` bytes; a buffer that grows is zero-filled when `zero` is set (what it held before is not).
  uint8_t* reserve(int64_t bytes, bool zero = false) {
    if (bytes > capacity) {
      delete[] memory;
      memory = zero ? new uint8_t[bytes + kBufferAlign]() : new uint8_t[bytes + kBufferAlign];
      capacity = bytes;
    }
    const uintptr_t address = reinterpret_cast<uintptr_t>(memory);
    return memory + (kBufferAlign - address % kBufferAlign) % kBufferAlign;
  }
};

// Starts loading the cache line at p (kLocality 3: into L1, 2: into L2). An asm statement, not __builtin_prefetch:
// gcc 12 drops the builtin where it inlines a call whose addresses it can work out (it sees no effect).
template <int kLocality = 3>
inline void prefetch_line(const void* p) {
#if defined(__x86_64__)
  if (kLocality >= 3) asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
  else asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, kLocality);
#endif
}

// Run f(begin, end) over [0, n) on torch's intra-op pool; ranges of at most grain items run inline.
template <class F>
inline void parallel(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  auto trampoline = [](void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); };
  dsv4::cpu::parallel_for(0, n, grain, trampoline, const_cast<F*>(&f));
}

}  // namespace dsv4::cpu::DSV4_ISA
