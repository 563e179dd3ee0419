// Sparse MLA attention (FlashMLA semantics) over fp8 paged caches (decode) and bf16 rows (prefill).
//
// Per query token, its valid attended rows (main set then extra set, in column order; a row listed twice is
// attended twice; invalid entries are never read) are staged kStageRows at a time as bf16, dequantized once
// and shared by all heads, for S^T = K Q^T; every kValueRows rows follow an online softmax with heads in
// vector lanes and acc += P V (gemm.h, softmax.h). With few queries per thread (decode
// batch 1) each query's columns are split across threads and the partial states merged through their lse,
// so results depend on the thread count the way FlashMLA's depend on the SM count.
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/sparse_mla/rows.h"
#include "cpu/kernels/sparse_mla/gemm.h"
#include "cpu/kernels/sparse_mla/softmax.h"

namespace dsv4::cpu::DSV4_ISA {

constexpr int64_t kStageRows = 128;  // rows staged as keys per scores product (a multiple of kRowBlock)
constexpr int64_t kValueRows = 512;  // rows per softmax and P.V product (a multiple of kStageRows): fewer passes
                                     // of the fp32 accumulator through the cache
// A split of less work (columns x padded heads: 128 columns at 64 heads) costs about as much to start and merge as
// it saves (1 against 2 threads at batch 1, docs/perf.md "CPU: AMD EPYC").
constexpr int64_t kMinSplitWork = 128 * 64;
constexpr int64_t kQueriesPerThreadUnsplit = 4;  // from this many queries per thread on, whole queries balance well
constexpr int64_t kPrefetchRows = 8;  // rows fetched ahead of staging: about one DRAM latency of staging work

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// One thread's buffers for one query (sized for 128 heads, d_qk 576) and its list of attended rows.
struct AttentionBuffers {
  uint16_t *keys, *values;
  QueryElement* qpack;
  ProbElement* probs;
  float *scores, *state;
  AttendedRow* rows;
};

inline AttentionBuffers thread_buffers(int64_t max_rows) {
  constexpr int64_t kBf16 = sizeof(uint16_t), kF32 = sizeof(float);
  const int64_t sizes[] = {kStageRows * kMaxQkDim * kBf16, kValueRows * kValueDim * kBf16,
                           kMaxHeads * kMaxQkDim * int64_t(sizeof(QueryElement)),
                           kMaxHeads * kValueRows * int64_t(sizeof(ProbElement)), kValueRows * kMaxHeads * kF32,
                           softmax_state_floats(kMaxHeads) * kF32, max_rows * int64_t(sizeof(AttendedRow))};
  constexpr int kRegions = sizeof(sizes) / sizeof(sizes[0]);
  int64_t total = 0;
  for (int64_t s : sizes) total += round_up(s, kBufferAlign);
  static thread_local ScratchBuffer scratch;
  uint8_t* p = scratch.reserve(total);
  uint8_t* region[kRegions];
  for (int i = 0; i < kRegions; ++i) region[i] = p, p += round_up(sizes[i], kBufferAlign);
  return {reinterpret_cast<uint16_t*>(region[0]), reinterpret_cast<uint16_t*>(region[1]),
          reinterpret_cast<QueryElement*>(region[2]), reinterpret_cast<ProbElement*>(region[3]),
          reinterpret_cast<float*>(region[4]), reinterpret_cast<float*>(region[5]),
          reinterpret_cast<AttendedRow*>(region[6])};
}

inline int64_t split_count(int64_t queries, int64_t columns, int64_t hp, int64_t threads) {
  if (threads <= 1 || queries >= kQueriesPerThreadUnsplit * threads) return 1;
  int64_t gcd = queries, rest = threads;
  while (rest) {
    const int64_t r = gcd % rest;
    gcd = rest, rest = r;
  }
  const int64_t balanced = threads / gcd;  // queries * balanced items spread evenly over the threads
  int64_t most = columns * hp / kMinSplitWork;
  most = most < kMaxParts ? most : kMaxParts;
  return most < 1 ? 1 : (balanced < most ? balanced : most);
}

// Attends query t over its columns [c0, c1) into state s.
template <class Problem>
inline void attend_columns(const Problem& pb, int64_t t, int64_t c0, int64_t c1, int64_t hp, const AttentionBuffers& b,
                           const SoftmaxState& s) {
  reset_softmax_state(s, hp);
  const int64_t count = pb.gather(t, c0, c1, b.rows);
  if (count == 0) return;
  for (int64_t i = 0; i < kPrefetchRows && i < count; ++i) prefetch_row(b.rows[i], pb.d_qk);
  pack_query(pb.query(t), pb.q_stride_h, pb.heads, hp, pb.d_qk, b.qpack);
  for (int64_t v0 = 0; v0 < count; v0 += kValueRows) {
    const int64_t n = count - v0 < kValueRows ? count - v0 : kValueRows, rows = round_up(n, kRowBlock);
    for (int64_t k0 = 0; k0 < rows; k0 += kStageRows) {
      const int64_t stage = rows - k0 < kStageRows ? rows - k0 : kStageRows;
      // Row pairs are staged and interleaved while they are still in L1; padding rows are zero.
      for (int64_t i = 0; i < stage; ++i) {
        const int64_t r = v0 + k0 + i;
        uint16_t* key = b.keys + i * pb.d_qk;
        if (r < count) {
          if (r + kPrefetchRows < count) prefetch_row(b.rows[r + kPrefetchRows], pb.d_qk);
          stage_row(b.rows[r], pb.d_qk, key);
        } else {
          std::memset(key, 0, pb.d_qk * sizeof(uint16_t));
        }
        if (i % 2) interleave_value_pair(key - pb.d_qk, key, b.values + ((k0 + i) / 2) * kValuePairStride);
      }
      // The products a row block at a time, each followed by a row block of the next stage fetched into L2: the
      // fetches spread over the products instead of queueing up behind each other.
      for (int64_t i = 0; i < stage; i += kRowBlock) {
        attention_scores(b.keys + i * pb.d_qk, pb.d_qk, kRowBlock, b.qpack, hp, b.scores + (k0 + i) * hp);
        for (int64_t next = v0 + k0 + kStageRows + i; next < v0 + k0 + kStageRows + i + kRowBlock && next < count;
             ++next)
          prefetch_row<2>(b.rows[next], pb.d_qk);
      }
    }
    softmax_step(b.scores, n, rows, hp, pb.scale, s, b.probs);
    accumulate_values(b.probs, rows, b.values, hp, s.acc);
  }
}

// Problem: queries, heads, d_qk, q_stride_h, scale, threads, max_columns; query(t), columns(t),
// gather(t, c0, c1, rows) -> count, output(t) -> QueryOutput.
template <class Problem>
inline void run_sparse_attention(const Problem& pb) {
  const int64_t hp = round_up(pb.heads, kHeadBlock), state_floats = softmax_state_floats(hp);
  const int64_t splits = split_count(pb.queries, pb.max_columns, hp, pb.threads);
  // Split queries: every part's state, and per query a count of finished parts; the last part to finish
  // combines them, so one parallel region does all the work.
  static thread_local ScratchBuffer partial_states;
  const int64_t counter_bytes = round_up(pb.queries * int64_t(sizeof(int64_t)), kBufferAlign);
  uint8_t* partial =
      splits > 1 ? partial_states.reserve(counter_bytes + pb.queries * splits * state_floats * int64_t(sizeof(float)))
                 : nullptr;
  int64_t* finished = reinterpret_cast<int64_t*>(partial);
  float* parts = reinterpret_cast<float*>(partial + counter_bytes);
  if (splits > 1) std::memset(finished, 0, pb.queries * sizeof(int64_t));
  parallel(pb.queries * splits, 1, [&](int64_t begin, int64_t end) {
    const AttentionBuffers b = thread_buffers(pb.max_columns);
#if defined(__AMX_BF16__)
    configure_attention_tiles();
#endif
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / splits, part = item % splits, columns = pb.columns(t);
      const SoftmaxState s = softmax_state(splits > 1 ? parts + item * state_floats : b.state, hp);
      attend_columns(pb, t, columns * part / splits, columns * (part + 1) / splits, hp, b, s);
      if (splits == 1) {
        finish_query(&s, 1, pb.output(t));
      } else if (__atomic_add_fetch(finished + t, 1, __ATOMIC_ACQ_REL) == splits) {
        SoftmaxState states[kMaxParts];
        for (int64_t i = 0; i < splits; ++i) states[i] = softmax_state(parts + (t * splits + i) * state_floats, hp);
        finish_query(states, splits, pb.output(t));
      }
    }
#if defined(__AMX_BF16__)
    _tile_release();
#endif
  });
}

inline int64_t index_entry(const void* indices, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<const int64_t*>(indices)[i] : static_cast<const int32_t*>(indices)[i];
}

// Candidate columns of row `row` of an index tensor with `topk` columns: topk, cut by lengths[row] when given.
inline int64_t length_columns(const IndexView& lengths, int64_t row, int64_t topk) {
  if (!lengths.data) return topk;
  const int64_t length = index_at(lengths, row);
  return length < 0 ? 0 : (length < topk ? length : topk);
}

// Candidate columns of one index set for batch b.
inline int64_t set_columns(const SparseIndexSet& set, int64_t b) {
  return set.indices ? length_columns(set.lengths, b, set.topk) : 0;
}

// Valid rows of columns [c0, c1) of one set for query (b, s).
inline int64_t gather_set(const SparseIndexSet& set, int64_t b, int64_t s, int64_t c0, int64_t c1, AttendedRow* rows) {
  int64_t count = 0;
  const int64_t base = b * set.stride_b + s * set.stride_s;
  for (int64_t c = c0; c < c1; ++c)
    count += cache_row(set.cache, set.layout, index_entry(set.indices, set.is_int64, base + c * set.stride_k),
                       rows + count);
  return count;
}

struct DecodeProblem {
  const SparseMlaDecodeParams& p;
  int64_t queries, heads, d_qk, q_stride_h, threads, max_columns;
  float scale;

  explicit DecodeProblem(const SparseMlaDecodeParams& params)
      : p(params), queries(params.b * params.s_q), heads(params.h_q), d_qk(params.d_qk), q_stride_h(params.q_stride_h),
        threads(params.threads), max_columns(params.main.topk + (params.extra.indices ? params.extra.topk : 0)),
        scale(params.sm_scale) {}

  const uint16_t* query(int64_t t) const { return p.q + (t / p.s_q) * p.q_stride_b + (t % p.s_q) * p.q_stride_s; }
  int64_t columns(int64_t t) const { return set_columns(p.main, t / p.s_q) + set_columns(p.extra, t / p.s_q); }
  // Columns [0, main) are the main set's, the rest the extra set's.
  int64_t gather(int64_t t, int64_t c0, int64_t c1, AttendedRow* rows) const {
    const int64_t b = t / p.s_q, s = t % p.s_q, main = set_columns(p.main, b);
    const int64_t count = gather_set(p.main, b, s, c0, c1 < main ? c1 : main, rows);
    return count + gather_set(p.extra, b, s, c0 > main ? c0 - main : 0, c1 - main, rows + count);
  }
  QueryOutput output(int64_t t) const {
    const int64_t b = t / p.s_q, s = t % p.s_q;
    return {p.out + t * p.h_q * p.d_v, p.lse + b * p.h_q * p.s_q + s, nullptr, p.s_q, p.h_q, p.attn_sink};
  }
};

struct PrefillProblem {
  const SparseMlaPrefillParams& p;
  int64_t queries, heads, d_qk, q_stride_h, threads, max_columns;
  float scale;

  explicit PrefillProblem(const SparseMlaPrefillParams& params)
      : p(params), queries(params.s_q), heads(params.h_q), d_qk(params.d_qk), q_stride_h(params.q_stride_h),
        threads(params.threads), max_columns(params.topk), scale(params.sm_scale) {}

  const uint16_t* query(int64_t t) const { return p.q + t * p.q_stride_s; }
  int64_t columns(int64_t t) const { return length_columns(p.topk_length, t, p.topk); }
  int64_t gather(int64_t t, int64_t c0, int64_t c1, AttendedRow* rows) const {
    int64_t count = 0;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i = index_entry(p.indices, p.is_int64, t * p.idx_stride_s + c * p.idx_stride_k);
      if (i < 0 || i >= p.s_kv) continue;
      rows[count++] = {reinterpret_cast<const uint8_t*>(p.kv + i * p.kv_stride), nullptr, RowFormat::bf16};
    }
    return count;
  }
  QueryOutput output(int64_t t) const {
    return {p.out + t * p.h_q * p.d_v, p.lse + t * p.h_q, p.max_logits + t * p.h_q, 1, p.h_q, p.attn_sink};
  }
};

inline void sparse_mla_decode(const SparseMlaDecodeParams& p) { run_sparse_attention(DecodeProblem(p)); }
inline void sparse_mla_prefill(const SparseMlaPrefillParams& p) { run_sparse_attention(PrefillProblem(p)); }

// The decode plan alone: the planner is compiled once, in a baseline translation unit (cpu/decode_schedule.cpp).
inline void sparse_mla_decode_schedule(const SparseMlaDecodeParams& p) { plan_decode_schedule_host(p); }

}  // namespace dsv4::cpu::DSV4_ISA
