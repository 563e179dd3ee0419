// Fused indexer for prefill: each block of query rows scores its context into a row-block buffer
// (O(rows per block x longest row) per thread, never [rows x context]) and selects its top k there.
// Scores use the same code path as fp8_paged_mqa_logits and selection the same as topk_transform,
// so the result equals the unfused pair exactly.
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/indexer/logits.h"
#include "cpu/kernels/topk.h"

namespace dsv4::cpu::DSV4_ISA {

inline void fp8_paged_mqa_topk(const PagedMqaTopkParams& p) {
  const int64_t q_bytes = p.q_scale ? p.head_dim / 2 : p.head_dim, q_scale_bytes = p.head_dim / kMxfp4Block;
  const int64_t blocks = (p.rows + kLogitsRowBlock - 1) / kLogitsRowBlock;
  parallel(blocks, 1, [&](int64_t begin, int64_t end) {
    LogitsQuery* queries = new LogitsQuery[kLogitsRowBlock];
    KeyBuffer keys(p.head_dim);
    [[maybe_unused]] TileScope tiles;
    float scales[kLogitsTaskKeys], scored[kLogitsTaskKeys];
    int64_t positions[kLogitsTaskKeys];
    float* logits = nullptr;
    int64_t capacity = 0;
    for (int64_t block = begin; block < end; ++block) {
      const int64_t r0 = block * kLogitsRowBlock;
      const int64_t r1 = r0 + kLogitsRowBlock < p.rows ? r0 + kLogitsRowBlock : p.rows;
      int64_t lens[kLogitsRowBlock], width = p.k;  // >= every unscored row's length: top-k clamps lengths to it
      bool prepared[kLogitsRowBlock] = {};
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t len = index_at(p.lengths, r);
        lens[r - r0] = len > 0 ? len : 0;
        if (lens[r - r0] > p.k) width = lens[r - r0] > width ? lens[r - r0] : width;  // only scored rows use it
      }
      if (capacity < kLogitsRowBlock * width) {
        delete[] logits;
        capacity = kLogitsRowBlock * width;
        logits = new float[capacity];
      }
      // Rows of one request are scored together against each decoded run of its keys; rows with
      // length <= k need no scores (their top-k is 0..L-1).
      for (int64_t lead = r0; lead < r1; ++lead) {
        const int64_t request = index_at(p.row_requests, lead);
        bool first_of_request = lens[lead - r0] > p.k;
        for (int64_t r = r0; r < lead && first_of_request; ++r)
          first_of_request = !(index_at(p.row_requests, r) == request && lens[r - r0] > p.k);
        if (!first_of_request) continue;
        int64_t longest = 0;
        for (int64_t r = lead; r < r1; ++r) {
          if (index_at(p.row_requests, r) != request || lens[r - r0] <= p.k) continue;
          fill_neg_inf(logits + (r - r0) * width, 0, lens[r - r0]);  // positions of missing pages stay -inf
          longest = lens[r - r0] > longest ? lens[r - r0] : longest;
        }
        for (int64_t t0 = 0; t0 < longest; t0 += kLogitsTaskKeys) {
          const int64_t t1 = t0 + kLogitsTaskKeys < longest ? t0 + kLogitsTaskKeys : longest;
          const int64_t count = gather_paged_keys(p.cache, p.block_table, request, p.max_blocks, p.head_dim, t0, t1,
                                                  keys, scales, positions, p.key_format);
          for (int64_t r = lead; r < r1; ++r) {
            if (index_at(p.row_requests, r) != request || lens[r - r0] <= p.k || lens[r - r0] <= t0) continue;
            int64_t n = 0;
            while (n < count && positions[n] < lens[r - r0]) ++n;
            if (n == 0) continue;
            if (!prepared[r - r0]) {
              prepare_query(queries[r - r0], p.q + r * p.num_heads * q_bytes, q_bytes, p.num_heads, p.head_dim,
                            p.weights + r * p.w_stride, p.q_scale ? p.q_scale + r * p.num_heads * q_scale_bytes : nullptr,
                            q_scale_bytes);
              prepared[r - r0] = true;
            }
            score_keys(queries[r - r0], KeyRun{keys.rows, scales, n}, scored);
            float* row = logits + (r - r0) * width;
            for (int64_t i = 0; i < n; ++i) row[positions[i]] = scored[i];
          }
        }
      }
      TopkTransformParams select;
      select.scores = logits;
      select.rows = r1 - r0, select.width = width, select.score_stride = width;
      select.lengths = IndexView{lens, true, 1, 0};
      select.k = p.k;
      select.raw = p.out + r0 * p.out_stride;
      select.raw_stride = p.out_stride;
      topk_transform(select);  // nested inside this task: runs on the calling thread
    }
    delete[] logits;
    delete[] queries;
  });
}

}  // namespace dsv4::cpu::DSV4_ISA
