// Lightning-indexer logits: logit[r, t] = kscale_t * sum_h w[r, h] * relu(<q[r, h], k_t>).
//
// One query row at a time against a run of keys: q is converted once per (row, task) to bf16 pairs
// laid out [pair][head] (the VNNI "B" operand), keys are decoded from e4m3 to bf16 rows (exact), and
// the head dot products run on AMX tiles (amx tier), vdpbf16ps (avx512 tier) or fp32 FMA (others).
// fp8 values are exact in bf16 and every product is exact in fp32; only the fp32 summation order differs
// from the reference.

constexpr int64_t kLogitsMaxHeads = 128;
constexpr int64_t kLogitsMaxDim = 256;
constexpr int64_t kLogitsKeyBlock = 16;  // keys per tile / inner block
constexpr int64_t kLogitsTaskKeys = 512;  // keys per parallel task: long rows spread over all threads
constexpr int64_t kDotLanes = 8;  // head dims are multiples of 32

// ---- e4m3 -> bf16 bits (exact) ----

struct E4m3Bf16Table {
  uint16_t bits[256];
  E4m3Bf16Table() {
    for (int c = 0; c < 256; ++c) bits[c] = f32_to_bf16(e4m3_to_f32_exact(uint8_t(c)));
  }
};
inline const uint16_t* e4m3_bf16_table() {
  static const E4m3Bf16Table table;
  return table.bits;
}

inline void decode_e4m3_row_bf16(const uint8_t* src, int64_t n, uint16_t* dst) {
  const uint16_t* table = e4m3_bf16_table();
  for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
}

inline void decode_e4m3_row_f32(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = e4m3_to_f32(src[i]);
}

// A run of keys to score for one query row: key i is (codes[i], scale[i]); out[i] receives its logit.
struct KeyRun {
  const uint8_t* const* codes;
  const float* scales;
  int64_t count;
};

// Per-task scratch for one query row in the tier's preferred layout.
struct LogitsQuery {
  int64_t heads = 0, heads_padded = 0, dim = 0;
  const float* weights = nullptr;
  alignas(64) float w[kLogitsMaxHeads];
  alignas(64) uint16_t q_pairs[kLogitsMaxDim / 2][kLogitsMaxHeads][2];  // bf16 [pair][head][2]
  alignas(64) float q_f32[kLogitsMaxHeads][kLogitsMaxDim];
};

inline void prepare_query(LogitsQuery& s, const uint8_t* q, int64_t q_stride_h, int64_t heads, int64_t dim,
                          const float* weights) {
  s.heads = heads, s.dim = dim;
  s.heads_padded = (heads + 15) / 16 * 16;
  for (int64_t h = 0; h < s.heads_padded; ++h) s.w[h] = h < heads ? weights[h] : 0.0f;
#if defined(__AVX512BF16__)
  const uint16_t* table = e4m3_bf16_table();
  for (int64_t h = 0; h < s.heads_padded; ++h) {
    for (int64_t d = 0; d < dim; ++d) {
      s.q_pairs[d / 2][h][d % 2] = h < heads ? table[q[h * q_stride_h + d]] : 0;
    }
  }
#else
  for (int64_t h = 0; h < heads; ++h) decode_e4m3_row_f32(q + h * q_stride_h, dim, s.q_f32[h]);
#endif
}

#if defined(__AVX512BF16__)
// Sum over heads of w_h * relu(dots[h]) for one key, dots in 16-head vectors.
inline float weighted_relu_sum(const float* dots, const LogitsQuery& s) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t h = 0; h < s.heads_padded; h += 16) {
    const __m512 d = _mm512_max_ps(_mm512_loadu_ps(dots + h), _mm512_setzero_ps());
    acc = _mm512_fmadd_ps(d, _mm512_load_ps(s.w + h), acc);
  }
  return _mm512_reduce_add_ps(acc);
}
#endif

#if defined(__AMX_BF16__)
// AMX: C[16 keys x 16 heads] += A[16 keys x 32 dims] * B[16 dim pairs x 16 heads x 2].
inline void score_keys_amx(const LogitsQuery& s, const KeyRun& run, float* out) {
  alignas(64) uint16_t keys[kLogitsKeyBlock][kLogitsMaxDim];
  alignas(64) float dots[kLogitsKeyBlock][kLogitsMaxHeads];
  const int64_t head_blocks = s.heads_padded / 16, chunks = s.dim / 32;
  configure_bf16_16x16_tiles();
  for (int64_t k0 = 0; k0 < run.count; k0 += kLogitsKeyBlock) {
    const int64_t n = run.count - k0 < kLogitsKeyBlock ? run.count - k0 : kLogitsKeyBlock;
    for (int64_t i = 0; i < kLogitsKeyBlock; ++i) {
      if (i < n) decode_e4m3_row_bf16(run.codes[k0 + i], s.dim, keys[i]);
      else std::memset(keys[i], 0, s.dim * sizeof(uint16_t));
    }
    for (int64_t hb = 0; hb < head_blocks; ++hb) {
      _tile_zero(0);
      for (int64_t c = 0; c < chunks; ++c) {
        _tile_loadd(1, &keys[0][c * 32], kLogitsMaxDim * sizeof(uint16_t));
        _tile_loadd(2, &s.q_pairs[c * 16][hb * 16][0], kLogitsMaxHeads * 2 * sizeof(uint16_t));
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, &dots[0][hb * 16], kLogitsMaxHeads * sizeof(float));
    }
    for (int64_t i = 0; i < n; ++i) out[k0 + i] = weighted_relu_sum(dots[i], s) * run.scales[k0 + i];
  }
  _tile_release();
}
#endif

#if defined(__AVX512BF16__)
// vdpbf16ps: two keys at a time, 16 heads per accumulator, q pairs loaded once for both keys.
inline void score_keys_avx512(const LogitsQuery& s, const KeyRun& run, float* out) {
  alignas(64) uint16_t keys[2][kLogitsMaxDim];
  alignas(64) float dots[2][kLogitsMaxHeads];
  const int64_t pairs = s.dim / 2;
  for (int64_t k0 = 0; k0 < run.count; k0 += 2) {
    const int64_t n = run.count - k0 < 2 ? run.count - k0 : 2;
    decode_e4m3_row_bf16(run.codes[k0], s.dim, keys[0]);
    if (n == 2) decode_e4m3_row_bf16(run.codes[k0 + 1], s.dim, keys[1]);
    else std::memset(keys[1], 0, s.dim * sizeof(uint16_t));
    const uint32_t* k0_pairs = reinterpret_cast<const uint32_t*>(keys[0]);
    const uint32_t* k1_pairs = reinterpret_cast<const uint32_t*>(keys[1]);
    for (int64_t h = 0; h < s.heads_padded; h += 16) {
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
      for (int64_t p = 0; p < pairs; p += 2) {  // two partial sums per key shorten the dependency chains
        const __m512bh q0 = (__m512bh)_mm512_loadu_si512(&s.q_pairs[p][h][0]);
        const __m512bh q1 = (__m512bh)_mm512_loadu_si512(&s.q_pairs[p + 1][h][0]);
        a0 = _mm512_dpbf16_ps(a0, q0, (__m512bh)_mm512_set1_epi32(int(k0_pairs[p])));
        a1 = _mm512_dpbf16_ps(a1, q1, (__m512bh)_mm512_set1_epi32(int(k0_pairs[p + 1])));
        b0 = _mm512_dpbf16_ps(b0, q0, (__m512bh)_mm512_set1_epi32(int(k1_pairs[p])));
        b1 = _mm512_dpbf16_ps(b1, q1, (__m512bh)_mm512_set1_epi32(int(k1_pairs[p + 1])));
      }
      _mm512_store_ps(&dots[0][h], _mm512_add_ps(a0, a1));
      _mm512_store_ps(&dots[1][h], _mm512_add_ps(b0, b1));
    }
    for (int64_t i = 0; i < n; ++i) out[k0 + i] = weighted_relu_sum(dots[i], s) * run.scales[k0 + i];
  }
}
#endif

// fp32 fallback (generic and avx2 tiers; the compiler vectorizes the dot).
inline void score_keys_f32(const LogitsQuery& s, const KeyRun& run, float* out) {
  alignas(64) float key[kLogitsMaxDim];
  for (int64_t i = 0; i < run.count; ++i) {
    decode_e4m3_row_f32(run.codes[i], s.dim, key);
    float total = 0.0f;
    for (int64_t h = 0; h < s.heads; ++h) {
      float lanes[kDotLanes] = {};  // independent partial sums, so the compiler can vectorize the dot
      for (int64_t d = 0; d < s.dim; d += kDotLanes)
        for (int64_t l = 0; l < kDotLanes; ++l) lanes[l] += s.q_f32[h][d + l] * key[d + l];
      float dot = 0.0f;
      for (float lane : lanes) dot += lane;
      total += s.w[h] * (dot > 0.0f ? dot : 0.0f);
    }
    out[i] = total * run.scales[i];
  }
}

inline void score_keys(const LogitsQuery& s, const KeyRun& run, float* out) {
#if defined(__AMX_BF16__)
  score_keys_amx(s, run, out);
#elif defined(__AVX512BF16__)
  score_keys_avx512(s, run, out);
#else
  score_keys_f32(s, run, out);
#endif
}

inline void fill_neg_inf(float* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = -INFINITY;
}

// Valid length of row (b, j): [b, next_n] lens as given, [b] lens by the causal MTP rule.
inline int64_t paged_row_length(const PagedMqaLogitsParams& p, int64_t b, int64_t j) {
  const int64_t len = p.lens_per_row ? index_at(p.context_lens, b, j) : index_at(p.context_lens, b) - p.next_n + j + 1;
  return len < 0 ? 0 : (len > p.max_context_len ? p.max_context_len : len);
}

inline void fp8_paged_mqa_logits(const PagedMqaLogitsParams& p) {
  // Tasks: (request, run of kLogitsTaskKeys positions); all next_n rows of a request share the keys.
  const int64_t runs_needed = (p.max_context_len + kLogitsTaskKeys - 1) / kLogitsTaskKeys;
  const int64_t runs = runs_needed > 0 ? runs_needed : 1;
  const int64_t entry_bytes = p.head_dim;
  parallel(p.batch * runs, 1, [&](int64_t begin, int64_t end) {
    LogitsQuery* query = new LogitsQuery;
    const uint8_t* codes[kLogitsTaskKeys];
    float scales[kLogitsTaskKeys];
    int64_t positions[kLogitsTaskKeys];
    float scored[kLogitsTaskKeys];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / runs, t0 = (task % runs) * kLogitsTaskKeys;
      const int64_t t1 = t0 + kLogitsTaskKeys < p.max_context_len ? t0 + kLogitsTaskKeys : p.max_context_len;
      int64_t longest = 0;
      for (int64_t j = 0; j < p.next_n; ++j) {
        const int64_t len = paged_row_length(p, b, j);
        longest = len > longest ? len : longest;
      }
      // Gather the present keys of [t0, min(t1, longest)) once for all rows of the request.
      int64_t count = 0;
      const int64_t last = t1 < longest ? t1 : longest;
      for (int64_t t = t0; t < last; ++t) {
        const int64_t page_index = t / p.cache.block_size;
        const int64_t block = page_index < p.max_blocks ? index_at(p.block_table, b, page_index) : -1;
        if (block < 0 || block >= p.cache.num_blocks) continue;  // missing page: the logit stays -inf
        const uint8_t* page = p.cache.base + block * p.cache.block_stride;
        const int64_t off = t % p.cache.block_size;
        codes[count] = page + off * entry_bytes;
        std::memcpy(&scales[count], page + p.cache.block_size * entry_bytes + 4 * off, 4);
        positions[count++] = t;
      }
      for (int64_t j = 0; j < p.next_n; ++j) {
        const int64_t row = b * p.next_n + j;
        float* out = p.out + row * p.out_stride;
        const int64_t len = paged_row_length(p, b, j);
        // Positions of missing pages inside the valid range are -inf in both modes.
        fill_neg_inf(out, t0, p.clean_logits || t1 < len ? t1 : len);
        int64_t n = 0;
        while (n < count && positions[n] < len) ++n;
        if (n == 0) continue;
        prepare_query(*query, p.q + row * p.num_heads * p.head_dim, p.head_dim, p.num_heads, p.head_dim,
                      p.weights + row * p.w_stride);
        score_keys(*query, KeyRun{codes, scales, n}, scored);
        for (int64_t i = 0; i < n; ++i) out[positions[i]] = scored[i];
      }
    }
    delete query;
  });
}

inline void fp8_mqa_logits(const MqaLogitsParams& p) {
  // Tasks: (row, run of kLogitsTaskKeys columns).
  const int64_t runs = p.num_keys > 0 ? (p.num_keys + kLogitsTaskKeys - 1) / kLogitsTaskKeys : 1;
  parallel(p.rows * runs, 1, [&](int64_t begin, int64_t end) {
    LogitsQuery* query = new LogitsQuery;
    const uint8_t* codes[kLogitsTaskKeys];
    int64_t prepared_row = -1;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / runs, c0 = (task % runs) * kLogitsTaskKeys;
      const int64_t c1 = c0 + kLogitsTaskKeys < p.num_keys ? c0 + kLogitsTaskKeys : p.num_keys;
      float* out = p.out + row * p.out_stride;
      int64_t ks = index_at(p.ks, row), ke = index_at(p.ke, row);
      ks = ks < c0 ? c0 : ks;
      ke = ke > c1 ? c1 : ke;
      if (p.clean_logits) {
        fill_neg_inf(out, c0, ks < c1 ? ks : c1);
        fill_neg_inf(out, ke > c0 ? ke : c0, c1);
      }
      if (ks >= ke) continue;
      if (prepared_row != row) {
        prepare_query(*query, p.q + row * p.q_stride_m, p.q_stride_h, p.num_heads, p.head_dim,
                      p.weights + row * p.w_stride);
        prepared_row = row;
      }
      for (int64_t c = ks; c < ke; ++c) codes[c - ks] = p.k + c * p.k_stride;
      score_keys(*query, KeyRun{codes, p.k_scale + ks, ke - ks}, out + ks);
    }
    delete query;
  });
}
