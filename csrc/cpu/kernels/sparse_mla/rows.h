// Attended rows of the sparse MLA kernels: where a row's bytes are, and staging it as a bf16 key row plus the
// pair-interleaved value layout that the P.V product reads.
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/records.h"
#include "cpu/kernels/sparse_mla/math.h"

namespace dsv4::cpu::DSV4_ISA {

constexpr int64_t kValueDim = 512;  // V is the first 512 dims of every row (both layouts)
constexpr int64_t kMaxQkDim = kV32NopeDim + kV32RopeDim;

// How an attended row is stored: one of the cache records, or a bf16 row (prefill).
enum class RowFormat { model1, v32, v41_fp8, v41_fp4, bf16 };

inline RowFormat row_format(KvLayout layout) {
  switch (layout) {
    case KvLayout::model1: return RowFormat::model1;
    case KvLayout::v32: return RowFormat::v32;
    case KvLayout::v41_fp8: return RowFormat::v41_fp8;
    default: return RowFormat::v41_fp4;
  }
}

inline KvLayout row_layout(RowFormat format) {
  switch (format) {
    case RowFormat::model1: return KvLayout::model1;
    case RowFormat::v32: return KvLayout::v32;
    case RowFormat::v41_fp8: return KvLayout::v41_fp8;
    default: return KvLayout::v41_fp4;
  }
}

// One attended row: a cache entry's data and scale bytes (common/records.h), or for bf16 rows the row itself; main
// and extra rows of one query may be in different records.
struct AttendedRow {
  const uint8_t* data;
  const uint8_t* scales;
  RowFormat format;
};

// Row of a paged cache at slot, or false when the slot is -1 or outside the cache.
inline bool cache_row(const PagedCache& cache, KvLayout layout, int64_t slot, AttendedRow* row) {
  const EntryBytes e = slot_entry(layout, cache, slot);
  *row = {e.data, e.scales, row_format(layout)};
  return e.data != nullptr;
}

constexpr int64_t kCacheLine = 64;

// Starts loading a row's bytes into the cache (kLocality 3: L1, 2: L2): rows sit at random places, so the hardware
// cannot guess them.
template <int kLocality = 3>
inline void prefetch_row(const AttendedRow& row, int64_t d_qk) {
  int64_t bytes = d_qk * int64_t(sizeof(uint16_t));
  if (row.format != RowFormat::bf16) {
    const RecordBytes r = record_bytes(row_layout(row.format));
    const bool per_token = row.scales == row.data + r.data;
    bytes = per_token ? r.data + r.scales : r.data;
    if (!per_token) prefetch_line<kLocality>(row.scales);  // page-split: the scales sit in the page's scale rows
  }
  for (int64_t b = 0; b < bytes; b += kCacheLine) prefetch_line<kLocality>(row.data + b);
}

inline void stage_row_scalar(const AttendedRow& row, int64_t d_qk, uint16_t* dst) {
  float values[kMaxQkDim];
  const EntryBytes e{const_cast<uint8_t*>(row.data), const_cast<uint8_t*>(row.scales)};
  switch (row.format) {
    case RowFormat::bf16: std::memcpy(dst, row.data, d_qk * sizeof(uint16_t)); return;
    case RowFormat::model1: model1_load(e, values); break;
    case RowFormat::v32: v32_load(row.data, values); break;
    case RowFormat::v41_fp8: v41_fp8_load(e, values); break;
    case RowFormat::v41_fp4: v41_fp4_load(e, values); break;
  }
  for (int64_t i = 0; i < d_qk; ++i) dst[i] = f32_to_bf16(values[i]);
}

#if defined(__AVX512BF16__)
constexpr float kE4m3BitsScale = 0x1p120f;  // the code bits moved into an fp32 (below) are 2^-120 of the value
constexpr float kFoldLimit = 0x1p7f;  // scales below this fold into kE4m3BitsScale without overflow
constexpr uint32_t kE4m3MagnitudeBits = 0x07f00000u, kE4m3SignAndMagnitudeBits = 0x87f00000u;
constexpr int kE4m3ShiftToFp32 = 20;

// 16 e4m3 codes as fp32 whose exponent and mantissa fields hold the code's (exact for subnormal codes too,
// after x 2^120); *nan marks the NaN codes (magnitude 0x7f).
inline __m512 e4m3x16_bits(const uint8_t* codes, __mmask16* nan) {
  const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512i bits =
      _mm512_and_si512(_mm512_slli_epi32(c, kE4m3ShiftToFp32), _mm512_set1_epi32(int(kE4m3SignAndMagnitudeBits)));
  const __m512i magnitude = _mm512_set1_epi32(int(kE4m3MagnitudeBits));
  *nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, magnitude), magnitude);
  return _mm512_castsi512_ps(bits);
}

// dst[i] = bf16(e4m3(codes[i]) * scale) for n codes (a multiple of 32), rounded once in fp32 like the scalar path.
template <bool kFolded>
inline void stage_e4m3_run(const uint8_t* codes, int64_t n, __m512 m1, __m512 m2, uint16_t* dst) {
  const __m512 nan = _mm512_set1_ps(NAN);
  for (int64_t i = 0; i < n; i += 32) {
    __mmask16 nan0, nan1;
    __m512 y0 = _mm512_mul_ps(e4m3x16_bits(codes + i, &nan0), m1);
    __m512 y1 = _mm512_mul_ps(e4m3x16_bits(codes + i + 16, &nan1), m1);
    if (!kFolded) y0 = _mm512_mul_ps(y0, m2), y1 = _mm512_mul_ps(y1, m2);
    y0 = _mm512_mask_mov_ps(y0, nan0, nan);
    y1 = _mm512_mask_mov_ps(y1, nan1, nan);
    _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(y1, y0));
  }
}

inline void stage_e4m3_tile(const uint8_t* codes, int64_t n, float scale, uint16_t* dst) {
  if (!(std::fabs(scale) >= kFoldLimit))  // NaN folds too: it stays NaN either way
    stage_e4m3_run<true>(codes, n, _mm512_set1_ps(scale * kE4m3BitsScale), _mm512_set1_ps(1.0f), dst);
  else
    stage_e4m3_run<false>(codes, n, _mm512_set1_ps(kE4m3BitsScale), _mm512_set1_ps(scale), dst);
}

// 2^(b - 127) for a UE8M0 scale byte b (255 is NaN), as model1_load computes it.
inline float ue8m0_scale(uint8_t b) {
  constexpr uint8_t kNanByte = 255;
  if (b == kNanByte) return NAN;
  return b == 0 ? 0x1p-127f : bits_f32(uint32_t(b) << 23);  // byte 0 is the denormal 2^-127
}

// UE8M0-scaled tiles (MODEL1, V4.1 fp8) of n codes (a multiple of 32) whose scale byte is in [kDirectScaleMin,
// kDirectScaleMax] decode straight to bf16 bits: every nonzero e4m3 value times the scale is then a normal bf16
// (subnormal codes need b >= 10, normal ones b <= 246).
constexpr int kDirectScaleMin = 10, kDirectScaleMax = 246;
inline void stage_ue8m0_tile(const uint8_t* codes, int64_t n, uint8_t scale_byte, uint16_t* dst) {
  if (scale_byte < kDirectScaleMin || scale_byte > kDirectScaleMax) {
    stage_e4m3_tile(codes, n, ue8m0_scale(scale_byte), dst);
    return;
  }
  static const __m512i subnormal_table = e4m3_subnormal_bf16();
  const __m512i bias = _mm512_set1_epi16(int16_t((scale_byte - kE4m3ExponentBias) << kBf16ExponentShift));
  constexpr __mmask32 kNonzeroSubnormals = 0xfe;  // table lanes 1-7; lane 0 (zero) stays 0
  // scale_byte - 127 is negative for scales below 1: multiplied, not shifted (a negative left shift is UB).
  const __m512i subnormals = _mm512_mask_add_epi16(
      subnormal_table, kNonzeroSubnormals, subnormal_table,
      _mm512_set1_epi16(int16_t((scale_byte - kUe8m0Bias) * (1 << kBf16ExponentShift))));
  for (int64_t i = 0; i < n; i += 32) _mm512_storeu_si512(dst + i, e4m3x32_direct(codes + i, bias, subnormals));
}

// V4.1 fp4 row: per pair of 16-dim tiles, 16 bytes of nibbles -> 32 e2m1 values (a table lookup) times the tiles'
// e4m3 scales, exact in fp32 and in bf16.
inline void stage_v41_fp4(const uint8_t* data, const uint8_t* scales, uint16_t* dst) {
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                      -2.0f, -3.0f, -4.0f, -6.0f);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  for (int64_t t = 0; t < kV41Fp4Tiles; t += 2) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + t * kV41Fp4Tile / 2));
    const __m128i lo = _mm_and_si128(bytes, nibble), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    const __m512 v0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), table);
    const __m512 v1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), table);
    const __m512 y0 = _mm512_mul_ps(v0, _mm512_set1_ps(e4m3_to_f32(scales[t])));
    const __m512 y1 = _mm512_mul_ps(v1, _mm512_set1_ps(e4m3_to_f32(scales[t + 1])));
    _mm512_storeu_si512(dst + t * kV41Fp4Tile, (__m512i)_mm512_cvtne2ps_pbh(y1, y0));
  }
}

inline void stage_row(const AttendedRow& row, int64_t d_qk, uint16_t* dst) {
  switch (row.format) {
    case RowFormat::model1:
      for (int64_t t = 0; t < kModel1Tiles; ++t)
        stage_ue8m0_tile(row.data + t * kModel1Tile, kModel1Tile, row.scales[t], dst + t * kModel1Tile);
      std::memcpy(dst + kModel1NopeDim, row.data + kModel1NopeDim, kModel1RopeDim * sizeof(uint16_t));
      break;
    case RowFormat::v32: {
      float scales[kV32Tiles];
      std::memcpy(scales, row.data + kV32NopeDim, sizeof(scales));
      for (int64_t t = 0; t < kV32Tiles; ++t)
        stage_e4m3_tile(row.data + t * kV32Tile, kV32Tile, scales[t], dst + t * kV32Tile);
      std::memcpy(dst + kV32NopeDim, row.data + kV32NopeDim + sizeof(scales), kV32RopeDim * sizeof(uint16_t));
      break;
    }
    case RowFormat::v41_fp8:
      for (int64_t t = 0; t < kV41Fp8Tiles; ++t)
        stage_ue8m0_tile(row.data + t * kV41Fp8Tile, kV41Fp8Tile, row.scales[t], dst + t * kV41Fp8Tile);
      break;
    case RowFormat::v41_fp4: stage_v41_fp4(row.data, row.scales, dst); break;
    case RowFormat::bf16: std::memcpy(dst, row.data, d_qk * sizeof(uint16_t)); break;
  }
}
#else
inline void stage_row(const AttendedRow& row, int64_t d_qk, uint16_t* dst) { stage_row_scalar(row, d_qk, dst); }
#endif

// values[d][j] = (a, b)[j][d] for d < 512: the bf16 pair of rows a, b that one P.V step consumes.
inline void interleave_value_pair(const uint16_t* a, const uint16_t* b, uint16_t* values) {
#if defined(__AVX512BF16__)
  static const InterleaveIndex index;
  for (int64_t d = 0; d < kValueDim; d += 32) {
    const __m512i va = _mm512_loadu_si512(a + d), vb = _mm512_loadu_si512(b + d);
    _mm512_storeu_si512(values + 2 * d, _mm512_permutex2var_epi16(va, index.lo, vb));
    _mm512_storeu_si512(values + 2 * d + 32, _mm512_permutex2var_epi16(va, index.hi, vb));
  }
#else
  for (int64_t d = 0; d < kValueDim; ++d) values[2 * d] = a[d], values[2 * d + 1] = b[d];
#endif
}

}  // namespace dsv4::cpu::DSV4_ISA
