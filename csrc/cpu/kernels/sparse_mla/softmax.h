// Online softmax of sparse MLA attention, heads in vector lanes: a lazily raised running max per head, fp32
// sums of the unrounded weights, P rounded to bf16 for the P.V product; and the final combination of partial
// states (one per split of the attended rows) into out, lse and max_logits.
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/sparse_mla/math.h"
#include "cpu/kernels/sparse_mla/rows.h"
#include "cpu/kernels/sparse_mla/gemm.h"

namespace dsv4::cpu::DSV4_ISA {

constexpr float kMaxSlack = 8.0f;  // the running max is raised only when a score passes it by more (P <= e^8)

// Running state of one query's hp (padded) heads over the rows seen so far.
struct SoftmaxState {
  float* max;  // offset of the exponentials: -inf before the first row
  float* sum;  // sum of exp(score - max)
  float* top;  // largest score seen (prefill's max_logits)
  float* acc;  // [hp][kValueDim] sum of exp(score - max) * v
};

inline int64_t softmax_state_floats(int64_t hp) { return hp * (3 + kValueDim); }

// A state over floats[softmax_state_floats(hp)].
inline SoftmaxState softmax_state(float* floats, int64_t hp) {
  return {floats, floats + hp, floats + 2 * hp, floats + 3 * hp};
}

inline void reset_softmax_state(const SoftmaxState& s, int64_t hp) {
  for (int64_t h = 0; h < hp; ++h) s.max[h] = -INFINITY, s.sum[h] = 0.0f, s.top[h] = -INFINITY;
  std::memset(s.acc, 0, hp * kValueDim * sizeof(float));
}

// Moves head h's offset up to new_max, rescaling what was accumulated under the old one.
inline void raise_max(const SoftmaxState& s, int64_t h, float new_max) {
  if (s.max[h] != -INFINITY) {
    const float alpha = std::exp(s.max[h] - new_max);
    s.sum[h] *= alpha;
    float* row = s.acc + h * kValueDim;
    for (int64_t d = 0; d < kValueDim; ++d) row[d] *= alpha;
  }
  s.max[h] = new_max;
}

// scores [rows][hp] (the first n rows are real) -> scaled in place; state updated; probs = P rounded to bf16
// (layout: gemm.h), zero for the padding rows.
inline void softmax_step(float* scores, int64_t n, int64_t rows, int64_t hp, float scale, const SoftmaxState& s,
                         ProbElement* probs) {
#if defined(__AVX512BF16__)
  const __m512 vscale = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
  for (int64_t g = 0; g < hp; g += kHeadBlock) {
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t r = 0; r < n; ++r) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(scores + r * hp + g), vscale);
      _mm512_storeu_ps(scores + r * hp + g, x);
      top = _mm512_max_ps(top, x);
    }
    _mm512_storeu_ps(s.top + g, _mm512_max_ps(_mm512_loadu_ps(s.top + g), top));
    const __m512 limit = _mm512_add_ps(_mm512_loadu_ps(s.max + g), _mm512_set1_ps(kMaxSlack));
    const __mmask16 raise = _mm512_cmp_ps_mask(top, limit, _CMP_GT_OQ);
    if (raise) {
      alignas(64) float tops[kHeadBlock];
      _mm512_store_ps(tops, top);
      for (int64_t i = 0; i < kHeadBlock; ++i)
        if (raise & (1u << i)) raise_max(s, g + i, tops[i]);
    }
    const __m512 m = _mm512_loadu_ps(s.max + g);
    __m512 sum = _mm512_loadu_ps(s.sum + g);
#if !defined(DSV4_F32_PRODUCTS)
    static const InterleaveIndex index;
    for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
      __m512i pairs[kRowBlock / 2];
      for (int64_t k = 0; k < kRowBlock / 2; ++k) {
        const int64_t r = r0 + 2 * k;
        const __m512 p0 = r < n ? exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + r * hp + g), m)) : zero;
        const __m512 p1 = r + 1 < n ? exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + (r + 1) * hp + g), m)) : zero;
        sum = _mm512_add_ps(_mm512_add_ps(sum, p0), p1);
        pairs[k] = bf16_pairs(p0, p1, index);
      }
      transpose_16x16_epi32(pairs);  // now one head's 16 pairs (32 rows) per vector
      for (int64_t i = 0; i < kHeadBlock; ++i) _mm512_storeu_si512(probs + (g + i) * rows + r0, pairs[i]);
    }
#else
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 p = r < n ? exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + r * hp + g), m)) : zero;
      sum = _mm512_add_ps(sum, p);
      _mm512_storeu_ps(probs + r * hp + g, widen_bf16((__m256i)_mm512_cvtneps_pbh(p)));
    }
#endif
    _mm512_storeu_ps(s.sum + g, sum);
  }
#else
  float top[kMaxHeads];
  for (int64_t h = 0; h < hp; ++h) top[h] = -INFINITY;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < hp; ++h) {
      const float x = scores[r * hp + h] * scale;
      scores[r * hp + h] = x;
      top[h] = x > top[h] ? x : top[h];
    }
  for (int64_t h = 0; h < hp; ++h) {
    s.top[h] = top[h] > s.top[h] ? top[h] : s.top[h];
    if (top[h] > s.max[h] + kMaxSlack) raise_max(s, h, top[h]);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < hp; ++h) {
      const float p = r < n ? std::exp(scores[r * hp + h] - s.max[h]) : 0.0f;
      s.sum[h] += p;
      probs[h * rows + r] = f32_to_bf16(p);
    }
#endif
}

// dst[d] = bf16(sum_i weight[i] * rows[i][d]) for d < kValueDim.
inline void write_weighted_row(const float* const* rows, const float* weight, int64_t n, uint16_t* dst) {
#if defined(__AVX512BF16__)
  for (int64_t d = 0; d < kValueDim; d += 16) {
    __m512 v = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; ++i) v = _mm512_fmadd_ps(_mm512_set1_ps(weight[i]), _mm512_loadu_ps(rows[i] + d), v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), (__m256i)_mm512_cvtneps_pbh(v));
  }
#else
  for (int64_t d = 0; d < kValueDim; ++d) {
    float v = 0.0f;
    for (int64_t i = 0; i < n; ++i) v += weight[i] * rows[i][d];
    dst[d] = f32_to_bf16(v);
  }
#endif
}

// Where one query's results go. lse and max_logits entries of head h are h * lse_stride apart.
struct QueryOutput {
  uint16_t* out;  // [heads][kValueDim]
  float* lse;
  float* max_logits;  // nullptr: not wanted
  int64_t lse_stride;
  int64_t heads;
  const float* attn_sink;  // [heads] or nullptr
};

constexpr int64_t kMaxParts = 64;  // splits of one query's rows that finish_query combines

// Combines the partial states of one query (the splits of its rows) into its outputs: lse = ln sum of all
// exponentials; out = sum of the parts' acc, each weighted exp(max_i - lse), times 1 / (1 + exp(sink - lse)).
// A NaN score (a NaN in q or in an attended row) reaches a part's sum: that head's out, lse and max_logits are NaN,
// as in the reference, rather than looking like a head with nothing attended.
inline void finish_query(const SoftmaxState* parts, int64_t num_parts, const QueryOutput& o) {
  const float* rows[kMaxParts];
  float weight[kMaxParts];
  for (int64_t h = 0; h < o.heads; ++h) {
    bool nan = false;
    for (int64_t i = 0; i < num_parts; ++i) nan = nan || std::isnan(parts[i].sum[h]);
    if (nan) {
      std::fill(o.out + h * kValueDim, o.out + (h + 1) * kValueDim, f32_to_bf16(NAN));
      o.lse[h * o.lse_stride] = NAN;
      if (o.max_logits) o.max_logits[h * o.lse_stride] = NAN;
      continue;
    }
    float best = -INFINITY, top = -INFINITY;
    for (int64_t i = 0; i < num_parts; ++i) {
      if (parts[i].sum[h] > 0.0f) best = std::fmax(best, parts[i].max[h] + std::log(parts[i].sum[h]));
      top = std::fmax(top, parts[i].top[h]);
    }
    if (o.max_logits) o.max_logits[h * o.lse_stride] = top;
    if (best == -INFINITY) {  // nothing attended: FlashMLA's zero output and +inf lse
      std::memset(o.out + h * kValueDim, 0, kValueDim * sizeof(uint16_t));
      o.lse[h * o.lse_stride] = INFINITY;
      continue;
    }
    float total = 0.0f;
    for (int64_t i = 0; i < num_parts; ++i)
      if (parts[i].sum[h] > 0.0f) total += std::exp(parts[i].max[h] + std::log(parts[i].sum[h]) - best);
    const float lse = best + std::log(total);
    o.lse[h * o.lse_stride] = lse;
    const float sink_factor = o.attn_sink ? 1.0f / (1.0f + std::exp(o.attn_sink[h] - lse)) : 1.0f;
    int64_t n = 0;
    for (int64_t i = 0; i < num_parts; ++i) {
      if (parts[i].sum[h] == 0.0f) continue;
      rows[n] = parts[i].acc + h * kValueDim;
      weight[n++] = std::exp(parts[i].max[h] - lse) * sink_factor;
    }
    write_weighted_row(rows, weight, n, o.out + h * kValueDim);
  }
}

}  // namespace dsv4::cpu::DSV4_ISA
