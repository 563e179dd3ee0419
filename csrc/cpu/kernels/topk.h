// Per-row top-k of indexer logits with optional page translation.
//
// Every float maps to an order key, a uint32 that grows with rank (numbers ascending, -0 == +0, NaN
// below -inf), so "the k best" is "the k largest keys, ties by lower index". A row, or each piece of a
// long row split across threads, is scanned once against a key floor read off a sample; entries that
// reach it go to a bounded candidate buffer that, when full, keeps its exact top k and raises the
// floor. Radix select on the candidates finds the k winners and a stable radix sort orders them.
#pragma once
#include "cpu/kernels/numerics.h"

namespace dsv4::cpu::DSV4_ISA {

constexpr int kTopkDigitBits = 8;  // radix digit of the select and of the sort
constexpr int kTopkDigits = 1 << kTopkDigitBits;
constexpr int kTopkKeyBits = 32;
constexpr int kTopkHistCopies = 4;  // interleaved histograms, so repeated bins do not serialize the increments
constexpr int64_t kTopkBlock = 16;  // most candidates one vector step appends
constexpr int64_t kTopkLanes8 = 8;  // floats in an AVX2 vector
constexpr int64_t kTopkCapacity = 4;  // the candidate buffer holds this many k before it is trimmed to k
constexpr int64_t kTopkSamples = 1024;  // most sample points per scanned piece
constexpr int64_t kTopkSampleSpacing = 16;  // at least this many entries per sample point
constexpr int64_t kTopkSurplus = 2;  // the sampled floor aims at this many k candidates per row
constexpr int64_t kTopkMinPiece = 4096;  // a shorter piece of a row costs less to scan than to hand to a thread
constexpr int64_t kTopkMinRank = 24;  // sample points a floor must keep: +-20% on the candidate count
constexpr uint32_t kTopkNanKey = 0;  // below the key of -inf: NaN ranks after every number
constexpr uint32_t kTopkNegInfKey = 0x007fffffu;  // floors above the key of -inf admit numbers only

// Order key of one score.
inline uint32_t topk_key(float x) {
  const uint32_t u = f32_bits(x + 0.0f);  // adding +0 turns -0 into +0, which torch ranks as equal
  return std::isnan(x) ? kTopkNanKey : u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
}

#if defined(__AVX512F__)
inline __m512i topk_key16(__m512 x) {
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i u = _mm512_castps_si512(_mm512_add_ps(x, _mm512_setzero_ps()));
  const __m512i flip = _mm512_or_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32(INT32_MIN));
  return _mm512_maskz_mov_epi32(_knot_mask16(nan), _mm512_xor_si512(u, flip));
}
#elif defined(__AVX2__)
inline __m256i topk_key8(__m256 x) {
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i u = _mm256_castps_si256(_mm256_add_ps(x, _mm256_setzero_ps()));
  const __m256i flip = _mm256_or_si256(_mm256_srai_epi32(u, 31), _mm256_set1_epi32(INT32_MIN));
  return _mm256_andnot_si256(nan, _mm256_xor_si256(u, flip));
}

// Bit j set where key lane j >= floor (unsigned, as a signed compare with both top bits flipped).
inline uint32_t topk_reaching8(__m256i key, uint32_t floor) {
  const __m256i biased_floor = _mm256_set1_epi32(int32_t(floor ^ 0x80000000u));
  const __m256i below = _mm256_cmpgt_epi32(biased_floor, _mm256_xor_si256(key, _mm256_set1_epi32(INT32_MIN)));
  return ~uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(below))) & 0xffu;
}

// For each 8-bit mask, the lanes whose bits are set, in order, as bytes: AVX2 has no compress instruction.
struct TopkLeftPack {
  uint64_t lanes[1 << kTopkLanes8];
  TopkLeftPack() {
    for (uint32_t mask = 0; mask < (1u << kTopkLanes8); ++mask) {
      uint64_t packed = 0;
      int at = 0;
      for (int j = 0; j < kTopkLanes8; ++j)
        if (mask >> j & 1) packed |= uint64_t(j) << (8 * at++);
      lanes[mask] = packed;
    }
  }
};
inline __m256i topk_left_pack(uint32_t mask) {
  static const TopkLeftPack table;
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(table.lanes[mask])));
}
#endif

// new[]/delete[] owner for the kernel's scratch.
template <class T>
struct TopkArray {
  T* data;
  explicit TopkArray(int64_t n) : data(new T[n > 0 ? n : 1]) {}
  ~TopkArray() { delete[] data; }
  TopkArray(const TopkArray&) = delete;
  TopkArray& operator=(const TopkArray&) = delete;
};

// Smallest and largest of n >= 1 keys.
struct TopkRange {
  uint32_t lo, hi;
};
inline TopkRange topk_range(const uint32_t* keys, int64_t n) {
  uint32_t lo = keys[0], hi = keys[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = keys[i] < lo ? keys[i] : lo;
    hi = keys[i] > hi ? keys[i] : hi;
  }
  return {lo, hi};
}

inline int topk_bit_width(uint32_t x) { return x ? kTopkKeyBits - __builtin_clz(x) : 0; }

// Copies, in order, the keys in [lo, lo + width] to dst (which may be src); returns how many.
inline int64_t topk_keys_within(const uint32_t* src, int64_t n, uint32_t lo, uint32_t width, uint32_t* dst) {
  int64_t i = 0, m = 0;
#if defined(__AVX512F__)
  const __m512i vlo = _mm512_set1_epi32(int32_t(lo)), vwidth = _mm512_set1_epi32(int32_t(width));
  for (; i + kTopkBlock <= n; i += kTopkBlock) {
    const __m512i key = _mm512_loadu_si512(src + i);
    const __mmask16 in = _mm512_cmple_epu32_mask(_mm512_sub_epi32(key, vlo), vwidth);
    _mm512_mask_compressstoreu_epi32(dst + m, in, key);
    m += __builtin_popcount(in);
  }
#elif defined(__AVX2__)
  const __m256i bias = _mm256_set1_epi32(INT32_MIN), vlo = _mm256_set1_epi32(int32_t(lo));
  const __m256i above = _mm256_set1_epi32(int32_t(width ^ 0x80000000u));
  for (; i + kTopkLanes8 <= n; i += kTopkLanes8) {  // full-width stores land on entries already read
    const __m256i key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i out = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_sub_epi32(key, vlo), bias), above);
    const uint32_t in = ~uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(out))) & 0xffu;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + m), _mm256_permutevar8x32_epi32(key, topk_left_pack(in)));
    m += __builtin_popcount(in);
  }
#endif
  for (; i < n; ++i) {  // branch-free: the test is unpredictable
    dst[m] = src[i];
    m += src[i] - lo <= width;
  }
  return m;
}

// The rank-th largest key of a set, and how many entries equal to it belong to the top rank.
struct TopkRank {
  uint32_t key;
  int64_t ties;
};

// Radix select on key - min, most significant digit first, each round's digit cut from the top of the
// live keys' range (so clustered keys narrow as fast as spread ones); work holds up to n keys.
inline TopkRank topk_kth_key(const uint32_t* keys, int64_t n, int64_t rank, uint32_t* work) {
  const uint32_t* live = keys;
  int64_t live_n = n, need = rank;
  for (;;) {
    const TopkRange range = topk_range(live, live_n);
    if (range.lo == range.hi) return {range.lo, need};
    const int bits = topk_bit_width(range.hi - range.lo);
    const int shift = bits > kTopkDigitBits ? bits - kTopkDigitBits : 0;
    uint32_t hist[kTopkHistCopies][kTopkDigits] = {};
    int64_t i = 0;
    for (; i + kTopkHistCopies <= live_n; i += kTopkHistCopies)
      for (int c = 0; c < kTopkHistCopies; ++c) ++hist[c][(live[i + c] - range.lo) >> shift];
    for (; i < live_n; ++i) ++hist[0][(live[i] - range.lo) >> shift];
    uint32_t digit = (range.hi - range.lo) >> shift;
    for (;; --digit) {
      int64_t in_digit = 0;
      for (int c = 0; c < kTopkHistCopies; ++c) in_digit += hist[c][digit];
      if (in_digit >= need) break;
      need -= in_digit;
    }
    live_n = topk_keys_within(live, live_n, range.lo + (digit << shift), (1u << shift) - 1, work);
    live = work;
  }
}

// Compacts (key, index) pairs, in order, to those above t.key and the first t.ties equal to it.
inline int64_t topk_keep_top(uint32_t* keys, uint32_t* idx, int64_t n, TopkRank t) {
  int64_t i = 0, m = 0, ties = t.ties;
#if defined(__AVX512F__)
  const __m512i kth = _mm512_set1_epi32(int32_t(t.key));
  for (; i + kTopkBlock <= n; i += kTopkBlock) {
    const __m512i key = _mm512_loadu_si512(keys + i), index = _mm512_loadu_si512(idx + i);
    uint32_t tie = _mm512_cmpeq_epi32_mask(key, kth);
    while (__builtin_popcount(tie) > ties) tie ^= 1u << (31 - __builtin_clz(tie));  // only the first ties
    ties -= __builtin_popcount(tie);
    const __mmask16 keep = __mmask16(_mm512_cmpgt_epu32_mask(key, kth) | tie);
    _mm512_mask_compressstoreu_epi32(keys + m, keep, key);
    _mm512_mask_compressstoreu_epi32(idx + m, keep, index);
    m += __builtin_popcount(keep);
  }
#elif defined(__AVX2__)
  const __m256i bias = _mm256_set1_epi32(INT32_MIN), kth = _mm256_set1_epi32(int32_t(t.key));
  const __m256i kth_biased = _mm256_xor_si256(kth, bias);
  for (; i + kTopkLanes8 <= n; i += kTopkLanes8) {  // full-width stores land on entries already read
    const __m256i key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i));
    const __m256i index = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + i));
    const __m256i gt = _mm256_cmpgt_epi32(_mm256_xor_si256(key, bias), kth_biased);
    uint32_t tie = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(key, kth))));
    while (__builtin_popcount(tie) > ties) tie ^= 1u << (31 - __builtin_clz(tie));  // only the first ties
    ties -= __builtin_popcount(tie);
    const uint32_t keep = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(gt))) | tie;
    const __m256i pack = topk_left_pack(keep);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys + m), _mm256_permutevar8x32_epi32(key, pack));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + m), _mm256_permutevar8x32_epi32(index, pack));
    m += __builtin_popcount(keep);
  }
#endif
  for (; i < n; ++i) {  // branch-free: the comparison is unpredictable
    const uint32_t key = keys[i], index = idx[i];
    const bool tie = key == t.key;
    const bool keep = key > t.key || (tie && ties > 0);
    ties -= tie && keep;
    keys[m] = key;
    idx[m] = index;
    m += keep;
  }
  return m;
}

// (key, row-relative index) pairs in index order; keys below floor are not admitted.
struct TopkCandidates {
  uint32_t* keys;
  uint32_t* idx;
  int64_t count, capacity;
  uint32_t floor;
};

// Keeps exactly the top k candidates, still in index order.
inline void topk_trim(TopkCandidates& c, int64_t k, uint32_t* work) {
  const TopkRank t = topk_kth_key(c.keys, c.count, k, work);
  c.count = topk_keep_top(c.keys, c.idx, c.count, t);
  c.floor = t.key + 1;  // later entries have higher indices: a tie with the k-th kept key loses
}

inline void topk_admit(TopkCandidates& c, uint32_t key, uint32_t index, int64_t k, uint32_t* work) {
  if (key < c.floor) return;
  if (c.count == c.capacity) {
    topk_trim(c, k, work);
    if (key < c.floor) return;
  }
  c.keys[c.count] = key;
  c.idx[c.count++] = index;
}

#if defined(__AVX512F__)
// Admits the lanes of 16 scores (indices index, index + 1, ...) in keep, a superset of those whose keys
// reach the floor: an extra candidate is harmless, a missing one is not.
inline void topk_admit16(TopkCandidates& c, __m512 x, __mmask16 keep, uint32_t index, int64_t k, uint32_t* work) {
  if (!keep) return;
  const __m512i key = topk_key16(x);
  if (c.count > c.capacity - kTopkBlock) {
    topk_trim(c, k, work);
    keep &= _mm512_cmpge_epu32_mask(key, _mm512_set1_epi32(int32_t(c.floor)));
  }
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i indices = _mm512_add_epi32(lanes, _mm512_set1_epi32(int32_t(index)));
  // full-width stores are fine: count + 16 <= capacity
  _mm512_storeu_si512(c.keys + c.count, _mm512_maskz_compress_epi32(keep, key));
  _mm512_storeu_si512(c.idx + c.count, _mm512_maskz_compress_epi32(keep, indices));
  c.count += __builtin_popcount(keep);
}
#elif defined(__AVX2__)
// topk_admit16 for 8 lanes.
inline void topk_admit8(TopkCandidates& c, __m256 x, uint32_t keep, uint32_t index, int64_t k, uint32_t* work) {
  if (!keep) return;
  const __m256i key = topk_key8(x);
  if (c.count > c.capacity - kTopkLanes8) {
    topk_trim(c, k, work);
    keep &= topk_reaching8(key, c.floor);
  }
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i indices = _mm256_add_epi32(lanes, _mm256_set1_epi32(int32_t(index)));
  const __m256i pack = topk_left_pack(keep);
  // full-width stores are fine: count + 8 <= capacity
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c.keys + c.count), _mm256_permutevar8x32_epi32(key, pack));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c.idx + c.count), _mm256_permutevar8x32_epi32(indices, pack));
  c.count += __builtin_popcount(keep);
}
#endif

// The float whose order key is key (> kTopkNegInfKey).
inline float topk_key_value(uint32_t key) { return bits_f32(key & 0x80000000u ? key ^ 0x80000000u : ~key); }

// Admits x[i] (index base + i) for i < n; a candidate of the top k is never lost. While the floor admits
// numbers only, a float compare with its value selects the lanes: the same ones as the keys would, or
// more when denormals are flushed to zero.
inline void topk_collect(TopkCandidates& c, const float* x, int64_t n, uint32_t base, int64_t k, uint32_t* work) {
  int64_t i = 0;
  bool numeric = c.floor > kTopkNegInfKey;
  float value = topk_key_value(c.floor);
#if defined(__AVX512F__)
  for (; i + 2 * kTopkBlock <= n; i += 2 * kTopkBlock) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + kTopkBlock);
    __mmask16 keep_a, keep_b;
    if (numeric) {
      const __m512 v = _mm512_set1_ps(value);
      keep_a = _mm512_cmp_ps_mask(a, v, _CMP_GE_OQ);
      keep_b = _mm512_cmp_ps_mask(b, v, _CMP_GE_OQ);
      if (!(keep_a | keep_b)) continue;
    } else {
      const __m512i floor = _mm512_set1_epi32(int32_t(c.floor));
      keep_a = _mm512_cmpge_epu32_mask(topk_key16(a), floor);
      keep_b = _mm512_cmpge_epu32_mask(topk_key16(b), floor);
    }
    topk_admit16(c, a, keep_a, base + uint32_t(i), k, work);  // keep_b may now pass more than needed: harmless
    topk_admit16(c, b, keep_b, base + uint32_t(i + kTopkBlock), k, work);
    numeric = c.floor > kTopkNegInfKey;
    value = topk_key_value(c.floor);
  }
#elif defined(__AVX2__)
  for (; i + 2 * kTopkLanes8 <= n; i += 2 * kTopkLanes8) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + kTopkLanes8);
    uint32_t keep_a, keep_b;
    if (numeric) {
      const __m256 v = _mm256_set1_ps(value);
      keep_a = uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a, v, _CMP_GE_OQ)));
      keep_b = uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(b, v, _CMP_GE_OQ)));
      if (!(keep_a | keep_b)) continue;
    } else {
      keep_a = topk_reaching8(topk_key8(a), c.floor);
      keep_b = topk_reaching8(topk_key8(b), c.floor);
    }
    topk_admit8(c, a, keep_a, base + uint32_t(i), k, work);  // keep_b may now pass more than needed: harmless
    topk_admit8(c, b, keep_b, base + uint32_t(i + kTopkLanes8), k, work);
    numeric = c.floor > kTopkNegInfKey;
    value = topk_key_value(c.floor);
  }
#endif
  for (; i < n; ++i) {
    if (numeric && !(x[i] >= value)) continue;
    topk_admit(c, topk_key(x[i]), base + uint32_t(i), k, work);
    numeric = c.floor > kTopkNegInfKey;
    value = topk_key_value(c.floor);
  }
}

// A floor that about target of the n entries reach, read off evenly spaced samples, at least min_rank of which
// reach it (fewer would make the count too noisy); 0 (admit all) when most of them would pass anyway. It may
// overshoot: callers retry with 0 when too few candidates came through.
inline uint32_t topk_sampled_floor(const float* x, int64_t n, int64_t target, int64_t min_rank, uint32_t* samples,
                                   uint32_t* work) {
  const int64_t count = n / kTopkSampleSpacing < kTopkSamples ? n / kTopkSampleSpacing : kTopkSamples;
  const int64_t by_target = (target * count + n - 1) / n;
  const int64_t rank = by_target > min_rank ? by_target : min_rank;
  if (2 * rank > count) return 0;
  const int64_t step = n / count;
  for (int64_t j = 0; j < count; ++j) samples[j] = topk_key(x[j * step]);
  return topk_kth_key(samples, count, rank, work).key;
}

// Stable LSD radix sort of n >= 1 pairs by key descending (ties keep their order) on hi - key, with only as
// many byte passes as the keys' range needs; overwrites keys and returns the sorted indices (idx or tmp_idx).
inline const uint32_t* topk_sort_desc(uint32_t* keys, uint32_t* idx, int64_t n, uint32_t* tmp_keys,
                                      uint32_t* tmp_idx) {
  constexpr int kPasses = kTopkKeyBits / kTopkDigitBits;
  constexpr uint32_t kMask = kTopkDigits - 1;
  const TopkRange range = topk_range(keys, n);
  const int passes = (topk_bit_width(range.hi - range.lo) + kTopkDigitBits - 1) / kTopkDigitBits;
  uint32_t count[kPasses][kTopkDigits] = {};
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = range.hi - keys[i];
    for (int b = 0; b < passes; ++b) ++count[b][(keys[i] >> (b * kTopkDigitBits)) & kMask];
  }
  uint32_t *src_k = keys, *src_i = idx, *dst_k = tmp_keys, *dst_i = tmp_idx;
  for (int b = 0; b < passes; ++b) {
    const int shift = b * kTopkDigitBits;
    if (count[b][(src_k[0] >> shift) & kMask] == uint32_t(n)) continue;  // every key shares this byte
    uint32_t pos[kTopkDigits];
    uint32_t sum = 0;
    for (int d = 0; d < kTopkDigits; ++d) {
      pos[d] = sum;
      sum += count[b][d];
    }
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {  // four positions per round of bucket loads: equal digits do not chain
      const uint32_t d0 = (src_k[i] >> shift) & kMask, d1 = (src_k[i + 1] >> shift) & kMask;
      const uint32_t d2 = (src_k[i + 2] >> shift) & kMask, d3 = (src_k[i + 3] >> shift) & kMask;
      const uint32_t a0 = pos[d0], a1 = pos[d1] + (d1 == d0), a2 = pos[d2] + (d2 == d0) + (d2 == d1);
      const uint32_t a3 = pos[d3] + (d3 == d0) + (d3 == d1) + (d3 == d2);
      pos[d0] = a0 + 1, pos[d1] = a1 + 1, pos[d2] = a2 + 1, pos[d3] = a3 + 1;
      dst_k[a0] = src_k[i], dst_k[a1] = src_k[i + 1], dst_k[a2] = src_k[i + 2], dst_k[a3] = src_k[i + 3];
      dst_i[a0] = src_i[i], dst_i[a1] = src_i[i + 1], dst_i[a2] = src_i[i + 2], dst_i[a3] = src_i[i + 3];
    }
    for (; i < n; ++i) {
      const uint32_t at = pos[(src_k[i] >> shift) & kMask]++;
      dst_k[at] = src_k[i];
      dst_i[at] = src_i[i];
    }
    uint32_t* t = src_k;
    src_k = dst_k, dst_k = t;
    t = src_i;
    src_i = dst_i, dst_i = t;
  }
  return src_i;
}

#if defined(__AVX512F__)
// topk_translate of 16 contiguous raw indices (see there); table offsets page * table_stride fit in int32.
template <class Entry>
inline __m512i topk_translate16(const Entry* table, int32_t table_stride, int32_t max_pages, int32_t page_size,
                                double inverse, __m512i raw) {
  const __m512d inv = _mm512_set1_pd(inverse);
  const __m512i size = _mm512_set1_epi32(page_size), none = _mm512_set1_epi32(-1);
  const __m512d raw_lo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(raw));
  const __m512d raw_hi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(raw, 1));
  const __m256i page_lo = _mm512_cvttpd_epi32(_mm512_mul_pd(raw_lo, inv));
  const __m256i page_hi = _mm512_cvttpd_epi32(_mm512_mul_pd(raw_hi, inv));
  __m512i page = _mm512_inserti64x4(_mm512_castsi256_si512(page_lo), page_hi, 1);
  __m512i offset = _mm512_sub_epi32(raw, _mm512_mullo_epi32(page, size));
  const __mmask16 carry = _mm512_cmpge_epi32_mask(offset, size);
  page = _mm512_mask_add_epi32(page, carry, page, _mm512_set1_epi32(1));
  offset = _mm512_mask_sub_epi32(offset, carry, offset, size);
  const __mmask16 mapped = _mm512_cmpge_epi32_mask(raw, _mm512_setzero_si512()) &
                           _mm512_cmplt_epi32_mask(page, _mm512_set1_epi32(max_pages));
  const __m512i at = _mm512_mullo_epi32(page, _mm512_set1_epi32(table_stride));
  if constexpr (sizeof(Entry) == sizeof(int32_t)) {
    const __m512i block = _mm512_mask_i32gather_epi32(none, mapped, at, table, sizeof(Entry));
    const __mmask16 valid = _mm512_cmpge_epi32_mask(block, _mm512_setzero_si512());
    return _mm512_mask_add_epi32(none, valid, _mm512_mullo_epi32(block, size), offset);
  } else {  // 64-bit entries, 8 lanes at a time; the slot keeps the low 32 bits, as a cast to int32 does
    const __m512i none64 = _mm512_set1_epi64(-1), size64 = _mm512_set1_epi64(page_size);
    __m256i half[2];
    for (int h = 0; h < 2; ++h) {
      const __mmask8 lanes = __mmask8(mapped >> (8 * h));
      const __m256i at_h = h ? _mm512_extracti64x4_epi64(at, 1) : _mm512_castsi512_si256(at);
      const __m256i off_h = h ? _mm512_extracti64x4_epi64(offset, 1) : _mm512_castsi512_si256(offset);
      const __m512i block = _mm512_mask_i32gather_epi64(none64, lanes, at_h, table, sizeof(Entry));
      const __mmask8 valid = _mm512_cmpge_epi64_mask(block, _mm512_setzero_si512());
      const __m512i slot = _mm512_add_epi64(_mm512_mullo_epi64(block, size64), _mm512_cvtepi32_epi64(off_h));
      half[h] = _mm512_cvtepi64_epi32(_mm512_mask_mov_epi64(none64, valid, slot));
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
  }
}
#endif

// slots[j] = table[i / page_size] * page_size + i % page_size for i = raw[j]; -1 for i < 0, a page past
// the table or a negative entry.
template <class Entry>
inline void topk_translate(const Entry* table, int64_t table_stride, int64_t max_pages, int64_t page_size,
                           const int32_t* raw, int64_t raw_stride, int64_t k, int32_t* slots, int64_t slot_stride) {
  // i / page_size through a double reciprocal, a few times faster than integer division: for i < 2^31 the
  // truncated product is the quotient or, at exact multiples, one less, which the remainder test fixes
  const double inverse = 1.0 / double(page_size);
  int64_t j = 0;
#if defined(__AVX512F__)
  if (raw_stride == 1 && slot_stride == 1 && page_size <= INT32_MAX && max_pages * table_stride <= INT32_MAX) {
    for (; j + kTopkBlock <= k; j += kTopkBlock) {
      const __m512i slot = topk_translate16(table, int32_t(table_stride), int32_t(max_pages), int32_t(page_size),
                                            inverse, _mm512_loadu_si512(raw + j));
      _mm512_storeu_si512(slots + j, slot);
    }
  }
#endif
  for (; j < k; ++j) {
    const int64_t i = raw[j * raw_stride];
    int64_t page = int64_t(double(i) * inverse);
    page += i - page * page_size >= page_size;
    page = i >= 0 ? page : max_pages;
    const int64_t block = page < max_pages ? int64_t(table[page * table_stride]) : -1;
    slots[j * slot_stride] = block >= 0 ? int32_t(block * page_size + (i - page * page_size)) : -1;
  }
}

// Row r's output: idx[j] (j itself when idx is null) for j < count, then -1; slots alongside.
inline void topk_write_row(const TopkTransformParams& p, int64_t r, const uint32_t* idx, int64_t count) {
  int32_t* raw = p.raw + r * p.raw_stride;
  const int64_t stride = p.raw_col_stride;
  for (int64_t j = 0; j < count; ++j) raw[j * stride] = idx ? int32_t(idx[j]) : int32_t(j);
  for (int64_t j = count; j < p.k; ++j) raw[j * stride] = -1;
  if (!p.slots) return;
  const IndexView& t = p.page_table;
  int32_t* slots = p.slots + r * p.slot_stride;
  if (t.is_int64)
    topk_translate(static_cast<const int64_t*>(t.data) + r * t.row_stride, t.col_stride, p.max_pages, p.page_size, raw,
                   stride, p.k, slots, p.slot_col_stride);
  else
    topk_translate(static_cast<const int32_t*>(t.data) + r * t.row_stride, t.col_stride, p.max_pages, p.page_size, raw,
                   stride, p.k, slots, p.slot_col_stride);
}

// Scratch of one worker: a candidate buffer and key work space of capacity, sort buffers of k, the samples.
struct TopkWorkspace {
  TopkArray<uint32_t> storage;
  uint32_t *keys, *idx, *work, *sort_keys, *sort_idx, *samples;
  TopkWorkspace(int64_t capacity, int64_t k) : storage(3 * capacity + 2 * k + kTopkSamples) {
    keys = storage.data;
    idx = keys + capacity;
    work = idx + capacity;
    sort_keys = work + capacity;
    sort_idx = sort_keys + k;
    samples = sort_idx + k;
  }
};

// Selects, orders and writes the top k of a candidate set holding at least k entries.
inline void topk_finish_row(const TopkTransformParams& p, int64_t r, TopkCandidates& c, TopkWorkspace& ws) {
  if (c.count > p.k) topk_trim(c, p.k, ws.work);
  topk_write_row(p, r, topk_sort_desc(c.keys, c.idx, p.k, ws.sort_keys, ws.sort_idx), p.k);
}

// Candidates of a whole row with floor 0: the fallback when a sampled floor overshot.
inline void topk_collect_all(TopkCandidates& c, const float* x, int64_t n, int64_t k, uint32_t* work) {
  c.count = 0;
  c.floor = 0;
  topk_collect(c, x, n, 0, k, work);
}

// A whole row (split < 0) or one piece of split row `split`, whose candidates go to buffer `slot`.
struct TopkTask {
  int64_t row, offset, length;  // scores offset of the row start; row length
  int64_t begin, end;  // the scanned part of the row
  int64_t split, slot;
};

// A row split into pieces: their candidates lie in slots [first_slot, first_slot + pieces); the piece that
// finishes last (remaining drops to 0) merges them.
struct TopkSplit {
  int64_t first_slot, pieces, remaining;
};

// Candidate buffers of the pieces of split rows, and the floor each piece was scanned against.
struct TopkPieces {
  int64_t capacity;
  TopkArray<uint32_t> keys, idx, floor;
  TopkArray<int64_t> count;
  TopkPieces(int64_t slots, int64_t capacity)
      : capacity(capacity), keys(slots * capacity), idx(slots * capacity), floor(slots), count(slots) {}
  TopkCandidates slot(int64_t s, uint32_t floor) {
    return {keys.data + s * capacity, idx.data + s * capacity, 0, capacity, floor};
  }
};

// Piece `i` of a row of `length` entries split into `pieces`: [begin, end).
inline int64_t topk_piece_begin(int64_t length, int64_t i, int64_t pieces) { return length * i / pieces; }

// Scans piece `i` of a split row into its slot against `floor`; records the floor and the count.
inline void topk_collect_piece(const TopkTransformParams& p, const TopkTask& t, int64_t pieces_in_row, int64_t i,
                               int64_t slot, uint32_t floor, TopkPieces& pieces, uint32_t* work) {
  const int64_t begin = topk_piece_begin(t.length, i, pieces_in_row);
  const int64_t end = topk_piece_begin(t.length, i + 1, pieces_in_row);
  TopkCandidates c = pieces.slot(slot, floor);
  topk_collect(c, p.scores + t.offset + begin, end - begin, uint32_t(begin), p.k, work);
  pieces.count.data[slot] = c.count;
  pieces.floor.data[slot] = floor;
}

// Concatenates the pieces' candidates (in index order) into c.
inline void topk_gather_pieces(const TopkSplit& s, const TopkPieces& pieces, TopkCandidates& c) {
  c.count = 0;
  for (int64_t i = s.first_slot; i < s.first_slot + s.pieces; ++i) {
    const int64_t n = pieces.count.data[i];
    std::memcpy(c.keys + c.count, pieces.keys.data + i * pieces.capacity, n * sizeof(uint32_t));
    std::memcpy(c.idx + c.count, pieces.idx.data + i * pieces.capacity, n * sizeof(uint32_t));
    c.count += n;
  }
}

// Joins the pieces of a split row and finishes it. A piece lost nothing of the row's top k unless its floor lies
// above the k-th key of the union (entries it trimmed had k better ones in the piece), so exactly those pieces are
// scanned again down to that key; the union then holds every entry at or above it, the true top k included.
inline void topk_merge_split(const TopkTransformParams& p, const TopkTask& t, const TopkSplit& s, TopkPieces& pieces) {
  TopkWorkspace ws(s.pieces * pieces.capacity, p.k);
  TopkCandidates c{ws.keys, ws.idx, 0, s.pieces * pieces.capacity, 0};
  topk_gather_pieces(s, pieces, c);
  if (c.count >= p.k) {
    const TopkRank kth = topk_kth_key(c.keys, c.count, p.k, ws.work);
    bool rescanned = false;
    for (int64_t i = 0; i < s.pieces; ++i) {
      if (pieces.floor.data[s.first_slot + i] <= kth.key) continue;
      topk_collect_piece(p, t, s.pieces, i, s.first_slot + i, kth.key, pieces, ws.work);
      rescanned = true;
    }
    if (rescanned) topk_gather_pieces(s, pieces, c);
    else c.count = topk_keep_top(c.keys, c.idx, c.count, kth);  // the union's top k is the row's: select once
  }
  if (c.count < p.k) topk_collect_all(c, p.scores + t.offset, t.length, p.k, ws.work);
  topk_finish_row(p, t.row, c, ws);
}

inline void topk_run_task(const TopkTransformParams& p, const TopkTask& t, TopkSplit* splits, TopkPieces& pieces,
                          TopkWorkspace& ws) {
  if (t.length <= p.k) return topk_write_row(p, t.row, nullptr, t.length);
  const float* x = p.scores + t.offset;
  const int64_t n = t.end - t.begin;
  const int64_t target = (kTopkSurplus * p.k * n + t.length - 1) / t.length;  // this piece's share of the row's
  const int64_t parts = t.length / n;  // the pieces of a row share the precision the floor needs
  const int64_t min_rank = (kTopkMinRank + parts - 1) / parts;
  const uint32_t floor = topk_sampled_floor(x + t.begin, n, target, min_rank, ws.samples, ws.work);
  if (t.split >= 0) {
    TopkSplit& s = splits[t.split];
    topk_collect_piece(p, t, s.pieces, t.slot - s.first_slot, t.slot, floor, pieces, ws.work);
    if (__atomic_sub_fetch(&s.remaining, 1, __ATOMIC_ACQ_REL) == 0) topk_merge_split(p, t, s, pieces);
    return;
  }
  TopkCandidates c{ws.keys, ws.idx, 0, kTopkCapacity * p.k, floor};
  topk_collect(c, x, n, 0, p.k, ws.work);
  if (c.count < p.k) topk_collect_all(c, x, n, p.k, ws.work);
  topk_finish_row(p, t.row, c, ws);
}

// First task whose cost midpoint is at or past twice_cost / 2 (prefix: running cost from 0).
inline int64_t topk_first_task(const int64_t* prefix, int64_t tasks, int64_t twice_cost) {
  int64_t lo = 0, hi = tasks;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (prefix[mid] + prefix[mid + 1] < twice_cost) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

inline void topk_transform(const TopkTransformParams& p) {
  if (p.rows <= 0) return;
  TopkArray<TopkTask> rows(p.rows);
  int64_t long_total = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    int64_t start = p.row_starts.data ? index_at(p.row_starts, r) : 0;
    start = start < 0 ? 0 : (start > p.width ? p.width : start);
    const int64_t room = p.width - start;
    int64_t length = index_at(p.lengths, r);
    length = length < 0 ? 0 : (length > room ? room : length);
    rows.data[r] = {r, r * p.score_stride + start, length, 0, length, -1, -1};
    if (length > p.k) long_total += length;
  }
  // As many workers as the work keeps busy; rows split into about one piece per worker, the rest stay whole.
  const int64_t busy = (long_total + p.rows * p.k) / kTopkMinPiece;
  const int64_t threads = p.threads > 1 ? p.threads : 1;
  const int64_t workers = busy < threads ? (busy > 1 ? busy : 1) : threads;
  const int64_t share = (long_total + workers - 1) / workers;
  const int64_t piece_len = share > kTopkMinPiece ? share : kTopkMinPiece;
  int64_t num_tasks = 0, num_splits = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t pieces = rows.data[r].length / piece_len;
    num_tasks += pieces > 1 ? pieces : 1;
    num_splits += pieces > 1;
  }
  TopkArray<TopkTask> tasks(num_tasks);
  TopkArray<int64_t> prefix(num_tasks + 1);
  TopkArray<TopkSplit> splits(num_splits);
  int64_t t = 0, num_slots = 0;
  prefix.data[0] = 0;
  for (int64_t r = 0, s = 0; r < p.rows; ++r) {
    const TopkTask& row = rows.data[r];
    const int64_t pieces = row.length / piece_len > 1 ? row.length / piece_len : 1;
    if (pieces > 1) splits.data[s] = {num_slots, pieces, pieces};
    for (int64_t i = 0; i < pieces; ++i, ++t) {
      tasks.data[t] = row;
      tasks.data[t].begin = topk_piece_begin(row.length, i, pieces);
      tasks.data[t].end = topk_piece_begin(row.length, i + 1, pieces);
      if (pieces > 1) tasks.data[t].split = s, tasks.data[t].slot = num_slots++;
      const int64_t scanned = row.length > p.k ? tasks.data[t].end - tasks.data[t].begin : 0;
      prefix.data[t + 1] = prefix.data[t] + scanned + p.k;  // every task also writes k outputs
    }
    s += pieces > 1;
  }
  TopkPieces pieces(num_slots, kTopkCapacity * p.k);
  const int64_t total = prefix.data[num_tasks];
  parallel(workers, 1, [&](int64_t begin, int64_t end) {
    TopkWorkspace ws(kTopkCapacity * p.k, p.k);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t first = topk_first_task(prefix.data, num_tasks, 2 * total * w / workers);
      const int64_t last = topk_first_task(prefix.data, num_tasks, 2 * total * (w + 1) / workers);
      for (int64_t i = first; i < last; ++i) topk_run_task(p, tasks.data[i], splits.data, pieces, ws);
    }
  });
}

}  // namespace dsv4::cpu::DSV4_ISA
