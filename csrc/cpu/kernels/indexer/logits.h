// Lightning-indexer logits: logit[r, t] = kscale_t * sum_h w[r, h] * relu(<q[r, h], k_t>).
//
// Keys of a task are decoded once from e4m3 to bf16 rows (exact) and shared by every query row that
// sees them; each query row is converted once per thread to bf16 pairs laid out [pair][head] (the VNNI
// "B" operand). Head dot products run on AMX tiles (amx tier), vdpbf16ps (avx512 tier) or fp32 (others).
// fp8 values are exact in bf16 and every product is exact in fp32; only the fp32 summation order differs
// from the reference. MXFP4 keys (68 B entries) are decoded whole into the same bf16 rows with key scale 1, and
// mxfp4 queries into the same query layout (their weights carry no q scale); e2m1 times a power of two is exact in
// bf16 too. The bf16 dot products (avx512dot, amx) treat values below 2^-126 as zero (only blocks whose scale byte
// is 0 or 1 hold such values, far below any logit the tolerance sees); the fp32 tiers keep them.
#pragma once
#include <memory>

#include "cpu/kernels/numerics.h"
#include "cpu/kernels/amx_tiles.h"
#include "cpu/kernels/indexer/mxfp4.h"

namespace dsv4::cpu::DSV4_ISA {

constexpr int64_t kLogitsMaxHeads = 128;
constexpr int64_t kLogitsMaxDim = 256;
constexpr int64_t kLogitsKeyBlock = 16;  // keys per AMX tile; decoded key buffers keep this many spare rows
constexpr int64_t kLogitsTaskKeys = 512;  // keys per parallel task: long rows spread over all threads
constexpr int64_t kDotLanes = 8;  // head dims are multiples of 32
constexpr int64_t kLogitsRowBlock = 16;  // ragged rows sharing one decoded key run
constexpr int64_t kLogitsParts = 64;  // equal-cost ranges of ragged tasks, dealt to the threads in order
constexpr int64_t kLogitsTaskCost = 256;  // a ragged task's fixed cost in row-key pairs (query set-up, key decode)

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
  int64_t i = 0;
#if defined(__AVX512BW__)
  static const __m512i subnormals = e4m3_subnormal_bf16();
  const __m512i unit_scale = _mm512_set1_epi16(int16_t((kUe8m0Bias - kE4m3ExponentBias) << kBf16ExponentShift));
  for (; i + 32 <= n; i += 32) _mm512_storeu_si512(dst + i, e4m3x32_direct(src + i, unit_scale, subnormals));
#endif
  const uint16_t* table = e4m3_bf16_table();
  for (; i < n; ++i) dst[i] = table[src[i]];
}

// One query row in the tier's preferred layout (prepared once per thread and row).
struct LogitsQuery {
  int64_t heads = 0, heads_padded = 0, dim = 0;
  alignas(64) float w[kLogitsMaxHeads];
#if defined(__AVX512BF16__)
  alignas(64) uint32_t q_pairs[kLogitsMaxDim / 2][kLogitsMaxHeads];  // bf16 pairs [pair][head]
#else
  alignas(64) float q_f32[kLogitsMaxHeads][kLogitsMaxDim];
#endif
};

// q_scale: nullptr for e4m3 q; for mxfp4 q (dim / 2 code bytes per head) its UE8M0 bytes, head h's at
// q_scale + h * q_scale_stride_h.
inline void prepare_query(LogitsQuery& s, const uint8_t* q, int64_t q_stride_h, int64_t heads, int64_t dim,
                          const float* weights, const uint8_t* q_scale = nullptr, int64_t q_scale_stride_h = 0) {
  s.heads = heads, s.dim = dim;
  s.heads_padded = (heads + 15) / 16 * 16;
  for (int64_t h = 0; h < s.heads_padded; ++h) s.w[h] = h < heads ? weights[h] : 0.0f;
#if defined(__AVX512BF16__)
  alignas(64) uint32_t row[kLogitsMaxDim / 2];
  for (int64_t h = 0; h < s.heads_padded; ++h) {
    if (h < heads && q_scale)
      decode_mxfp4_row_bf16(q + h * q_stride_h, q_scale + h * q_scale_stride_h, dim, reinterpret_cast<uint16_t*>(row));
    else if (h < heads)
      decode_e4m3_row_bf16(q + h * q_stride_h, dim, reinterpret_cast<uint16_t*>(row));
    for (int64_t pair = 0; pair < dim / 2; ++pair) s.q_pairs[pair][h] = h < heads ? row[pair] : 0;
  }
#else
  for (int64_t h = 0; h < heads; ++h) {
    if (q_scale) {
      decode_mxfp4_row_f32(q + h * q_stride_h, q_scale + h * q_scale_stride_h, dim, s.q_f32[h]);
      continue;
    }
    for (int64_t d = 0; d < dim; ++d) s.q_f32[h][d] = e4m3_to_f32(q[h * q_stride_h + d]);
  }
#endif
}

// bf16 key rows (row stride = head dim) with their fp32 scales; rows past count may be read (spare rows).
struct KeyRun {
  const uint16_t* keys;
  const float* scales;
  int64_t count;
};

// A thread's scratch: decoded keys of the current task, with spare rows for the last tile (zero at first, then
// whatever an earlier task left: their products are never used). One per thread at a time: the rows live in the
// thread's buffer, kept across calls.
struct KeyBuffer {
  uint16_t* rows;
  explicit KeyBuffer(int64_t dim) {
    static thread_local ScratchBuffer scratch;
    rows = reinterpret_cast<uint16_t*>(
        scratch.reserve((kLogitsTaskKeys + kLogitsKeyBlock) * dim * int64_t(sizeof(uint16_t)), true));
  }
};

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
  alignas(64) float dots[kLogitsKeyBlock][kLogitsMaxHeads];
  const int64_t head_blocks = s.heads_padded / 16, chunks = s.dim / 32, key_stride = s.dim * sizeof(uint16_t);
  for (int64_t k0 = 0; k0 < run.count; k0 += kLogitsKeyBlock) {
    const int64_t n = run.count - k0 < kLogitsKeyBlock ? run.count - k0 : kLogitsKeyBlock;
    for (int64_t hb = 0; hb < head_blocks; ++hb) {
      _tile_zero(0);
      for (int64_t c = 0; c < chunks; ++c) {
        _tile_loadd(1, run.keys + k0 * s.dim + c * 32, key_stride);
        _tile_loadd(2, &s.q_pairs[c * 16][hb * 16], kLogitsMaxHeads * sizeof(uint32_t));
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, &dots[0][hb * 16], kLogitsMaxHeads * sizeof(float));
    }
    for (int64_t i = 0; i < n; ++i) out[k0 + i] = weighted_relu_sum(dots[i], s) * run.scales[k0 + i];
  }
}
#endif

#if defined(__AVX512BF16__)
constexpr int64_t kDotKeys = 4;  // keys per register block
constexpr int64_t kDotHeadGroups = 4;  // 16-head groups per register block: 4 x 4 accumulators, 4 query vectors

// dots[i][h] for kDotKeys keys from `keys` and kGroups head groups from group g: vdpbf16ps with a broadcast key pair
// and 16 heads' query pairs, every query vector loaded once for all the keys.
template <int kGroups>
inline void dot_keys_block(const LogitsQuery& s, const uint32_t* keys, int64_t g, float (*dots)[kLogitsMaxHeads]) {
  const int64_t pairs = s.dim / 2;
  __m512 acc[kDotKeys][kGroups];
  for (auto& key : acc)
    for (auto& v : key) v = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh q[kGroups];
    for (int j = 0; j < kGroups; ++j) q[j] = (__m512bh)_mm512_load_si512(&s.q_pairs[p][(g + j) * 16]);
    for (int64_t i = 0; i < kDotKeys; ++i) {
      const __m512bh k = (__m512bh)_mm512_set1_epi32(int(keys[i * pairs + p]));
      for (int j = 0; j < kGroups; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], q[j], k);
    }
  }
  for (int64_t i = 0; i < kDotKeys; ++i)
    for (int j = 0; j < kGroups; ++j) _mm512_store_ps(&dots[i][(g + j) * 16], acc[i][j]);
}

// kDotKeys keys at a time (rows past run.count are the buffer's spare rows), all heads, then the weighted sums.
inline void score_keys_avx512(const LogitsQuery& s, const KeyRun& run, float* out) {
  alignas(64) float dots[kDotKeys][kLogitsMaxHeads];
  const int64_t groups = s.heads_padded / 16;
  for (int64_t k0 = 0; k0 < run.count; k0 += kDotKeys) {
    const int64_t n = run.count - k0 < kDotKeys ? run.count - k0 : kDotKeys;
    const uint32_t* keys = reinterpret_cast<const uint32_t*>(run.keys + k0 * s.dim);
    for (int64_t g = 0; g < groups; g += kDotHeadGroups) {
      const int64_t width = groups - g < kDotHeadGroups ? groups - g : kDotHeadGroups;
      if (width == 4) dot_keys_block<4>(s, keys, g, dots);
      else if (width == 3) dot_keys_block<3>(s, keys, g, dots);
      else if (width == 2) dot_keys_block<2>(s, keys, g, dots);
      else dot_keys_block<1>(s, keys, g, dots);
    }
    for (int64_t i = 0; i < n; ++i) out[k0 + i] = weighted_relu_sum(dots[i], s) * run.scales[k0 + i];
  }
}
#else
// fp32 fallback (generic and avx2 tiers; the compiler vectorizes the dot).
inline void score_keys_f32(const LogitsQuery& s, const KeyRun& run, float* out) {
  alignas(64) float key[kLogitsMaxDim];
  for (int64_t i = 0; i < run.count; ++i) {
    for (int64_t d = 0; d < s.dim; ++d) key[d] = bf16_to_f32(run.keys[i * s.dim + d]);
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
#endif

inline void score_keys(const LogitsQuery& s, const KeyRun& run, float* out) {
#if defined(__AMX_BF16__)
  score_keys_amx(s, run, out);
#elif defined(__AVX512BF16__)
  score_keys_avx512(s, run, out);
#else
  score_keys_f32(s, run, out);
#endif
}

// Tile configuration for the calling thread's tasks (a no-op outside the amx tier).
struct TileScope {
#if defined(__AMX_BF16__)
  TileScope() { configure_bf16_16x16_tiles(); }
  ~TileScope() { _tile_release(); }
#endif
};

// Decodes the keys of positions [t0, t1) of request `request` that have a page in the cache; returns how
// many, with their scales and positions (ascending). Missing pages are skipped: their logits stay -inf.
// mxfp4 pages hold dim / 2 code bytes per entry, then dim / 32 scale bytes per entry; their keys get scale 1.
inline int64_t gather_paged_keys(const PagedCache& cache, const IndexView& table, int64_t request, int64_t max_blocks,
                                 int64_t dim, int64_t t0, int64_t t1, KeyBuffer& keys, float* scales,
                                 int64_t* positions, IndexerFormat format = IndexerFormat::fp8) {
  int64_t count = 0;
  // Page by page: one table read and no division per key.
  for (int64_t page_index = t0 / cache.block_size, start = t0; start < t1; ++page_index) {
    const int64_t page_start = page_index * cache.block_size;
    const int64_t end = page_start + cache.block_size < t1 ? page_start + cache.block_size : t1;
    const int64_t block = page_index < max_blocks ? index_at(table, request, page_index) : -1;
    if (block >= 0 && block < cache.num_blocks) {
      const uint8_t* page = cache.base + block * cache.block_stride;
      for (int64_t t = start; t < end; ++t) {
        const int64_t off = t - page_start;
        if (format == IndexerFormat::mxfp4) {
          const int64_t data = dim / 2, scale_bytes = dim / kMxfp4Block;
          decode_mxfp4_row_bf16(page + off * data, page + cache.block_size * data + off * scale_bytes, dim,
                                keys.rows + count * dim);
          scales[count] = 1.0f;
        } else {
          decode_e4m3_row_bf16(page + off * dim, dim, keys.rows + count * dim);
          std::memcpy(&scales[count], page + cache.block_size * dim + 4 * off, 4);
        }
        positions[count++] = t;
      }
    }
    start = end;
  }
  return count;
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
  const int64_t q_bytes = p.q_scale ? p.head_dim / 2 : p.head_dim, q_scale_bytes = p.head_dim / kMxfp4Block;
  // Tasks: (request, run of kLogitsTaskKeys positions); all next_n rows of a request share the keys.
  const int64_t runs_needed = (p.max_context_len + kLogitsTaskKeys - 1) / kLogitsTaskKeys;
  const int64_t runs = runs_needed > 0 ? runs_needed : 1;
  parallel(p.batch * runs, 1, [&](int64_t begin, int64_t end) {
    // A thread's tasks are consecutive, so a request's prepared query rows are reused across its runs.
    LogitsQuery* queries = new LogitsQuery[p.next_n];
    bool* prepared = new bool[p.next_n];
    int64_t prepared_request = -1;
    KeyBuffer keys(p.head_dim);
    [[maybe_unused]] TileScope tiles;
    float scales[kLogitsTaskKeys];
    int64_t positions[kLogitsTaskKeys];
    float scored[kLogitsTaskKeys];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / runs, t0 = (task % runs) * kLogitsTaskKeys;
      if (b != prepared_request) {
        for (int64_t j = 0; j < p.next_n; ++j) prepared[j] = false;
        prepared_request = b;
      }
      const int64_t t1 = t0 + kLogitsTaskKeys < p.max_context_len ? t0 + kLogitsTaskKeys : p.max_context_len;
      int64_t longest = 0;
      for (int64_t j = 0; j < p.next_n; ++j) {
        const int64_t len = paged_row_length(p, b, j);
        longest = len > longest ? len : longest;
      }
      // The present keys of [t0, min(t1, longest)), decoded once for all rows of the request.
      const int64_t count = gather_paged_keys(p.cache, p.block_table, b, p.max_blocks, p.head_dim, t0,
                                              t1 < longest ? t1 : longest, keys, scales, positions, p.key_format);
      for (int64_t j = 0; j < p.next_n; ++j) {
        const int64_t row = b * p.next_n + j;
        float* out = p.out + row * p.out_stride;
        const int64_t len = paged_row_length(p, b, j);
        // Positions of missing pages inside the valid range are -inf in both modes.
        fill_neg_inf(out, t0, p.clean_logits || t1 < len ? t1 : len);
        int64_t n = 0;
        while (n < count && positions[n] < len) ++n;
        if (n == 0) continue;
        if (!prepared[j]) {
          prepare_query(queries[j], p.q + row * p.num_heads * q_bytes, q_bytes, p.num_heads, p.head_dim,
                        p.weights + row * p.w_stride, p.q_scale ? p.q_scale + row * p.num_heads * q_scale_bytes : nullptr,
                        q_scale_bytes);
          prepared[j] = true;
        }
        score_keys(queries[j], KeyRun{keys.rows, scales, n}, scored);
        for (int64_t i = 0; i < n; ++i) out[positions[i]] = scored[i];
      }
    }
    delete[] prepared;
    delete[] queries;
  });
}

inline void fp8_mqa_logits(const MqaLogitsParams& p) {
  // Tasks: (block of kLogitsRowBlock rows, run of kLogitsTaskKeys keys): the run is decoded once for the block.
  const int64_t runs = p.num_keys > 0 ? (p.num_keys + kLogitsTaskKeys - 1) / kLogitsTaskKeys : 1;
  const int64_t row_blocks = (p.rows + kLogitsRowBlock - 1) / kLogitsRowBlock, tasks = row_blocks * runs;
  // Task costs (row-key pairs, plus a fixed part), so that the threads get equal work where later rows see more
  // keys (causal prefill) instead of equal task counts.
  std::unique_ptr<int64_t[]> prefix(new int64_t[tasks + 1]);
  prefix[0] = 0;
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t block = task / runs, c0 = (task % runs) * kLogitsTaskKeys;
    const int64_t c1 = c0 + kLogitsTaskKeys < p.num_keys ? c0 + kLogitsTaskKeys : p.num_keys;
    const int64_t r1 = (block + 1) * kLogitsRowBlock < p.rows ? (block + 1) * kLogitsRowBlock : p.rows;
    int64_t cost = kLogitsTaskCost;
    for (int64_t row = block * kLogitsRowBlock; row < r1; ++row) {
      const int64_t ks = index_at(p.ks, row) > c0 ? index_at(p.ks, row) : c0;
      const int64_t ke = index_at(p.ke, row) < c1 ? index_at(p.ke, row) : c1;
      cost += ke > ks ? ke - ks : 0;
    }
    prefix[task + 1] = prefix[task] + cost;
  }
  const auto task_at = [&](int64_t part) {  // first task of part `part` of kLogitsParts equal-cost parts
    const int64_t goal = part >= kLogitsParts ? prefix[tasks] + 1 : prefix[tasks] * part / kLogitsParts;
    return int64_t(std::lower_bound(prefix.get(), prefix.get() + tasks, goal) - prefix.get());
  };
  float unit_scales[kLogitsTaskKeys];  // mxfp4 keys: scale 1 (their blocks' scales are in the decoded rows)
  for (float& scale : unit_scales) scale = 1.0f;
  parallel(kLogitsParts, 1, [&](int64_t part_begin, int64_t part_end) {
    const int64_t begin = task_at(part_begin), end = task_at(part_end);
    LogitsQuery* queries = new LogitsQuery[kLogitsRowBlock];
    bool prepared[kLogitsRowBlock] = {};
    int64_t prepared_block = -1;
    KeyBuffer keys(p.head_dim);
    [[maybe_unused]] TileScope tiles;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = task / runs, c0 = (task % runs) * kLogitsTaskKeys;
      const int64_t c1 = c0 + kLogitsTaskKeys < p.num_keys ? c0 + kLogitsTaskKeys : p.num_keys;
      if (block != prepared_block) {
        for (bool& ready : prepared) ready = false;
        prepared_block = block;
      }
      const int64_t r0 = block * kLogitsRowBlock;
      const int64_t r1 = r0 + kLogitsRowBlock < p.rows ? r0 + kLogitsRowBlock : p.rows;
      int64_t lo = c1, hi = c0;  // union of the block's ranges inside the run: only those keys are decoded
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t ks = index_at(p.ks, row) > c0 ? index_at(p.ks, row) : c0;
        const int64_t ke = index_at(p.ke, row) < c1 ? index_at(p.ke, row) : c1;
        if (ks < ke) lo = ks < lo ? ks : lo, hi = ke > hi ? ke : hi;
      }
      for (int64_t c = lo; c < hi; ++c) {
        if (p.key_format == IndexerFormat::mxfp4)
          decode_mxfp4_row_bf16(p.k + c * p.k_stride, p.k_scale_ue8m0 + c * p.k_scale_stride, p.head_dim,
                                keys.rows + (c - c0) * p.head_dim);
        else
          decode_e4m3_row_bf16(p.k + c * p.k_stride, p.head_dim, keys.rows + (c - c0) * p.head_dim);
      }
      for (int64_t row = r0; row < r1; ++row) {
        float* out = p.out + row * p.out_stride;
        const int64_t ks = index_at(p.ks, row) > c0 ? index_at(p.ks, row) : c0;
        const int64_t ke = index_at(p.ke, row) < c1 ? index_at(p.ke, row) : c1;
        if (p.clean_logits) {
          fill_neg_inf(out, c0, ks < c1 ? ks : c1);
          fill_neg_inf(out, ke > c0 ? ke : c0, c1);
        }
        if (ks >= ke) continue;
        LogitsQuery& query = queries[row - r0];
        if (!prepared[row - r0]) {
          prepare_query(query, p.q + row * p.q_stride_m, p.q_stride_h, p.num_heads, p.head_dim,
                        p.weights + row * p.w_stride, p.q_scale ? p.q_scale + row * p.q_scale_stride_m : nullptr,
                        p.q_scale_stride_h);
          prepared[row - r0] = true;
        }
        const float* key_scales = p.key_format == IndexerFormat::mxfp4 ? unit_scales : p.k_scale + ks;
        score_keys(query, KeyRun{keys.rows + (ks - c0) * p.head_dim, key_scales, ke - ks}, out + ks);
      }
    }
    delete[] queries;
  });
}

}  // namespace dsv4::cpu::DSV4_ISA
