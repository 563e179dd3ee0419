// Lightning-indexer scores, Hopper tier: fp8_paged_mqa_logits and the scoring half of the fused
// fp8_paged_mqa_topk. A warpgroup scores 64 keys per step against every (query row, head) column of a request with
// f16 wgmma: e4m3 -> f16 is exact and so are the products; the sums are fp32. Keys go from global memory straight
// into the A fragments, their dims permuted so that a thread's share of a key is 32 contiguous bytes (q is stored
// in the same order); the next tile's loads are in flight under this tile's MMA. The epilogue sums w[h] * relu(dot)
// over a thread's heads, then across its quad, and multiplies by the key's fp32 scale.
#include <algorithm>

#include "cuda/launchers.h"
#include "cuda/portable/indexer/score.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace dsv4::cuda::sm90 {
namespace {

constexpr int kThreads = 128;
constexpr int kTileKeys = 64;
constexpr int kDim = 128;  // indexer head dim
constexpr int kSteps = kDim / 16;  // k16 steps over a key
constexpr int kHalfBytes = kDim / 2;  // offset of a quad lane's second 16 bytes of a key
constexpr int kStages = 4;  // bulk path: key tiles in flight per CTA
constexpr int kMaxCols = 128;  // (query row, head) columns of one wgmma
constexpr int64_t kMinTilesPerCta = 2;  // the second tile's copy lands under the first one's scoring
constexpr int64_t kMaxTilesPerCta = 64;
constexpr int64_t kMaxGridY = 65535;

// ---- the two jobs: a request's next_n rows (paged logits) or one prefill row (fused top-k), per CTA group ----

DSV4_DEVICE int64_t groups(const PagedMqaLogitsParams& p) { return p.batch; }
DSV4_DEVICE int64_t groups(const PagedMqaTopkParams& p) { return p.rows; }
DSV4_DEVICE int64_t output_width(const PagedMqaLogitsParams& p) { return p.max_context_len; }
DSV4_DEVICE int64_t output_width(const PagedMqaTopkParams& p) {
  return std::min<int64_t>(p.max_blocks * p.cache.block_size, INT32_MAX);
}
DSV4_DEVICE bool cleans(const PagedMqaLogitsParams& p) { return p.clean_logits; }
DSV4_DEVICE bool cleans(const PagedMqaTopkParams&) { return false; }
DSV4_DEVICE int64_t group_request(const PagedMqaLogitsParams&, int64_t g) { return g; }
DSV4_DEVICE int64_t group_request(const PagedMqaTopkParams& p, int64_t g) {
  const int64_t r = index_at(p.row_requests, g);
  return r >= 0 && r < p.num_requests ? r : -1;  // an invalid request scores -inf everywhere
}

// Query row j of group g: its q / weights row (-1 when absent), valid length and output row.
struct RowSetup {
  int64_t row = -1, length = 0;
  float* out = nullptr;
};
DSV4_DEVICE RowSetup row_setup(const PagedMqaLogitsParams& p, int64_t g, int j) {
  if (j >= p.next_n) return {};
  const int64_t row = g * p.next_n + j;
  return {row, paged_row_length(p, g, j), p.out + row * p.out_stride};
}
DSV4_DEVICE RowSetup row_setup(const PagedMqaTopkParams& p, int64_t g, int j) {
  if (j > 0) return {};
  const int64_t requested = index_at(p.lengths, g);  // rows of length <= k need no scores
  const int64_t length = requested > p.k ? std::min(requested, output_width(p)) : 0;
  return {g, length, p.workspace + g * p.max_blocks * p.cache.block_size};
}

// ---- keys: a thread loads the 32 bytes of its quad lane for token rows row0 and row0 + 8 of a tile ----

struct KeyTile {
  uint4 first[2], second[2];  // [row]: the lane's two 16-byte pieces
  float scale[2];
  bool present[2];
};

template <bool kVector>
DSV4_SM90_DEVICE uint4 load_16(const uint8_t* p) {
  if constexpr (kVector) {
    return __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(p);
    return make_uint4(__ldg(w), __ldg(w + 1), __ldg(w + 2), __ldg(w + 3));
  }
}

// Where the token rows row0 and row0 + 8 of tile t0 live: block -1 when at or past key_end, on a missing page or
// of an invalid request. Positions fit 32 bits (the launchers keep widths within INT32_MAX).
struct KeyLookup {
  int64_t block[2];
  uint32_t entry[2];
};

template <typename Params>
DSV4_SM90_DEVICE KeyLookup lookup_keys(const Params& p, int64_t request, int64_t t0, int64_t key_end, int row0) {
  KeyLookup l;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t pos = t0 + row0 + 8 * i;
    const uint32_t page = uint32_t(pos) / uint32_t(p.cache.block_size);
    l.entry[i] = uint32_t(pos) - page * uint32_t(p.cache.block_size);
    l.block[i] = request >= 0 && pos < key_end && page < p.max_blocks ? index_at(p.block_table, request, page) : -1;
  }
  return l;
}

DSV4_SM90_DEVICE bool present(const PagedCache& cache, int64_t block) { return block >= 0 && block < cache.num_blocks; }

// Pulls the lines of a looked-up tile into L2 (one lane per key row, another for its scale) ahead of the loads.
DSV4_SM90_DEVICE void prefetch_keys(const PagedCache& cache, const KeyLookup& l, int lane_c) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!present(cache, l.block[i]) || lane_c > 1) continue;
    const uint8_t* page = cache.base + l.block[i] * cache.block_stride;
    const uint8_t* line = lane_c == 0 ? page + l.entry[i] * kDim : page + cache.block_size * kDim + 4 * l.entry[i];
    prefetch_l2(line);
  }
}

template <bool kVector>
DSV4_SM90_DEVICE KeyTile load_keys(const PagedCache& cache, const KeyLookup& l, int lane_c) {
  KeyTile k;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    k.present[i] = present(cache, l.block[i]);
    k.first[i] = k.second[i] = make_uint4(0u, 0u, 0u, 0u);
    k.scale[i] = 0.0f;
    if (k.present[i]) {
      const uint8_t* page = cache.base + l.block[i] * cache.block_stride;
      const uint8_t* key = page + l.entry[i] * kDim + lane_c * 16;
      k.first[i] = load_16<kVector>(key), k.second[i] = load_16<kVector>(key + kHalfBytes);
      k.scale[i] = __ldg(reinterpret_cast<const float*>(page + cache.block_size * kDim + 4 * l.entry[i]));
    }
  }
  return k;
}

// Two e4m3 codes (low byte first) -> f16x2, exact.
DSV4_SM90_DEVICE uint32_t e4m3x2_to_f16x2(uint32_t codes) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(uint16_t(codes & 0xffffu)));
  return r;
}

// Quad lane c holds bytes [16 c, 16 c + 16) and [64 + 16 c, 80 + 16 c) of a key (a warp's loads cover whole
// sectors), word s of them feeding k16 step s. Logical dim k (step s = k / 16) lives at byte 4 (s % 4) + e of
// the half s / 4 of lane c's share, where the A fragment puts logical dims 2c, 2c + 1 (e = 0, 1) and 2c + 8,
// 2c + 9 (e = 2, 3) of step s in lane c.
DSV4_SM90_DEVICE int physical_dim(int k) {
  const int s = k / 16, kl = k % 16, c = (kl & 7) >> 1;
  return (s / 4) * (kDim / 2) + c * 16 + 4 * (s % 4) + (kl & 1) + 2 * (kl >> 3);
}

// Byte offset of 16-byte chunk c (logical dims 8c .. 8c + 7) of column n in the q tile: two 64-dim slabs of kCols
// rows of 128 bytes, chunks XOR-permuted by the row (wgmma's 128-byte swizzle, K-major).
template <int kCols>
DSV4_SM90_DEVICE uint32_t q_offset(int n, int c) {
  return uint32_t((c / 8) * kCols * 128 + n * 128 + (((c % 8) ^ (n % 8)) * 16));
}

// Column n = j * kHeadsPad + h holds head h of query row j as f16 in permuted dim order; padding columns are zero.
template <int kHeadsPad, int kCols, typename Params>
DSV4_SM90_DEVICE void store_queries(const Params& p, const int64_t* rows, uint8_t* q_tile, float* weights) {
  for (int i = threadIdx.x; i < kCols * kDim / 8; i += kThreads) {
    const int n = i / (kDim / 8), c = i % (kDim / 8), j = n / kHeadsPad, h = n % kHeadsPad;
    uint32_t words[4] = {0u, 0u, 0u, 0u};
    if (rows[j] >= 0 && h < p.num_heads) {
      const uint8_t* head = p.q + (rows[j] * p.num_heads + h) * kDim;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int d = physical_dim(8 * c + 2 * w);  // its pair partner is d + 1
        words[w] = e4m3x2_to_f16x2(uint32_t(head[d]) | uint32_t(head[d + 1]) << 8);
      }
    }
    *reinterpret_cast<uint4*>(q_tile + q_offset<kCols>(n, c)) = make_uint4(words[0], words[1], words[2], words[3]);
  }
  for (int n = threadIdx.x; n < kCols; n += kThreads) {
    const int j = n / kHeadsPad, h = n % kHeadsPad;
    weights[n] = rows[j] >= 0 && h < p.num_heads ? p.weights[rows[j] * p.w_stride + h] : 0.0f;
  }
}

template <int kCols>
DSV4_SM90_DEVICE void wgmma_f16_rs(float (&d)[kCols / 8][4], const uint32_t (&a)[4], uint64_t b, uint32_t accumulate) {
  if constexpr (kCols == 64) {
    wgmma_64x64x16_f16_rs(d, a, b, accumulate);
  } else {
    wgmma_64x128x16_f16_rs(d, a, b, accumulate);
  }
}

// d[token row][column] = <key, q column> over the 128 dims of a tile; `under` runs while the wgmma are in flight.
template <int kCols, typename Under>
DSV4_SM90_DEVICE void score_tile(const KeyTile& k, uint32_t q_base, float (&d)[kCols / 8][4], const Under& under) {
  const uint32_t w0[8] = {k.first[0].x, k.first[0].y, k.first[0].z, k.first[0].w,
                          k.second[0].x, k.second[0].y, k.second[0].z, k.second[0].w};
  const uint32_t w1[8] = {k.first[1].x, k.first[1].y, k.first[1].z, k.first[1].w,
                          k.second[1].x, k.second[1].y, k.second[1].z, k.second[1].w};
  uint32_t a[kSteps][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    a[s][0] = e4m3x2_to_f16x2(w0[s]), a[s][1] = e4m3x2_to_f16x2(w1[s]);
    a[s][2] = e4m3x2_to_f16x2(w0[s] >> 16), a[s][3] = e4m3x2_to_f16x2(w1[s] >> 16);
  }
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {  // the first step overwrites d
    const uint32_t address = q_base + (s / 4) * kCols * 128 + (s % 4) * 32;
    wgmma_f16_rs<kCols>(d, a[s], swizzled_descriptor(address, 16, kSwizzleAtomBytes), s > 0);
  }
  wgmma_commit();
  under();
  wgmma_wait_all();
#pragma unroll
  for (int t = 0; t < kCols / 8; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[t][i])::"memory");  // read only after the wait
}

// Shared state of a scoring CTA; the key ring and its barriers serve the bulk path only.
template <int kCols, int kRows>
struct ScoreSmem {
  alignas(1024) uint8_t q_tile[kCols * kDim * 2];
  alignas(128) uint8_t keys[kStages][kTileKeys * kDim];
  alignas(16) float scales[kStages][kTileKeys];
  alignas(8) uint64_t full[kStages];
  int tile_valid[kStages];
  int64_t codes_at[kMaxTilesPerCta], scales_at[kMaxTilesPerCta];  // bytes from the cache base; -1: no page
  float weights[kCols];
  int64_t rows[kRows], lengths[kRows];
  float* outs[kRows];
};

// The weights of a thread's columns (8 n8 + 2 lane_c, + 1) for the group: in registers for 64 columns, read from
// shared memory per tile for 128 (their registers would cost the 128-column kernels occupancy).
template <int kCols>
struct ColumnWeights {
  static constexpr int kHeld = kCols == 64 ? kCols / 8 : 0;
  float2 held[kHeld > 0 ? kHeld : 1];
  const float* shared;
  int lane_c;
  DSV4_SM90_DEVICE float2 operator[](int n8) const {
    if constexpr (kHeld > 0) return held[n8];
    return *reinterpret_cast<const float2*>(&shared[8 * n8 + 2 * lane_c]);
  }
};

template <int kCols, typename Smem>
DSV4_SM90_DEVICE ColumnWeights<kCols> column_weights(const Smem& s, int lane_c) {
  ColumnWeights<kCols> cw;
  cw.shared = s.weights, cw.lane_c = lane_c;
#pragma unroll
  for (int n8 = 0; n8 < ColumnWeights<kCols>::kHeld; ++n8)
    cw.held[n8] = *reinterpret_cast<const float2*>(&s.weights[8 * n8 + 2 * lane_c]);
  return cw;
}

// Where a group's rows go: RowOuts holds them in registers for a chunk, with 32-bit positions (widths are within
// INT32_MAX); SharedRows reads them from shared memory per tile (the register path is short of registers).
template <int kRows>
struct RowOuts {
  float* outs[kRows];
  int lengths[kRows];
  DSV4_SM90_DEVICE float* out(int j) const { return outs[j]; }
  DSV4_SM90_DEVICE int length(int j) const { return lengths[j]; }
};

template <int kRows, typename Smem>
DSV4_SM90_DEVICE RowOuts<kRows> row_outs(const Smem& s, int64_t c1) {
  RowOuts<kRows> r;
#pragma unroll
  for (int j = 0; j < kRows; ++j) r.outs[j] = s.outs[j], r.lengths[j] = int(std::min(s.lengths[j], c1));
  return r;
}

template <typename Smem>
struct SharedRows {
  const Smem& s;
  DSV4_SM90_DEVICE float* out(int j) const { return s.outs[j]; }
  DSV4_SM90_DEVICE int64_t length(int j) const { return s.lengths[j]; }
};

// Up to two rows in registers; more would cost the 16-head kernels a CTA per SM.
template <int kRows, typename Smem>
DSV4_SM90_DEVICE auto chunk_rows(const Smem& s, int64_t c1) {
  if constexpr (kRows <= 2) {
    return row_outs<kRows>(s, c1);
  } else {
    return SharedRows<Smem>{s};
  }
}

// Scores tile t0 from the keys in `cur` and writes the rows' logits (-inf for missing keys; when cleaning, -inf
// past a row's length). Positions are of t0's type: 32 bits for RowOuts, 64 for SharedRows.
template <int kHeadsPad, int kCols, typename Rows, typename Position, typename Under>
DSV4_SM90_DEVICE void finish_tile(const Rows& rows, const ColumnWeights<kCols>& cw, const KeyTile& cur, uint32_t q_base,
                                  Position t0, Position c1, bool clean, int row0, int lane_c, const Under& under) {
  constexpr int kRows = kCols / kHeadsPad;
  float d[kCols / 8][4];
  score_tile<kCols>(cur, q_base, d, under);
  float totals[kRows][2];
#pragma unroll
  for (int j = 0; j < kRows; ++j)
#pragma unroll
    for (int tok = 0; tok < 2; ++tok) {
      float total = 0.0f;
#pragma unroll
      for (int h8 = 0; h8 < kHeadsPad / 8; ++h8) {
        const int n8 = j * kHeadsPad / 8 + h8;
        const float2 w = cw[n8];
        total += w.x * fmaxf(d[n8][2 * tok], 0.0f) + w.y * fmaxf(d[n8][2 * tok + 1], 0.0f);  // NaN dots count 0
      }
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      totals[j][tok] = total + __shfl_xor_sync(0xffffffffu, total, 2);
    }
#pragma unroll
  for (int j = 0; j < kRows; ++j)
#pragma unroll
    for (int tok = 0; tok < 2; ++tok) {
      const Position pos = t0 + row0 + 8 * tok;
      float* out = rows.out(j);
      if (((2 * j + tok) & 3) != lane_c || out == nullptr) continue;  // a quad's lanes share the writes
      if (pos < rows.length(j)) {
        out[pos] = cur.present[tok] ? totals[j][tok] * cur.scale[tok] : -INFINITY;
      } else if (clean && pos < c1) {
        out[pos] = -INFINITY;
      }
    }
}

// A tile past every row's length: only -inf, and only when cleaning.
template <int kRows, typename Smem>
DSV4_SM90_DEVICE void clean_tile(const Smem& s, int64_t t0, int64_t c1) {
  for (int i = threadIdx.x; i < kRows * kTileKeys; i += kThreads) {
    const int64_t pos = t0 + i % kTileKeys;
    if (s.outs[i / kTileKeys] != nullptr && pos < c1) s.outs[i / kTileKeys][pos] = -INFINITY;
  }
}

// Register path (any page size): the block table two tiles ahead, L2 prefetches one and a half, loads one.
template <int kHeadsPad, int kCols, bool kVector, typename Params, typename Smem>
DSV4_SM90_DEVICE void score_chunk_registers(const Params& p, const Smem& s, int64_t request, int64_t c0, int64_t c1,
                                            int64_t longest, bool clean, int row0, int lane_c) {
  const int64_t key_end = std::min(longest, c1);
  const uint32_t q_base = shared_address(s.q_tile);
  const ColumnWeights<kCols> cw = column_weights<kCols>(s, lane_c);
  KeyLookup ahead1 = lookup_keys(p, request, c0 + kTileKeys, key_end, row0);
  KeyLookup ahead2 = lookup_keys(p, request, c0 + 2 * kTileKeys, key_end, row0);
  KeyTile cur = load_keys<kVector>(p.cache, lookup_keys(p, request, c0, key_end, row0), lane_c);
  for (int64_t t0 = c0; t0 < c1; t0 += kTileKeys) {
    const KeyLookup ahead3 = lookup_keys(p, request, t0 + 3 * kTileKeys, key_end, row0);
    prefetch_keys(p.cache, ahead2, lane_c);
    const KeyTile next = load_keys<kVector>(p.cache, ahead1, lane_c);
    ahead1 = ahead2, ahead2 = ahead3;
    if (t0 < longest) {  // uniform
      finish_tile<kHeadsPad, kCols>(SharedRows<Smem>{s}, cw, cur, q_base, t0, c1, clean, row0, lane_c, [] {});
    } else {
      clean_tile<kCols / kHeadsPad>(s, t0, c1);
    }
    cur = next;
  }
}

// Bulk path (pages of a multiple of 64 entries, 16-byte aligned): a tile is 8 KB of codes and 256 bytes of scales
// inside one page, copied by two bulk copies into a ring; `consumed` counts the CTA's tiles (ring slot and barrier
// phase). The slot tile k - 1 freed is refilled while tile k's wgmma run, so the copies' issue is off the chain.
template <int kHeadsPad, int kCols, typename Params, typename Smem>
DSV4_SM90_DEVICE void score_chunk_bulk(const Params& p, Smem& s, int64_t request, int64_t c0, int64_t c1,
                                       int64_t longest, bool clean, int row0, int lane_c, uint32_t& consumed) {
  const int64_t key_end = std::min(longest, c1), tiles = (c1 - c0 + kTileKeys - 1) / kTileKeys;
  const int64_t bs = p.cache.block_size;
  for (int64_t k = threadIdx.x; k < tiles; k += kThreads) {  // every tile's bytes, in one round of loads
    const int64_t t0 = c0 + k * kTileKeys, page = t0 / bs, entry = t0 - page * bs;
    const int64_t block = request >= 0 && t0 < key_end && page < p.max_blocks ? index_at(p.block_table, request, page)
                                                                                : -1;
    const bool here = present(p.cache, block);
    const int64_t page_at = block * p.cache.block_stride;
    s.codes_at[k] = here ? page_at + entry * kDim : -1;
    s.scales_at[k] = here ? page_at + bs * kDim + 4 * entry : -1;
  }
  __syncthreads();
  const auto issue = [&](int64_t k) {  // thread 0
    const uint32_t slot = (consumed + k) % kStages, bar = shared_address(&s.full[slot]);
    const int64_t codes_at = s.codes_at[k];
    s.tile_valid[slot] = codes_at >= 0;
    if (codes_at < 0) return mbarrier_arrive(bar);
    mbarrier_arrive_expect_tx(bar, sizeof(s.keys[0]) + sizeof(s.scales[0]));
    bulk_copy_to_shared(shared_address(s.keys[slot]), p.cache.base + codes_at, sizeof(s.keys[0]), bar);
    bulk_copy_to_shared(shared_address(s.scales[slot]), p.cache.base + s.scales_at[k], sizeof(s.scales[0]), bar);
  };
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < std::min<int64_t>(kStages, tiles); ++k) issue(k);
  const uint32_t q_base = shared_address(s.q_tile);
  const ColumnWeights<kCols> cw = column_weights<kCols>(s, lane_c);
  const auto rows = chunk_rows<kCols / kHeadsPad>(s, c1);
  using Position = decltype(rows.length(0));
  for (int64_t k = 0; k < tiles; ++k) {
    const uint32_t slot = (consumed + k) % kStages;
    const auto refill = [&] {  // the slot of tile k - 1, read by every thread before the last barrier
      if (threadIdx.x == 0 && k > 0 && k - 1 + kStages < tiles) issue(k - 1 + kStages);
    };
    mbarrier_wait(shared_address(&s.full[slot]), ((consumed + k) / kStages) & 1);
    const int64_t t0 = c0 + k * kTileKeys;
    if (t0 < longest) {  // uniform
      KeyTile cur;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = row0 + 8 * i;
        const uint8_t* key = s.keys[slot] + r * kDim + lane_c * 16;
        cur.first[i] = *reinterpret_cast<const uint4*>(key);
        cur.second[i] = *reinterpret_cast<const uint4*>(key + kHalfBytes);
        cur.scale[i] = s.scales[slot][r];
        cur.present[i] = s.tile_valid[slot] != 0 && t0 + r < key_end;
      }
      finish_tile<kHeadsPad, kCols>(rows, cw, cur, q_base, Position(t0), Position(c1), clean, row0, lane_c, refill);
    } else {
      refill();
      clean_tile<kCols / kHeadsPad>(s, t0, c1);
    }
    __syncthreads();  // the slot is read by every thread: free for the next tile's refill
  }
  consumed += uint32_t(tiles);
}

enum class KeyPath { words, vectors, bulk };

// Grid (position chunks, groups): CTA (x, g) scores positions [x, x + 1) * tiles_per_cta * 64 of group g's rows.
template <int kHeadsPad, int kCols, KeyPath kPath, typename Params>
__global__ void __launch_bounds__(kThreads) indexer_scores_kernel(const Params p, int64_t tiles_per_cta) {
  constexpr int kRows = kCols / kHeadsPad;
  using Smem = ScoreSmem<kCols, kRows>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + (1024 - shared_address(smem_raw) % 1024) % 1024);
  const int t = threadIdx.x, lane = t % 32, lane_c = lane % 4, row0 = 16 * (t / 32) + lane / 4;
  const int64_t width = output_width(p), c0 = int64_t(blockIdx.x) * tiles_per_cta * kTileKeys;
  const int64_t c1 = std::min(c0 + tiles_per_cta * kTileKeys, width);
  const bool clean = cleans(p);
  if (kPath == KeyPath::bulk && t < kStages) mbarrier_init(shared_address(&s.full[t]), 1);
  fence_barrier_init();
  uint32_t consumed = 0;
  for (int64_t g = blockIdx.y; g < groups(p); g += gridDim.y) {
    __syncthreads();  // the previous group's q tile and rows are no longer read
    if (t < kRows) {
      const RowSetup r = row_setup(p, g, t);
      s.rows[t] = r.row, s.lengths[t] = r.length, s.outs[t] = r.out;
    }
    __syncthreads();
    store_queries<kHeadsPad, kCols>(p, s.rows, s.q_tile, s.weights);
    fence_async_shared();  // the q tile's generic stores, before wgmma reads them
    __syncthreads();
    int64_t longest = 0;
#pragma unroll
    for (int j = 0; j < kRows; ++j) longest = std::max(longest, s.lengths[j]);
    if (c0 >= longest && !clean) continue;  // uniform: nothing to score or write
    const int64_t request = group_request(p, g);
    if constexpr (kPath == KeyPath::bulk) {
      score_chunk_bulk<kHeadsPad, kCols>(p, s, request, c0, c1, longest, clean, row0, lane_c, consumed);
    } else {
      score_chunk_registers<kHeadsPad, kCols, kPath == KeyPath::vectors>(p, s, request, c0, c1, longest, clean,
                                                                         row0, lane_c);
    }
  }
}

// ---- launch ----

int heads_padded(int64_t heads) { return heads <= 16 ? 16 : heads <= 32 ? 32 : heads <= 64 ? 64 : 128; }

// Whether the Hopper kernel takes these scores; otherwise the portable tier does (same contract). It reads fp8
// keys and e4m3 queries only: mxfp4 ones go to the portable kernels.
template <typename Params>
bool covered(const Params& p, int64_t rows_per_group) {
  const int64_t cols = int64_t(heads_padded(p.num_heads)) * rows_per_group;
  return p.key_format == IndexerFormat::fp8 && p.q_scale == nullptr && p.head_dim == kDim && p.num_heads >= 1 &&
         p.num_heads <= kMaxCols && cols <= kMaxCols && pages_aligned(p.cache, 4) && p.cache.block_size >= 1;
}

// Chunks of equal length in whole waves: CTAs resident at once times the fewest waves that keep chunks within
// kMaxTilesPerCta, spread over the groups' rows of tiles.
template <int kHeadsPad, int kCols, KeyPath kPath, typename Params>
cudaError_t launch_scores(const Params& p, int64_t num_groups, int64_t width, cudaStream_t stream) {
  const auto kernel = indexer_scores_kernel<kHeadsPad, kCols, kPath, Params>;
  constexpr int kSmemBytes = int(sizeof(ScoreSmem<kCols, kCols / kHeadsPad>)) + 1024;  // + alignment slack
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  int device = 0, sms = 0, per_sm = 0;
  if (status == cudaSuccess) status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (status == cudaSuccess) {
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmemBytes);
  }
  if (status != cudaSuccess) return status;
  const int64_t tiles = (width + kTileKeys - 1) / kTileKeys, slots = std::max<int64_t>(1, int64_t(sms) * per_sm);
  const int64_t waves = (tiles * num_groups + slots * kMaxTilesPerCta - 1) / (slots * kMaxTilesPerCta);
  const int64_t chunks = std::max<int64_t>(1, waves * slots / num_groups);
  const int64_t per_cta = std::clamp((tiles + chunks - 1) / chunks, kMinTilesPerCta, kMaxTilesPerCta);
  const dim3 grid(unsigned((tiles + per_cta - 1) / per_cta), unsigned(std::min(num_groups, kMaxGridY)));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, per_cta);
  return cudaGetLastError();
}

template <KeyPath kPath, typename Params>
cudaError_t dispatch_scores(const Params& p, int64_t rows_per_group, int64_t num_groups, int64_t width,
                            cudaStream_t stream) {
  const int padded = heads_padded(p.num_heads);
  const bool wide = padded * rows_per_group > 64;
  if (padded == 16) return launch_scores<16, 64, kPath>(p, num_groups, width, stream);
  if (padded == 32) return launch_scores<32, 64, kPath>(p, num_groups, width, stream);
  if (padded == 64 && !wide) return launch_scores<64, 64, kPath>(p, num_groups, width, stream);
  if (padded == 64) return launch_scores<64, 128, kPath>(p, num_groups, width, stream);
  return launch_scores<128, 128, kPath>(p, num_groups, width, stream);
}

template <typename Params>
cudaError_t launch_indexer_scores(const Params& p, int64_t rows_per_group, int64_t num_groups, int64_t width,
                                  cudaStream_t stream) {
  if (num_groups <= 0 || width <= 0) return cudaSuccess;
  const bool vector = pages_aligned(p.cache, 16);
  if (vector && p.cache.block_size % kTileKeys == 0) {
    return dispatch_scores<KeyPath::bulk>(p, rows_per_group, num_groups, width, stream);
  }
  if (vector) return dispatch_scores<KeyPath::vectors>(p, rows_per_group, num_groups, width, stream);
  return dispatch_scores<KeyPath::words>(p, rows_per_group, num_groups, width, stream);
}

// Index view of rows [first, ...) of v.
IndexView rows_from(IndexView v, int64_t first) {
  v.data = static_cast<const uint8_t*>(v.data) + first * v.row_stride * (v.is_int64 ? 8 : 4);
  return v;
}

}  // namespace
}  // namespace dsv4::cuda::sm90

namespace dsv4::cuda {

cudaError_t launch_fp8_paged_mqa_logits_sm90(const PagedMqaLogitsParams& p, cudaStream_t stream) {
  using namespace sm90;
  // Columns of 16 heads or more pad small next_n * heads up to 64: the portable tier takes wider groups.
  if (!covered(p, p.next_n) || p.batch * p.next_n <= 0 || p.max_context_len <= 0 ||
      p.max_context_len > INT32_MAX ||
      (heads_padded(p.num_heads) < 64 && heads_padded(p.num_heads) * p.next_n > 64)) {
    return launch_fp8_paged_mqa_logits(p, stream);
  }
  return launch_indexer_scores(p, p.next_n, p.batch, p.max_context_len, stream);
}

// Rows go through the workspace in chunks of workspace_rows: the Hopper scores, then the portable tier's select.
cudaError_t launch_fp8_paged_mqa_topk_sm90(const PagedMqaTopkParams& p, cudaStream_t stream) {
  using namespace sm90;
  if (!covered(p, 1)) return launch_fp8_paged_mqa_topk(p, stream);
  const int64_t width = std::min<int64_t>(p.max_blocks * p.cache.block_size, INT32_MAX);
  for (int64_t first = 0; first < p.rows; first += p.workspace_rows) {
    PagedMqaTopkParams chunk = p;
    chunk.rows = std::min(p.workspace_rows, p.rows - first);
    chunk.q = p.q + first * p.num_heads * p.head_dim;
    chunk.weights = p.weights + first * p.w_stride;
    chunk.lengths = rows_from(p.lengths, first);
    chunk.row_requests = rows_from(p.row_requests, first);
    chunk.out = p.out + first * p.out_stride;
    cudaError_t status = launch_indexer_scores(chunk, 1, chunk.rows, width, stream);
    if (status == cudaSuccess) status = launch_fp8_paged_mqa_topk_select(chunk, stream);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace dsv4::cuda
