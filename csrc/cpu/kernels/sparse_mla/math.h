// Vector building blocks of the sparse MLA kernels: a 16x16 32-bit transpose, bf16 pair interleaving.
#pragma once
#include "cpu/kernels/numerics.h"

namespace dsv4::cpu::DSV4_ISA {

#if defined(__AVX512BF16__)
// r[i] element j <-> r[j] element i, for 16 vectors of 16 32-bit elements.
inline void transpose_16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // Per 128-bit lane, u[4g + c] now holds column c of rows 4g..4g+3.
  __m512i u[16];
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
  }
}

// The low (even) and high (odd) bf16 of every 32-bit lane, as fp32.
inline __m512 even_bf16(__m512i pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); }
inline __m512 odd_bf16(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(int(0xffff0000u))));
}

// 16 bf16 as fp32.
inline __m512 widen_bf16(__m256i x) { return even_bf16(_mm512_cvtepu16_epi32(x)); }

// 16-bit lane indices for _mm512_permutex2var_epi16(a, index, b): a0 b0 a1 b1 ... from elements 0-15 of a
// and b ("lo"), or from elements 16-31 ("hi"); the same shape with b at lanes 16-31 of one vector ("packed").
struct InterleaveIndex {
  __m512i lo, hi, packed;
  InterleaveIndex() {
    alignas(64) uint16_t lo_idx[32], hi_idx[32], packed_idx[32];
    for (int i = 0; i < 32; ++i) {
      const uint16_t from_b = i % 2 ? 32 : 0;
      lo_idx[i] = uint16_t(i / 2 + from_b);
      hi_idx[i] = uint16_t(i / 2 + 16 + from_b);
      packed_idx[i] = uint16_t(i / 2 + from_b / 2);
    }
    lo = _mm512_load_si512(lo_idx);
    hi = _mm512_load_si512(hi_idx);
    packed = _mm512_load_si512(packed_idx);
  }
};

// 32 bf16: a0 b0 a1 b1 ... a15 b15 from the fp32 vectors a and b (round to nearest even).
inline __m512i bf16_pairs(__m512 a, __m512 b, const InterleaveIndex& index) {
  const __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a in lanes 0-15, b in 16-31
  return _mm512_permutexvar_epi16(index.packed, ab);
}
#endif

}  // namespace dsv4::cpu::DSV4_ISA
