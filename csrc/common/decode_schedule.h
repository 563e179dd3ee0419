// The split plan of a sparse decode (FlashMLA's tile-scheduler semantics), as one sequential function that runs
// on the host (CPU op) and in a one-thread CUDA kernel (no host synchronisation), so both give the same plan.
#pragma once
#include <cstdint>

#include "common/indices.h"
#include "common/params.h"

namespace dsv4 {

// Partitions of a plan: `units` (SMs on CUDA, intra-op threads on the CPU) shared by the s_q rows and 64-head
// groups of a step; at least one.
inline int64_t decode_partitions(int64_t units, int64_t s_q, int64_t h_q) {
  const int64_t work = s_q * ((h_q + 63) / 64);
  const int64_t parts = work > 0 ? units / work : units;
  return parts > 1 ? parts : 1;
}

// Entries of one index set request r attends: its length clamped to [0, topk], or topk without lengths.
DSV4_HOST_DEVICE inline int64_t set_length(const SparseIndexSet& s, int64_t r) {
  if (s.indices == nullptr) return 0;
  if (s.lengths.data == nullptr) return s.topk;
  const int64_t len = index_at(s.lengths, r);
  return len < 0 ? 0 : (len > s.topk ? s.topk : len);
}

// Blocks of kDecodeBlockEntries request r is cut into: the main set (at least one entry, rounded up to a whole
// block) followed by the extra set. Entry e of block j is main entry j*64+e while j < main blocks, else extra.
DSV4_HOST_DEVICE inline int64_t main_blocks(const SparseMlaDecodeParams& p, int64_t r) {
  const int64_t len = set_length(p.main, r);
  return (len > 0 ? len + kDecodeBlockEntries - 1 : kDecodeBlockEntries) / kDecodeBlockEntries;
}
DSV4_HOST_DEVICE inline int64_t request_blocks(const SparseMlaDecodeParams& p, int64_t r) {
  return main_blocks(p, r) + (set_length(p.extra, r) + kDecodeBlockEntries - 1) / kDecodeBlockEntries;
}

// A CTA (group) working partition m attends, for each request r in [m[0], m[1]], blocks [r == m[0] ? m[2] : 0,
// r == m[1] ? m[3] : request_blocks(r)); that piece is split row num_splits[r] + (r == m[0] ? m[4] : 0). A request
// with a single piece (num_splits[r + 1] - num_splits[r] == 1) is written straight to the output.
// Greedy partition of every request's blocks into p.sched.num_parts pieces of about equal cost (blocks plus a
// fixed cost per piece). Writes p.sched.sched_meta [num_parts, 8] and p.sched.num_splits [b + 1].
DSV4_HOST_DEVICE inline void plan_decode_schedule(const SparseMlaDecodeParams& p) {
  const int64_t parts = p.sched.num_parts;
  int64_t total = 0;
  for (int64_t r = 0; r < p.b; ++r) total += request_blocks(p, r) + kDecodeFixedCostBlocks;
  const int64_t budget = (total + parts - 1) / parts + kDecodeFixedCostBlocks;
  int32_t* meta = p.sched.sched_meta;
  int32_t* splits = p.sched.num_splits;
  int64_t req = 0, block = 0, piece = 0;  // next unassigned block: request, block in it, its piece index
  splits[0] = 0;
  for (int64_t part = 0; part < parts; ++part) {
    int32_t* m = meta + part * kDecodeSchedWords;
    const int64_t begin_req = req, begin_block = block, begin_piece = piece;
    int64_t end_req = req, end_block = block, remaining = budget;
    const bool last_part = part == parts - 1;
    while (req < p.b) {
      const int64_t left = request_blocks(p, req) - block;
      if (last_part || remaining >= left + kDecodeFixedCostBlocks) {  // the rest of this request fits
        remaining -= left + kDecodeFixedCostBlocks;
        end_req = req, end_block = block + left;
        splits[req + 1] = int32_t(splits[req] + piece + 1);
        ++req, block = 0, piece = 0;
      } else {
        const int64_t take = remaining - kDecodeFixedCostBlocks;
        if (take > 0) {  // cut the request: this partition ends inside it
          end_req = req, end_block = block + take;
          block += take, ++piece;
        }
        break;
      }
    }
    const bool empty = begin_req >= p.b || (end_req == begin_req && end_block == begin_block);
    m[0] = int32_t(empty ? p.b : begin_req);
    m[1] = int32_t(empty ? p.b - 1 : end_req);
    m[2] = int32_t(empty ? 0 : begin_block);
    m[3] = int32_t(empty ? 0 : end_block);
    m[4] = int32_t(empty ? 0 : begin_piece);
    m[5] = int32_t(!empty && (begin_block > 0 || (end_req == begin_req && end_block < request_blocks(p, begin_req))));
    m[6] = int32_t(!empty && (end_block < request_blocks(p, end_req) || (end_req == begin_req && begin_block > 0)));
    m[7] = 0;
  }
}

}  // namespace dsv4
