// MXFP4 indexer keys and queries (DeepSeek-V4.1): per 32 dims one UE8M0 exponent and e2m1 codes, two per byte (even
// dim in the low nibble), written by DeepGEMM's rule (ties to the lower magnitude) and decoded exactly to bf16 or
// fp32. NaN has no e2m1 code: it is left out of its block's amax and stored as code 0; an infinite amax gives
// exponent 127. The indexer key store of either key format sits here too.
#pragma once
#include <cfloat>

#include "cpu/kernels/numerics.h"
#include "cpu/kernels/records.h"

namespace dsv4::cpu::DSV4_ISA {

constexpr float kMxfp4AmaxFloor = 6.0f * 0x1p-126f;  // exponents stay >= -126
constexpr float kMxfp4Max = 6.0f;
// Rounding boundaries between neighbouring e2m1 magnitudes; a value on one takes the lower code.
constexpr float kMxfp4Bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
constexpr float kMxfp4Grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
constexpr uint8_t kMxfp4NanScale = 255;  // a UE8M0 byte of 255 decodes as NaN

// Scale exponent of one block of 32: ceil(log2(max(amax, 6 * 2^-126) / 6)), clamped to [-127, 127].
inline int mxfp4_exponent(const float* x) {
  float amax = 0.0f;
  for (int i = 0; i < kMxfp4Block; ++i) amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;  // NaN left out
  amax = amax > kMxfp4AmaxFloor ? amax : kMxfp4AmaxFloor;
  if (!(amax <= FLT_MAX)) return 127;
  const int e = ceil_log2(amax / kMxfp4Max);
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// e2m1 code of y: nearest magnitude, ties to the lower one, saturating at 6; NaN -> 0; no sign on a zero magnitude.
inline uint8_t mxfp4_code(float y) {
  const float a = std::fabs(y);
  uint8_t m = 0;
  for (float bound : kMxfp4Bounds) m += a > bound ? 1 : 0;
  return m != 0 && std::signbit(y) ? uint8_t(m | 8) : m;
}

// dim values (a multiple of 32) -> dim / 2 code bytes and dim / 32 UE8M0 bytes.
inline void mxfp4_store(const float* x, int64_t dim, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < dim / kMxfp4Block; ++b) {
    const float* block = x + b * kMxfp4Block;
    const int e = mxfp4_exponent(block);
    scales[b] = uint8_t(e + 127);
    for (int i = 0; i < kMxfp4Block; i += 2)  // ldexp scales exactly (no denormal multiplier)
      codes[b * kMxfp4Block / 2 + i / 2] =
          uint8_t(mxfp4_code(std::ldexp(block[i], -e)) | mxfp4_code(std::ldexp(block[i + 1], -e)) << 4);
  }
}

// Decoded values of the 16 codes at each of the 256 scale bytes, in fp32 and bf16 bits (exact: at most two
// significant bits), built once.
struct Mxfp4Table {
  float value[256][16];
  alignas(64) uint16_t bf16[256][32];  // 16 used; padded to a 64-byte vector
  Mxfp4Table() {
    for (int s = 0; s < 256; ++s)
      for (int c = 0; c < 32; ++c) {
        const float v = kMxfp4Grid[c & 7] * ((c & 8) ? -1.0f : 1.0f);
        const float x = s == kMxfp4NanScale ? NAN : std::ldexp(v, s - 127);
        if (c < 16) value[s][c] = x;
        bf16[s][c] = c < 16 ? f32_to_bf16(x) : 0;
      }
  }
};
inline const Mxfp4Table& mxfp4_table() {
  static const Mxfp4Table table;
  return table;
}

// dim values of dim / 2 code bytes and dim / 32 scale bytes, as bf16 bits.
inline void decode_mxfp4_row_bf16(const uint8_t* codes, const uint8_t* scales, int64_t dim, uint16_t* dst) {
  const Mxfp4Table& t = mxfp4_table();
  for (int64_t b = 0; b < dim / kMxfp4Block; ++b) {
    const uint8_t* c = codes + b * kMxfp4Block / 2;
    uint16_t* out = dst + b * kMxfp4Block;
#if defined(__AVX512BW__)
    // 16 bytes -> 32 word indices (low nibble, then high nibble, of each byte), looked up in the scale's 16 values.
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    const __m512i lo = _mm512_and_si512(bytes, _mm512_set1_epi32(0xf));
    const __m512i hi = _mm512_slli_epi32(_mm512_srli_epi32(bytes, 4), 16);
    const __m512i lut = _mm512_load_si512(t.bf16[scales[b]]);
    _mm512_storeu_si512(out, _mm512_permutexvar_epi16(_mm512_or_si512(lo, hi), lut));
#else
    const uint16_t* lut = t.bf16[scales[b]];
    for (int i = 0; i < kMxfp4Block / 2; ++i) out[2 * i] = lut[c[i] & 0xf], out[2 * i + 1] = lut[c[i] >> 4];
#endif
  }
}

inline void decode_mxfp4_row_f32(const uint8_t* codes, const uint8_t* scales, int64_t dim, float* dst) {
  const Mxfp4Table& t = mxfp4_table();
  for (int64_t b = 0; b < dim / kMxfp4Block; ++b) {
    const float* lut = t.value[scales[b]];
    const uint8_t* c = codes + b * kMxfp4Block / 2;
    for (int i = 0; i < kMxfp4Block / 2; ++i)
      dst[b * kMxfp4Block + 2 * i] = lut[c[i] & 0xf], dst[b * kMxfp4Block + 2 * i + 1] = lut[c[i] >> 4];
  }
}

// One indexer key of 128 bf16-rounded values at entry off of a page, in its key format.
inline void indexer_key_store(IndexerFormat format, uint8_t* page, int64_t block_size, int64_t off, const float* x) {
  if (format == IndexerFormat::mxfp4)
    mxfp4_store(x, kIndexerHeadDim, page + off * kIndexerFp4DataBytes,
                page + block_size * kIndexerFp4DataBytes + off * kIndexerFp4ScaleBytes);
  else
    indexer_k_store(page, block_size, off, x);
}

}  // namespace dsv4::cpu::DSV4_ISA
