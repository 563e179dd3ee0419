// The two products of sparse MLA attention on staged bf16 rows, per ISA: scores S^T = K Q^T (rows x heads,
// so the softmax runs across heads in vector lanes) and acc += P V. Layouts (all bf16 unless noted):
//   keys    [rows][d_qk]                   row-major staged rows (the AMX A operand)
//   qpack   [hp/16][d_qk/32][16][16][2]    Q^T in VNNI pairs, one 1 KiB tile per (head block, dim block);
//           AVX-512 tier: fp32 [hp/16][576][16] (dims past d_qk unused)
//   scores  fp32 [rows][hp]
//   probs   [hp][rows]                     P, row-major per head; AVX-512 tier: fp32 [rows][hp] holding bf16 values
//   values  [rows/2][512][2]               V in VNNI pairs (rows 2e, 2e+1 interleaved)
//   acc     fp32 [hp][512]
// rows is a multiple of kRowBlock; hp (heads padded) a multiple of kHeadBlock.
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/amx_tiles.h"
#include "cpu/kernels/sparse_mla/math.h"
#include "cpu/kernels/sparse_mla/rows.h"

namespace dsv4::cpu::DSV4_ISA {

// The avx512 tier's route (docs/design/cpu.md, "Which tier runs"): where vdpbf16ps issues at a quarter of
// vfmadd231ps's rate (Intel), it widens bf16 to fp32 (exactly) and multiplies with fp32 FMAs, twice the products
// per cycle; the avx512dot tier (DSV4_BF16_DOT, for CPUs where vdpbf16ps runs at the FMA rate: AMD Zen 4/5) keeps
// bf16 pairs and multiplies with vdpbf16ps, twice the products of an FMA.
#if defined(__AVX512BF16__) && !defined(__AMX_BF16__) && !defined(DSV4_BF16_DOT)
#define DSV4_F32_PRODUCTS 1
#endif

#if defined(DSV4_F32_PRODUCTS)
using QueryElement = float;
using ProbElement = float;
#else
using QueryElement = uint16_t;
using ProbElement = uint16_t;
#endif

constexpr int64_t kMaxHeads = 128;  // FlashMLA's limit; buffers are sized for it
constexpr int64_t kHeadBlock = 16;  // heads per packed query tile
constexpr int64_t kDimBlock = 32;  // bf16 dims per query tile (one tile-K step)
constexpr int64_t kRowBlock = 32;  // attended rows per P.V step (one tile-K step)
constexpr int64_t kQueryTile = kHeadBlock * kDimBlock;  // bf16 elements per packed query tile
constexpr int64_t kValuePairStride = 2 * kValueDim;  // bf16 elements per row of the values layout

// Offset of the packed query tile of (head block, dim block).
inline int64_t query_tile(int64_t d_qk, int64_t group, int64_t dim_block) {
  return (group * (d_qk / kDimBlock) + dim_block) * kQueryTile;
}

inline int32_t load_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Packs heads [0, heads) of q (bf16, head stride q_stride_h) into qpack; heads in [heads, hp) are zero.
inline void pack_query(const uint16_t* q, int64_t q_stride_h, int64_t heads, int64_t hp, int64_t d_qk,
                       QueryElement* qpack) {
  for (int64_t g = 0; g < hp / kHeadBlock; ++g) {
    for (int64_t k = 0; k < d_qk / kDimBlock; ++k) {
#if defined(__AVX512BF16__)
      __m512i r[kHeadBlock];
      for (int64_t i = 0; i < kHeadBlock; ++i) {
        const int64_t h = g * kHeadBlock + i;
        r[i] = h < heads ? _mm512_loadu_si512(q + h * q_stride_h + k * kDimBlock) : _mm512_setzero_si512();
      }
      transpose_16x16_epi32(r);  // r[pair]: the 16 heads' dims 2 pair, 2 pair + 1
#if !defined(DSV4_F32_PRODUCTS)
      uint16_t* tile = qpack + query_tile(d_qk, g, k);
      for (int64_t i = 0; i < kHeadBlock; ++i) _mm512_storeu_si512(tile + i * kDimBlock, r[i]);
#else
      float* dims = qpack + (g * kMaxQkDim + k * kDimBlock) * kHeadBlock;
      for (int64_t pair = 0; pair < kDimBlock / 2; ++pair) {
        _mm512_storeu_ps(dims + 2 * pair * kHeadBlock, even_bf16(r[pair]));
        _mm512_storeu_ps(dims + (2 * pair + 1) * kHeadBlock, odd_bf16(r[pair]));
      }
#endif
#else
      uint16_t* tile = qpack + query_tile(d_qk, g, k);
      for (int64_t pair = 0; pair < kDimBlock / 2; ++pair)
        for (int64_t i = 0; i < kHeadBlock; ++i)
          for (int64_t j = 0; j < 2; ++j) {
            const int64_t h = g * kHeadBlock + i;
            tile[pair * kDimBlock + 2 * i + j] = h < heads ? q[h * q_stride_h + k * kDimBlock + 2 * pair + j] : 0;
          }
#endif
    }
  }
}

#if defined(__AMX_BF16__)
// Tiles 0-3 accumulate a 2x2 block of 16x16 fp32 outputs, 4-5 hold A, 6-7 hold B.
inline void configure_attention_tiles() { configure_full_tiles(8); }

inline void attention_scores(const uint16_t* keys, int64_t d_qk, int64_t rows, const uint16_t* qpack, int64_t hp,
                             float* out) {
  asm volatile("" : : : "memory");  // tile loads are asm without a memory clobber: flush the staged rows first
  const int64_t groups = hp / kHeadBlock, key_bytes = d_qk * 2, out_bytes = hp * 4;
  for (int64_t g = 0; g < groups; g += 2) {
    const bool two = g + 1 < groups;
    for (int64_t i = 0; i < rows; i += kRowBlock) {
      const uint16_t* a = keys + i * d_qk;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = 0; k < d_qk / kDimBlock; ++k) {
        _tile_loadd(4, a + k * kDimBlock, key_bytes);
        _tile_loadd(5, a + kHeadBlock * d_qk + k * kDimBlock, key_bytes);
        _tile_loadd(6, qpack + query_tile(d_qk, g, k), kDimBlock * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (two) {
          _tile_loadd(7, qpack + query_tile(d_qk, g + 1, k), kDimBlock * 2);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      float* c = out + i * hp + g * kHeadBlock;
      _tile_stored(0, c, out_bytes);
      _tile_stored(2, c + kHeadBlock * hp, out_bytes);
      if (two) {
        _tile_stored(1, c + kHeadBlock, out_bytes);
        _tile_stored(3, c + kHeadBlock * hp + kHeadBlock, out_bytes);
      }
    }
  }
}

inline void accumulate_values(const uint16_t* probs, int64_t rows, const uint16_t* values, int64_t hp, float* acc) {
  asm volatile("" : : : "memory");
  const int64_t groups = hp / kHeadBlock, prob_bytes = rows * 2, acc_bytes = kValueDim * 4;
  for (int64_t g = 0; g < groups; g += 2) {
    const bool two = g + 1 < groups;
    const uint16_t* p = probs + g * kHeadBlock * rows;
    for (int64_t j = 0; j < kValueDim; j += 2 * kHeadBlock) {
      float* c = acc + g * kHeadBlock * kValueDim + j;
      _tile_loadd(0, c, acc_bytes);
      _tile_loadd(1, c + kHeadBlock, acc_bytes);
      if (two) {
        _tile_loadd(2, c + kHeadBlock * kValueDim, acc_bytes);
        _tile_loadd(3, c + kHeadBlock * kValueDim + kHeadBlock, acc_bytes);
      }
      for (int64_t e = 0; e < rows; e += kRowBlock) {
        const uint16_t* v = values + (e / 2) * kValuePairStride + 2 * j;
        _tile_loadd(4, p + e, prob_bytes);
        _tile_loadd(6, v, kValuePairStride * 2);
        _tile_loadd(7, v + 2 * kHeadBlock, kValuePairStride * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, p + kHeadBlock * rows + e, prob_bytes);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c, acc_bytes);
      _tile_stored(1, c + kHeadBlock, acc_bytes);
      if (two) {
        _tile_stored(2, c + kHeadBlock * kValueDim, acc_bytes);
        _tile_stored(3, c + kHeadBlock * kValueDim + kHeadBlock, acc_bytes);
      }
    }
  }
}

#elif defined(DSV4_F32_PRODUCTS)
constexpr int64_t kScoreRows = 8;  // key rows per register block of the scores product
constexpr int64_t kScoreGroups = 3;  // head groups per block: 8 x 3 accumulators + 3 query vectors fit 32 registers
constexpr int64_t kValueHeads = 12;  // heads per register block of the P.V product, times 2 dim vectors
constexpr int64_t kValueDims = 32;  // dims of V widened at a time and shared by every head
constexpr int64_t kValueChunk = 128;  // rows of V widened at a time: 16 KiB, stays in L1 across the head blocks

// S^T for kScoreRows widened key rows and kGroups head groups of the fp32 query; both have row stride
// kMaxQkDim, so every operand is one pointer plus a constant offset.
template <int kGroups>
inline void scores_block(const float* keys, int64_t d_qk, const float* query, float* out, int64_t hp) {
  __m512 acc[kScoreRows][kGroups];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (int64_t d = 0; d < d_qk; ++d) {
    __m512 b[kGroups];
    for (int j = 0; j < kGroups; ++j) b[j] = _mm512_loadu_ps(query + (j * kMaxQkDim + d) * kHeadBlock);
    for (int64_t r = 0; r < kScoreRows; ++r) {
      const __m512 a = _mm512_set1_ps(keys[r * kMaxQkDim + d]);
      for (int j = 0; j < kGroups; ++j) acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
    }
  }
  for (int64_t r = 0; r < kScoreRows; ++r)
    for (int j = 0; j < kGroups; ++j) _mm512_storeu_ps(out + r * hp + j * kHeadBlock, acc[r][j]);
}

inline void attention_scores(const uint16_t* keys, int64_t d_qk, int64_t rows, const float* qpack, int64_t hp,
                             float* out) {
  alignas(64) float wide[kScoreRows * kMaxQkDim];
  const int64_t groups = hp / kHeadBlock, blocks = (groups + kScoreGroups - 1) / kScoreGroups;
  for (int64_t i = 0; i < rows; i += kScoreRows) {
    for (int64_t r = 0; r < kScoreRows; ++r)
      for (int64_t d = 0; d < d_qk; d += 16) {
        const __m256i key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + (i + r) * d_qk + d));
        _mm512_store_ps(wide + r * kMaxQkDim + d, widen_bf16(key));
      }
    for (int64_t b = 0; b < blocks; ++b) {  // blocks of even width: a lone group reuses each key broadcast once
      const int64_t g = groups * b / blocks, width = groups * (b + 1) / blocks - g;
      const float* query = qpack + g * kMaxQkDim * kHeadBlock;
      float* block = out + i * hp + g * kHeadBlock;
      if (width == 3) scores_block<3>(wide, d_qk, query, block, hp);
      else if (width == 2) scores_block<2>(wide, d_qk, query, block, hp);
      else scores_block<1>(wide, d_qk, query, block, hp);
    }
  }
}

// acc[h][0, 32) += sum_e P[e][h] V[e][0, 32) over e < chunk for kHeads heads (P rows hp apart), V widened
// to fp32 [chunk][32].
template <int kHeads>
inline void values_block(const float* probs, int64_t hp, int64_t chunk, const float* wide, float* acc) {
  __m512 c[kHeads][2];
  for (int64_t r = 0; r < kHeads; ++r)
    for (int64_t j = 0; j < 2; ++j) c[r][j] = _mm512_loadu_ps(acc + r * kValueDim + 16 * j);
  for (int64_t e = 0; e < chunk; ++e) {
    const __m512 v0 = _mm512_load_ps(wide + e * kValueDims), v1 = _mm512_load_ps(wide + e * kValueDims + 16);
    for (int64_t r = 0; r < kHeads; ++r) {
      const __m512 p = _mm512_set1_ps(probs[e * hp + r]);
      c[r][0] = _mm512_fmadd_ps(p, v0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(p, v1, c[r][1]);
    }
  }
  for (int64_t r = 0; r < kHeads; ++r)
    for (int64_t j = 0; j < 2; ++j) _mm512_storeu_ps(acc + r * kValueDim + 16 * j, c[r][j]);
}

inline void accumulate_values(const float* probs, int64_t rows, const uint16_t* values, int64_t hp, float* acc) {
  alignas(64) float wide[kValueChunk * kValueDims];
  for (int64_t d = 0; d < kValueDim; d += kValueDims)
    for (int64_t e0 = 0; e0 < rows; e0 += kValueChunk) {
      const int64_t chunk = rows - e0 < kValueChunk ? rows - e0 : kValueChunk;
      for (int64_t e = 0; e < chunk / 2; ++e)
        for (int64_t j = 0; j < kValueDims; j += 16) {
          const __m512i pairs = _mm512_loadu_si512(values + (e0 / 2 + e) * kValuePairStride + 2 * (d + j));
          _mm512_store_ps(wide + 2 * e * kValueDims + j, even_bf16(pairs));
          _mm512_store_ps(wide + (2 * e + 1) * kValueDims + j, odd_bf16(pairs));
        }
      int64_t h = 0;  // hp is a multiple of 16, so 0, 4 or 8 heads are left past the blocks of 12
      for (; h + kValueHeads <= hp; h += kValueHeads)
        values_block<kValueHeads>(probs + e0 * hp + h, hp, chunk, wide, acc + h * kValueDim + d);
      if (hp - h == 8) values_block<8>(probs + e0 * hp + h, hp, chunk, wide, acc + h * kValueDim + d);
      else if (hp - h == 4) values_block<4>(probs + e0 * hp + h, hp, chunk, wide, acc + h * kValueDim + d);
    }
}

#elif defined(__AVX512BF16__)
// vdpbf16ps on bf16 pairs: lane i of acc += a.even * b.even + a.odd * b.odd, with a one broadcast pair.
constexpr int64_t kDotRows = 8;  // key rows per register block of the scores product
constexpr int64_t kDotGroups = 3;  // head groups per block: 8 x 3 accumulators + 3 query vectors
constexpr int64_t kDotHeads = 6;  // heads per register block of the P.V product, times kDotVectors dim vectors
constexpr int64_t kDotVectors = 4;  // 64 dims of V per block
constexpr int64_t kDotChunk = 128;  // rows of V per pass: 128 x 64 dims of pairs (16 KiB) stay in L1 across heads

inline __m512bh broadcast_pair(const uint16_t* p) { return (__m512bh)_mm512_set1_epi32(load_pair(p)); }

// S^T for kDotRows key rows (bf16, row stride d_qk) and kGroups head groups of the packed query from group g.
template <int kGroups>
inline void dot_scores_block(const uint16_t* keys, int64_t d_qk, const uint16_t* qpack, int64_t g, float* out,
                             int64_t hp) {
  __m512 acc[kDotRows][kGroups];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (int64_t k = 0; k < d_qk / kDimBlock; ++k)
    for (int64_t pair = 0; pair < kDimBlock / 2; ++pair) {
      __m512bh b[kGroups];
      for (int j = 0; j < kGroups; ++j)
        b[j] = (__m512bh)_mm512_loadu_si512(qpack + query_tile(d_qk, g + j, k) + pair * kDimBlock);
      const int64_t dim = k * kDimBlock + 2 * pair;
      for (int64_t r = 0; r < kDotRows; ++r) {
        const __m512bh a = broadcast_pair(keys + r * d_qk + dim);
        for (int j = 0; j < kGroups; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, b[j]);
      }
    }
  for (int64_t r = 0; r < kDotRows; ++r)
    for (int j = 0; j < kGroups; ++j) _mm512_storeu_ps(out + r * hp + (g + j) * kHeadBlock, acc[r][j]);
}

inline void attention_scores(const uint16_t* keys, int64_t d_qk, int64_t rows, const uint16_t* qpack, int64_t hp,
                             float* out) {
  const int64_t groups = hp / kHeadBlock, blocks = (groups + kDotGroups - 1) / kDotGroups;
  for (int64_t i = 0; i < rows; i += kDotRows)
    for (int64_t b = 0; b < blocks; ++b) {  // blocks of even width, as in the fp32 route
      const int64_t g = groups * b / blocks, width = groups * (b + 1) / blocks - g;
      const uint16_t* key = keys + i * d_qk;
      if (width == 3) dot_scores_block<3>(key, d_qk, qpack, g, out + i * hp, hp);
      else if (width == 2) dot_scores_block<2>(key, d_qk, qpack, g, out + i * hp, hp);
      else dot_scores_block<1>(key, d_qk, qpack, g, out + i * hp, hp);
    }
}

// acc[h][0, 64) += sum_e P[h][e] V[e][0, 64) for kHeads heads (P rows `rows` apart) over the row pairs
// [e0 / 2, e1 / 2) of the values layout, at dim offset d.
template <int kHeads>
inline void dot_values_block(const uint16_t* probs, int64_t rows, const uint16_t* values, int64_t e0, int64_t e1,
                             float* acc) {
  __m512 c[kHeads][kDotVectors];
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t j = 0; j < kDotVectors; ++j) c[h][j] = _mm512_loadu_ps(acc + h * kValueDim + 16 * j);
  for (int64_t e = e0; e < e1; e += 2) {
    __m512bh v[kDotVectors];
    for (int64_t j = 0; j < kDotVectors; ++j)
      v[j] = (__m512bh)_mm512_loadu_si512(values + (e / 2) * kValuePairStride + 32 * j);
    for (int64_t h = 0; h < kHeads; ++h) {
      const __m512bh p = broadcast_pair(probs + h * rows + e);
      for (int64_t j = 0; j < kDotVectors; ++j) c[h][j] = _mm512_dpbf16_ps(c[h][j], p, v[j]);
    }
  }
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t j = 0; j < kDotVectors; ++j) _mm512_storeu_ps(acc + h * kValueDim + 16 * j, c[h][j]);
}

inline void accumulate_values(const uint16_t* probs, int64_t rows, const uint16_t* values, int64_t hp, float* acc) {
  for (int64_t d = 0; d < kValueDim; d += 16 * kDotVectors)
    for (int64_t e0 = 0; e0 < rows; e0 += kDotChunk) {
      const int64_t e1 = rows - e0 < kDotChunk ? rows : e0 + kDotChunk;
      int64_t h = 0;  // hp is a multiple of 16: blocks of 6 leave 0, 2 or 4 heads
      for (; h + kDotHeads <= hp; h += kDotHeads)
        dot_values_block<kDotHeads>(probs + h * rows, rows, values + 2 * d, e0, e1, acc + h * kValueDim + d);
      if (hp - h == 4) dot_values_block<4>(probs + h * rows, rows, values + 2 * d, e0, e1, acc + h * kValueDim + d);
      else if (hp - h == 2) dot_values_block<2>(probs + h * rows, rows, values + 2 * d, e0, e1, acc + h * kValueDim + d);
    }
}

#elif defined(__AVX2__)
// No bf16 dot product: each 32-bit lane holding a bf16 pair is split into two fp32 values (even: the low
// half moved up, odd: the high half kept), then two FMAs.
constexpr int64_t kPairRows = 4;  // register block: 4 rows (or heads) x 16 lanes

inline __m256 even_bf16(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
inline __m256 odd_bf16(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int(0xffff0000u))));
}

// acc[r][j] += pair r (broadcast) . b[j], for b[j] 8 lanes of bf16 pairs.
inline void fma_pairs(__m256 acc[kPairRows][2], const uint16_t* const* a, int64_t offset, const __m256i b[2]) {
  const __m256 b_even[2] = {even_bf16(b[0]), even_bf16(b[1])}, b_odd[2] = {odd_bf16(b[0]), odd_bf16(b[1])};
  for (int64_t r = 0; r < kPairRows; ++r) {
    const __m256i pair = _mm256_set1_epi32(load_pair(a[r] + offset));
    const __m256 a_even = even_bf16(pair), a_odd = odd_bf16(pair);
    for (int64_t j = 0; j < 2; ++j)
      acc[r][j] = _mm256_fmadd_ps(a_odd, b_odd[j], _mm256_fmadd_ps(a_even, b_even[j], acc[r][j]));
  }
}

inline void attention_scores(const uint16_t* keys, int64_t d_qk, int64_t rows, const uint16_t* qpack, int64_t hp,
                             float* out) {
  for (int64_t g = 0; g < hp / kHeadBlock; ++g)
    for (int64_t i = 0; i < rows; i += kPairRows) {
      __m256 acc[kPairRows][2] = {};
      const uint16_t* a[kPairRows];
      for (int64_t r = 0; r < kPairRows; ++r) a[r] = keys + (i + r) * d_qk;
      for (int64_t k = 0; k < d_qk / kDimBlock; ++k) {
        const uint16_t* tile = qpack + query_tile(d_qk, g, k);
        for (int64_t pair = 0; pair < kDimBlock / 2; ++pair) {
          const __m256i* qrow = reinterpret_cast<const __m256i*>(tile + pair * kDimBlock);
          const __m256i b[2] = {_mm256_loadu_si256(qrow), _mm256_loadu_si256(qrow + 1)};
          fma_pairs(acc, a, k * kDimBlock + 2 * pair, b);
        }
      }
      for (int64_t r = 0; r < kPairRows; ++r)
        for (int64_t j = 0; j < 2; ++j) _mm256_storeu_ps(out + (i + r) * hp + g * kHeadBlock + 8 * j, acc[r][j]);
    }
}

inline void accumulate_values(const uint16_t* probs, int64_t rows, const uint16_t* values, int64_t hp, float* acc) {
  for (int64_t d = 0; d < kValueDim; d += 16)
    for (int64_t h = 0; h < hp; h += kPairRows) {
      __m256 c[kPairRows][2];
      const uint16_t* a[kPairRows];
      for (int64_t r = 0; r < kPairRows; ++r) {
        a[r] = probs + (h + r) * rows;
        for (int64_t j = 0; j < 2; ++j) c[r][j] = _mm256_loadu_ps(acc + (h + r) * kValueDim + d + 8 * j);
      }
      for (int64_t e = 0; e < rows / 2; ++e) {
        const __m256i* v = reinterpret_cast<const __m256i*>(values + e * kValuePairStride + 2 * d);
        const __m256i b[2] = {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
        fma_pairs(c, a, 2 * e, b);
      }
      for (int64_t r = 0; r < kPairRows; ++r)
        for (int64_t j = 0; j < 2; ++j) _mm256_storeu_ps(acc + (h + r) * kValueDim + d + 8 * j, c[r][j]);
    }
}

#else
// fp32 products of bf16 pairs; the head / dim loops are innermost so the compiler vectorizes them.
inline void attention_scores(const uint16_t* keys, int64_t d_qk, int64_t rows, const uint16_t* qpack, int64_t hp,
                             float* out) {
  for (int64_t n = 0; n < rows; ++n) {
    const uint16_t* key = keys + n * d_qk;
    for (int64_t g = 0; g < hp / kHeadBlock; ++g) {
      float acc[kHeadBlock] = {};
      for (int64_t k = 0; k < d_qk / kDimBlock; ++k) {
        const uint16_t* tile = qpack + query_tile(d_qk, g, k);
        for (int64_t pair = 0; pair < kDimBlock / 2; ++pair) {
          const uint16_t* kpair = key + k * kDimBlock + 2 * pair;
          const float k0 = bf16_to_f32(kpair[0]), k1 = bf16_to_f32(kpair[1]);
          const uint16_t* qrow = tile + pair * kDimBlock;
          for (int64_t i = 0; i < kHeadBlock; ++i)
            acc[i] += k0 * bf16_to_f32(qrow[2 * i]) + k1 * bf16_to_f32(qrow[2 * i + 1]);
        }
      }
      std::memcpy(out + n * hp + g * kHeadBlock, acc, sizeof(acc));
    }
  }
}

inline void accumulate_values(const uint16_t* probs, int64_t rows, const uint16_t* values, int64_t hp, float* acc) {
  for (int64_t h = 0; h < hp; ++h) {
    float* out = acc + h * kValueDim;
    for (int64_t e = 0; e < rows / 2; ++e) {
      const float p0 = bf16_to_f32(probs[h * rows + 2 * e]), p1 = bf16_to_f32(probs[h * rows + 2 * e + 1]);
      const uint16_t* v = values + e * kValuePairStride;
      for (int64_t d = 0; d < kValueDim; ++d) out[d] += p0 * bf16_to_f32(v[2 * d]) + p1 * bf16_to_f32(v[2 * d + 1]);
    }
  }
}
#endif

}  // namespace dsv4::cpu::DSV4_ISA
