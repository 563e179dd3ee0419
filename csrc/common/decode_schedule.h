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

// Whole blocks of kDecodeBlockEntries that n entries take.
DSV4_HOST_DEVICE inline int64_t entry_blocks(int64_t n) {
  return (n + kDecodeBlockEntries - 1) / kDecodeBlockEntries;
}

// Blocks of kDecodeBlockEntries request r is cut into: the main set (at least one entry, rounded up to a whole
// block) followed by the extra set. Entry e of block j is main entry j*64+e while j < main blocks, else extra.
DSV4_HOST_DEVICE inline int64_t main_blocks(const SparseMlaDecodeParams& p, int64_t r) {
  const int64_t len = set_length(p.main, r);
  return entry_blocks(len > 0 ? len : 1);
}
DSV4_HOST_DEVICE inline int64_t request_blocks(const SparseMlaDecodeParams& p, int64_t r) {
  return main_blocks(p, r) + entry_blocks(set_length(p.extra, r));
}

// Blocks of the longest request the index sets allow (every length at its top-k), counted as request_blocks does.
DSV4_HOST_DEVICE inline int64_t max_request_blocks(const SparseMlaDecodeParams& p) {
  const int64_t main = p.main.indices != nullptr ? p.main.topk : 0;
  const int64_t extra = p.extra.indices != nullptr ? p.extra.topk : 0;
  return entry_blocks(main > 0 ? main : 1) + entry_blocks(extra);
}

// Whether the plan keeps every request whole (one piece each, so no combine step): when, at full lengths, dealing
// ceil(b / parts) whole requests to a partition costs no more than the split plan's budget and its combine. A
// function of the shapes only, so the launcher knows it without reading the plan.
DSV4_HOST_DEVICE inline bool decode_plan_keeps_requests_whole(const SparseMlaDecodeParams& p) {
  const int64_t parts = p.sched.num_parts, cost = max_request_blocks(p) + kDecodeFixedCostBlocks;
  if (parts < 1 || p.b < 1) return true;
  const int64_t per_part = (p.b + parts - 1) / parts;
  return per_part * cost <= (p.b * cost + parts - 1) / parts + kDecodeFixedCostBlocks + kDecodeCombineCostBlocks;
}

// Partition row m of a plan: requests [begin_req, end_req], blocks [begin_block, ...) of the first and [..., end_block)
// of the last, the first piece's split index, whether the first / last request is cut. An empty partition
// (begin_req == b) attends nothing.
DSV4_HOST_DEVICE inline void write_partition(int32_t* m, int64_t begin_req, int64_t end_req, int64_t begin_block,
                                             int64_t end_block, int64_t begin_piece, bool first_cut, bool last_cut) {
  m[0] = int32_t(begin_req), m[1] = int32_t(end_req), m[2] = int32_t(begin_block), m[3] = int32_t(end_block);
  m[4] = int32_t(begin_piece), m[5] = int32_t(first_cut), m[6] = int32_t(last_cut), m[7] = 0;
}

// The whole-request plan: partition k takes consecutive requests while that keeps its cost nearest the remaining
// cost's share of each remaining partition (at least one request; the last partition takes the rest).
DSV4_HOST_DEVICE inline void plan_whole_requests(const SparseMlaDecodeParams& p, int64_t total) {
  const int64_t parts = p.sched.num_parts;
  int32_t* splits = p.sched.num_splits;
  int64_t req = 0, remaining = total;
  splits[0] = 0;
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t begin = req, target = (remaining + (parts - part) - 1) / (parts - part);
    int64_t cost = 0;
    while (req < p.b) {
      const int64_t c = request_blocks(p, req) + kDecodeFixedCostBlocks;
      if (part + 1 < parts && req > begin && 2 * cost + c > 2 * target) break;
      cost += c, splits[req + 1] = int32_t(splits[req] + 1), ++req;
    }
    remaining -= cost;
    int32_t* m = p.sched.sched_meta + part * kDecodeSchedWords;
    if (req == begin) {
      write_partition(m, p.b, p.b - 1, 0, 0, 0, false, false);
    } else {
      write_partition(m, begin, req - 1, 0, request_blocks(p, req - 1), 0, false, false);
    }
  }
}

// A CTA (group) working partition m attends, for each request r in [m[0], m[1]], blocks [r == m[0] ? m[2] : 0,
// r == m[1] ? m[3] : request_blocks(r)); that piece is split row num_splits[r] + (r == m[0] ? m[4] : 0). A request
// with a single piece (num_splits[r + 1] - num_splits[r] == 1) is written straight to the output.
// Whole requests where decode_plan_keeps_requests_whole says so; otherwise a greedy partition of every request's
// blocks into p.sched.num_parts pieces of about equal cost (blocks plus a fixed cost per piece). Writes
// p.sched.sched_meta [num_parts, 8] and p.sched.num_splits [b + 1].
DSV4_HOST_DEVICE inline void plan_decode_schedule(const SparseMlaDecodeParams& p) {
  const int64_t parts = p.sched.num_parts;
  int64_t total = 0;
  for (int64_t r = 0; r < p.b; ++r) total += request_blocks(p, r) + kDecodeFixedCostBlocks;
  if (decode_plan_keeps_requests_whole(p)) return plan_whole_requests(p, total);
  const int64_t budget = (total + parts - 1) / parts + kDecodeFixedCostBlocks;
  int32_t* splits = p.sched.num_splits;
  int64_t req = 0, block = 0, piece = 0;  // next unassigned block: request, block in it, its piece index
  splits[0] = 0;
  for (int64_t part = 0; part < parts; ++part) {
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
    int32_t* m = p.sched.sched_meta + part * kDecodeSchedWords;
    if (begin_req >= p.b || (end_req == begin_req && end_block == begin_block)) {
      write_partition(m, p.b, p.b - 1, 0, 0, 0, false, false);
    } else {
      write_partition(m, begin_req, end_req, begin_block, end_block, begin_piece,
                      begin_block > 0 || (end_req == begin_req && end_block < request_blocks(p, begin_req)),
                      end_block < request_blocks(p, end_req) || (end_req == begin_req && begin_block > 0));
    }
  }
}

}  // namespace dsv4
