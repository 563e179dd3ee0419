// Hopper tier of the MODEL1 and DeepSeek-V4.1 sparse decode, warp-specialised: a CTA attends 64 heads of one query
// over its schedule partition in tiles of 64 entries (one schedule block), with one job per warpgroup. The scorer
// (warpgroup 0) runs S = Q K^T, the online softmax and O += P V for output dims 0-255 on wgmma, and hands P and the
// row rescale factors to the valuer (warpgroup 1) through shared memory; the valuer runs O += P V for dims 256-511
// and also publishes each tile's entry addresses several tiles ahead (the index values travel further ahead through a
// shared-memory ring, so no thread waits on an index load); two decoders (warpgroups 2 and 3, half of every tile
// each) load a tile's codes straight into registers before its buffer (two K/V tiles alternate) is free and then
// write it as bf16 (MODEL1: e4m3 nope codes and bf16 RoPE values; V4.1: an fp8 main set, e4m3 codes under UE8M0
// scales, with an fp8 or fp4 extra set, e2m1 codes under e4m3 scales, in either placement). Full tiles and P are
// handed over with named barriers, empty buffers and the address ring with mbarriers.
// Each request's q tile arrives by tensor copies (TMA) that one scorer thread issues under the previous request's
// last tile.
// The MODEL1-shaped bf16 sparse prefill runs on the same kernel: each query token is a request whose entries are
// bf16 rows (the decoders copy them whole), with no split plan (persistent CTAs over consecutive tokens).
#include <cmath>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "common/decode_schedule.h"
#include "cuda/launchers.h"
#include "cuda/portable/sparse_mla/common.cuh"
#include "cuda/sm90/sparse_mla/tiles.cuh"
#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace dsv4::cuda::sm90 {
namespace {

constexpr int kTile = kEntriesPerBlock;  // entries per K/V tile: one schedule block
constexpr int kGroupThreads = 128, kCtaThreads = 4 * kGroupThreads;
constexpr int kDecodeThreadsPerEntry = 4;  // each decoder writes half of every tile
constexpr int kDecodeHalfEntries = kGroupThreads / kDecodeThreadsPerEntry;
static_assert(2 * kDecodeHalfEntries == kTile, "two decoders cover a tile");
constexpr int kPublishThreadsPerEntry = kGroupThreads / kTile;
constexpr int kScorer = 0, kDecoder = 2;  // warpgroup 0 scores, 1 values and publishes, 2 and 3 decode
// setmaxnreg per role. kWideValuer: the valuer takes 192 registers for its rows' 16-byte stores (store_row_wide)
// and the decoders run at 64 (copying bf16 rows, the prefill, needs no more); otherwise the fp8 decoders take 72.
// The fp8 kernel comes in both shapes: with no more requests than partitions (a CTA's last piece is staged, and most
// CTAs have one) the 72-register decoders measured 1.6% faster, with more the wide stores 1.6-3.2%
// (docs/perf/2026-12-01-gpu-24-f16-operands-wide-valuer.md, "f16 operands for the fp8 kernel measured and dropped;
// a wide-valuer shape of it").
template <bool kWideValuer>
struct RoleRegs {
  static constexpr int kScorer = 192, kValuer = kWideValuer ? 192 : 176, kDecoder = kWideValuer ? 64 : 72;
  static_assert(kScorer + kValuer + 2 * kDecoder <= 4 * 128,
                "setmaxnreg.inc waits for registers the decoders released: never more than the CTA holds");
};
// The records a kernel's decoders turn into bf16 tiles: MODEL1, or V4.1 (a 528-byte fp8 main set, an fp8 or fp4
// extra set: each tile's address stage says which, see stage_kind). Only the decoders and the addresses differ.
enum class Record { model1, v41 };

// Named barriers (0 is __syncthreads): buffer b full = 1 + b (decoders -> scorer; its first half where the buffer
// fills in halves), its second half full = 3 + b, P of buffer b ready = 5 + b (scorer -> valuer), the scorer's own,
// the valuer's own, the staged output rows (scorer and valuer). Buffer b empty (scorer and valuer -> decoders) is
// an mbarrier (empty_bar), which measured slightly faster than a named barrier and needs no closing sync of the last
// phases (docs/perf/2026-12-01-gpu-12-decoder-profile-empty-mbarrier.md, "where the decoders wait (a profile), an
// mbarrier for empty buffers, seven ideas dropped").
constexpr int kBarFull = 1, kBarSecondHalf = 3, kBarProbs = 5, kBarScorer = 7, kBarValuer = 8, kBarStage = 9;
constexpr int kFullThreads = 3 * kGroupThreads, kProbsThreads = 2 * kGroupThreads;
constexpr int kPtrStages = 5;  // ring of published tiles' entry addresses
constexpr int kPublishLead = 4;  // tiles published ahead of the one the valuer works on
static_assert(kPublishLead <= kPtrStages, "a published stage is never waited for past the partition's end");
constexpr int kHalfDim = kDim / 2;
constexpr int kScoreTiles = kTile / 8;  // n8 tiles of S per warp
constexpr int kValueTiles = kHalfDim / 8;  // n8 tiles of O per warp
constexpr int kSlabDims = kSlabChunks * kChunkElems;  // 64 dims per 128-byte swizzled slab
constexpr int kHalfSlabs = kHalfDim / kSlabDims;
constexpr int kSlabSteps = kSlabDims / 16;  // k16 steps per slab
constexpr int kQkSteps = kDim / 16;
constexpr int kPvSteps = kTile / 16;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
// The weights' offset is raised only when a tile's largest scaled score passes it by more than this (log2 units), so
// that most tiles rescale no O: weights stay <= 2^8, exact in bf16's and fp32's range, and lse takes the same offset.
constexpr float kLazyHeadroom = 8.0f;

static_assert(kTile == kHeadsPerCta, "a K/V tile has the q tile's shape and layout (tile_offset, kSlabBytes)");
constexpr int kNopeItems = kNopeDim / kVectorBytes;  // 28 16-byte items of codes
constexpr int kDecodeItems = kNopeItems / kDecodeThreadsPerEntry;  // per decoder thread and entry
constexpr int kRopeChunks = (kDim - kNopeDim) / kChunkElems;  // 8 16-byte chunks of bf16 RoPE values
constexpr int kDecodeRopeChunks = kRopeChunks / kDecodeThreadsPerEntry;

// Dynamic shared memory (from a 1024-aligned base).
constexpr int kQOffset = 0;
constexpr int kKvOffset = kQOffset + kTileBytes;  // two K/V tiles
// P handover, per tile: this thread's P fragments (kPvSteps 16-byte words), then (alpha0, alpha1, max0, max1), then
// (sum0, sum1), each field thread-major so that the stores and loads are conflict-free.
constexpr int kProbsOffset = kKvOffset + 2 * kTileBytes;
constexpr int kProbsSlotBytes = kGroupThreads * (16 * kPvSteps + 16 + 8);
constexpr int kPtrOffset = kProbsOffset + 2 * kProbsSlotBytes;  // kPtrStages x kTile EntrySource
constexpr int kIndexLead = 4;  // tiles whose indices are copied ahead of the one published
constexpr int kIndexSlots = kIndexLead + 1;  // ring of tiles' index values (8 bytes per entry) and their set flags
constexpr int kIndexOffset = kPtrOffset + kPtrStages * kTile * 16;
constexpr int kIndexFlagOffset = kIndexOffset + kIndexSlots * kTile * 8;
constexpr int kValidOffset = kIndexFlagOffset + kIndexSlots * kTile;  // a 64-bit valid-entry mask per buffer
constexpr int kCursorOffset = kValidOffset + 2 * 8;  // ring of the index copies' cursors (see cursor_slot)
constexpr int kCursorSlots = 8, kCursorBytes = 128;
constexpr int kWalkAhead = kIndexLead + kPtrStages;
static_assert(kCursorSlots >= kWalkAhead - kIndexLead, "a cursor is read before the walker rewrites its slot");
// Address stage s: full barrier at kMbarOffset + 8 s, free barrier at kMbarOffset + 8 (kPtrStages + s); then the
// two K/V buffers' empty barriers for each half (see empty_bar) and the q tile's tensor copies' barrier.
constexpr int kMetaOffset = kCursorOffset + kCursorSlots * kCursorBytes;  // this CTA's partition (8 words)
constexpr int kMbarOffset = kMetaOffset + int(kDecodeSchedWords) * 4;
constexpr int kEmptyMbarOffset = kMbarOffset + 2 * kPtrStages * 8;
constexpr int kQMbarOffset = kEmptyMbarOffset + 4 * 8;
constexpr int kSinkOffset = kQMbarOffset + 8;  // the CTA's 64 heads' sink logits (see copy_sinks)
constexpr int kKindOffset = kSinkOffset + kHeadsPerCta * 4;  // per address stage: its tile's record (V4.1)
constexpr int kSmemBytes = kKindOffset + 16 + kSwizzleAtomBytes;  // + alignment slack
static_assert(kProbsOffset % 16 == 0 && kPtrOffset % 16 == 0 && kValidOffset % 8 == 0 && kMbarOffset % 8 == 0,
              "aligned handover, addresses and barriers");
static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one CTA");
// The CTA's last output rows are staged from the q tile on (free once the last tile's P V is done), rows 16 bytes
// longer than the output's so that a warp's stores of 8 rows hit distinct banks, and leave by bulk copies.
constexpr int kStageRowBytes = kDim * 2 + 16;
static_assert(kHeadsPerCta * kStageRowBytes <= kProbsOffset - kQOffset, "staged rows fit the q and K/V tiles");
static_assert(kCursorOffset % 16 == 0 && kIndexOffset % 8 == 0, "aligned cursors and index slots");

struct RowState {
  float o[kValueTiles][4];
  float max[2];  // the weights' offsets (log2 domain): within kLazyHeadroom of the largest scaled score, see below
  float sum[2];
  float peak[2];  // the largest scaled score (log2 domain), for max_logits
};

DSV4_SM90_DEVICE void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
DSV4_SM90_DEVICE void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// k16 steps [kFirst, kEnd) of S = Q K^T. The k16 step inside a 128-byte row moves the start address by 32 bytes;
// descriptors hold the address >> 4 in their low bits, so a step adds its offset >> 4 (no carry below 256 KB).
template <int kFirst, int kEnd>
DSV4_SM90_DEVICE void issue_score_steps(uint64_t q_desc, uint64_t k_desc, float (&s)[kScoreTiles][4]) {
#pragma unroll
  for (int kk = kFirst; kk < kEnd; ++kk) {
    const uint32_t slab = kk / kSlabSteps, step = (kk % kSlabSteps) * 32;
    const uint32_t offset = slab * kSlabBytes + step;
    wgmma_64x64x16_ss(s, q_desc + (offset >> 4), k_desc + (offset >> 4));
  }
}

// Issues S = Q K^T of the tile in buffer `tile` (asynchronous; finish with wgmma_wait_all). kHalves: the second
// half of the tile (dims 256-511) is waited for after the first half's steps are issued, so that they run while it
// lands.
template <bool kHalves>
DSV4_SM90_DEVICE void issue_scores(uint32_t q_base, uint32_t kv_base, int tile, float (&s)[kScoreTiles][4]) {
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[t][i] = 0.0f;
  const uint64_t q_desc = swizzled_descriptor(q_base, 16, kSwizzleAtomBytes);
  const uint64_t k_desc = swizzled_descriptor(kv_base, 16, kSwizzleAtomBytes);
  wgmma_fence();
  issue_score_steps<0, kQkSteps / 2>(q_desc, k_desc, s);
  if (kHalves) named_sync(kBarSecondHalf + tile, kFullThreads);
  issue_score_steps<kQkSteps / 2, kQkSteps>(q_desc, k_desc, s);
  wgmma_commit();
}

DSV4_SM90_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Scales row r of this thread's O fragments by alpha; skipped when alpha is 1 on every lane of the warp (x * 1 is
// exact, so skipping changes nothing).
DSV4_SM90_DEVICE void rescale_row(RowState& st, int r, float alpha) {
  if (__any_sync(0xffffffffu, alpha != 1.0f)) {
#pragma unroll
    for (int t = 0; t < kValueTiles; ++t) st.o[t][2 * r] *= alpha, st.o[t][2 * r + 1] *= alpha;
  }
}

// Row r's sum or max of this thread's 16 values of a tile (columns 8 t + 2 (lane & 3) + j): a tree of independent
// steps rather than one 16-long dependent chain.
template <typename Op>
DSV4_SM90_DEVICE float row_reduce(const float (&s)[kScoreTiles][4], int r, Op op) {
  float v[kScoreTiles];
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t) v[t] = op(s[t][2 * r], s[t][2 * r + 1]);
#pragma unroll
  for (int width = kScoreTiles / 2; width >= 1; width /= 2)
#pragma unroll
    for (int t = 0; t < width; ++t) v[t] = op(v[t], v[t + width]);
  return v[0];
}

// The exp2 arguments of a tile's weights: weight = exp2(score * scale - offset[row]).
struct TileWeights {
  float scale;
  float offset[2];
};

// Online softmax of one tile, first part: masks invalid entries, raises the weights' offset where the tile passes it
// by more than kLazyHeadroom and then rescales O (alpha: the rows' factors, for the sums and the valuer). With a
// positive scale the scores stay unscaled: the row max scales exactly (rounding is monotonic) and each weight is one
// fma and one ex2; a full tile (the common case) skips the masking.
DSV4_SM90_DEVICE TileWeights softmax_rows(float (&s)[kScoreTiles][4], uint64_t valid, float scale_log2, int lane,
                                          RowState& st, float (&alpha)[2]) {
  TileWeights w;
  w.scale = scale_log2;
  if (!(scale_log2 > 0.0f)) {  // uniform: scale first, so that the max below is the max of the scaled scores
#pragma unroll
    for (int t = 0; t < kScoreTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[t][i] *= scale_log2;
    w.scale = 1.0f;
  }
  if (valid != ~uint64_t(0)) {  // uniform
    const uint64_t mine = valid >> (2 * (lane & 3));  // bit 8 t + j: column 8 t + 2 (lane & 3) + j is valid
#pragma unroll
    for (int t = 0; t < kScoreTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (!((mine >> (8 * t + (i & 1))) & 1u)) s[t][i] = -INFINITY;
  }
  const auto max_op = [](float x, float y) { return fmaxf(x, y); };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = row_reduce(s, r, max_op);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float tile_max = m * w.scale;
    st.peak[r] = fmaxf(st.peak[r], tile_max);
    const bool keep = tile_max - st.max[r] <= kLazyHeadroom;  // false while st.max is -inf
    const float new_max = keep ? st.max[r] : fmaxf(st.max[r], tile_max);
    w.offset[r] = new_max == -INFINITY ? 0.0f : new_max;  // nothing valid yet: every weight is exp2(-inf) = 0
    alpha[r] = st.max[r] == new_max ? 1.0f : fast_exp2(st.max[r] - w.offset[r]);
    st.max[r] = new_max;
    rescale_row(st, r, alpha[r]);
  }
  return w;
}

// The weights of k16 steps [kFirst, kEnd) (entries 16 kk .. +16): the scores become their weights, and P those
// steps' bf16 A fragments.
template <int kFirst, int kEnd>
DSV4_SM90_DEVICE void tile_weights(float (&s)[kScoreTiles][4], const TileWeights& w, uint32_t (&p)[kPvSteps][4]) {
#pragma unroll
  for (int t = 2 * kFirst; t < 2 * kEnd; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[t][i] = fast_exp2(fmaf(s[t][i], w.scale, -w.offset[i / 2]));
#pragma unroll
  for (int kk = kFirst; kk < kEnd; ++kk) {
    p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// wgmma.fence for the P fragments of k16 steps [kFirst, kEnd): the empty asm keeps their packing above the fence
// (register-only instructions otherwise drift below it, and ptxas then injects fences of its own).
template <int kFirst, int kEnd>
DSV4_SM90_DEVICE void fence_probs(uint32_t (&p)[kPvSteps][4]) {
#pragma unroll
  for (int kk = kFirst; kk < kEnd; ++kk)
    asm volatile("" : "+r"(p[kk][0]), "+r"(p[kk][1]), "+r"(p[kk][2]), "+r"(p[kk][3])::"memory");
  wgmma_fence();
}

// Online softmax of one tile, last part: the running sums take the tile's weights (s after tile_weights).
DSV4_SM90_DEVICE void add_row_sums(const float (&s)[kScoreTiles][4], const float (&alpha)[2], RowState& st) {
  const auto sum_op = [](float x, float y) { return x + y; };
#pragma unroll
  for (int r = 0; r < 2; ++r) st.sum[r] = st.sum[r] * alpha[r] + row_reduce(s, r, sum_op);
}

// O[64 rows, this warpgroup's 256 dims] += P V, one n128 product per pair of 64-dim slabs and k step (V = the K/V
// tile read N-major: a swizzle atom spans 8 entries of 64 dims, the next 8 entries are 1024 bytes on and the next
// slab kSlabBytes). One n256 product would hold 128 accumulators in one instruction, more than ptxas allows a kernel
// launched at 128 registers per thread. Steps [kFirst, kEnd) of P (the whole tile by default); each O element sees
// its k steps in order either way.
template <int kFirst = 0, int kEnd = kPvSteps, int kPair = 0>
DSV4_SM90_DEVICE void slab_values(uint32_t kv_base, const uint32_t (&p)[kPvSteps][4], int half, RowState& st) {
#pragma unroll
  for (int kk = kFirst; kk < kEnd; ++kk) {
    const uint32_t address = kv_base + uint32_t((kHalfSlabs * half + 2 * kPair) * kSlabBytes + kk * 16 * kRowBytes);
    wgmma_64x128x16_rs_tn<16 * kPair>(st.o, p[kk], swizzled_descriptor(address, kSlabBytes, kSwizzleAtomBytes));
  }
  if constexpr (2 * kPair + 2 < kHalfSlabs) slab_values<kFirst, kEnd, kPair + 1>(kv_base, p, half, st);
}

template <int kRegs>
DSV4_SM90_DEVICE void raise_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
DSV4_SM90_DEVICE void lower_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Where one piece's rows go: the output (single-piece request) or split row `split_row` of the partials.
struct PieceTarget {
  int64_t split_row;
  bool single;
};

// One piece of this CTA's partition: request r, its tiles (blocks) [begin_block, begin_block + tiles); `skip` marks
// a piece whose split row is out of range (a malformed plan): no role touches it.
struct Piece {
  int64_t r, begin_block, tiles;
  RequestSets sets;
  PieceTarget target;
  bool skip;
};

DSV4_SM90_DEVICE Piece piece_of(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t r) {
  const int64_t first = meta[0], last = meta[1];
  Piece c;
  c.r = r;
  c.sets = request_sets(p, r);
  int64_t begin = r == first ? meta[2] : 0, end = r == last ? meta[3] : c.sets.blocks;
  begin = begin < 0 ? 0 : begin;
  end = end > c.sets.blocks ? c.sets.blocks : end;
  c.begin_block = begin;
  c.tiles = end > begin ? end - begin : 0;
  if (p.sched.num_splits == nullptr) {  // a plan-less run: every request is one piece
    c.target = {0, true};
  } else {
    const int64_t piece_splits = p.sched.num_splits[r + 1] - p.sched.num_splits[r];
    c.target = {p.sched.num_splits[r] + (r == first ? meta[4] : 0), piece_splits == 1};
  }
  c.skip = !c.target.single && (c.target.split_row < 0 || c.target.split_row >= p.b + p.sched.num_parts);
  if (c.skip) c.tiles = 0;
  return c;
}

// Walks the tiles of a partition's pieces in order (pieces without tiles are passed over).
struct TileCursor {
  int64_t r, last, i;
  Piece piece;
  bool done;
};

DSV4_SM90_DEVICE void settle(const SparseMlaDecodeParams& p, const int32_t* meta, TileCursor& c) {
  while (!c.done && c.i >= c.piece.tiles) {
    if (++c.r > c.last) {
      c.done = true;
      break;
    }
    c.piece = piece_of(p, meta, c.r), c.i = 0;
  }
}

DSV4_SM90_DEVICE TileCursor first_tile(const SparseMlaDecodeParams& p, const int32_t* meta) {
  TileCursor c;
  const int64_t first = meta[0] < 0 ? 0 : meta[0];
  c.last = meta[1] < p.b ? meta[1] : p.b - 1;
  c.r = first, c.i = 0, c.done = first > c.last;
  if (!c.done) c.piece = piece_of(p, meta, first);
  settle(p, meta, c);
  return c;
}

DSV4_SM90_DEVICE void next_tile(const SparseMlaDecodeParams& p, const int32_t* meta, TileCursor& c) {
  ++c.i;
  settle(p, meta, c);
}

static_assert(sizeof(TileCursor) <= kCursorBytes, "fits its shared-memory slot");

// Tiles of this CTA's partition (all pieces).
DSV4_SM90_DEVICE int64_t partition_tiles(const SparseMlaDecodeParams& p, const int32_t* meta) {
  int64_t total = 0;
  for (TileCursor c = first_tile(p, meta); !c.done; c.i = c.piece.tiles, settle(p, meta, c)) total += c.piece.tiles;
  return total;
}

constexpr uint8_t kFlagExtra = 1, kFlagWide = 2, kFlagNone = 0xff;

// Starts copying (cp.async) index `at` of a set into dst.
DSV4_SM90_DEVICE void copy_index_value(const SparseIndexSet& set, int64_t at, uint8_t* dst) {
  if (set.is_int64) {
    cp_async_8(shared_address(dst), static_cast<const int64_t*>(set.indices) + at);
  } else {
    cp_async_4(shared_address(dst), static_cast<const int32_t*>(set.indices) + at);
  }
}

// Starts copying (cp.async) the index of entry e of the cursor's tile into an index slot, with a flag byte saying
// which set it indexes (kFlagNone: no entry there); `copy` false: the value is already on its way, only the flag.
DSV4_SM90_DEVICE void issue_index_copy(const SparseMlaDecodeParams& p, const TileCursor& c, int64_t s, int e,
                                       uint8_t* index_slot, uint8_t* flag_slot, bool copy = true) {
  uint8_t flag = kFlagNone;
  if (!c.done) {
    const int64_t j = c.piece.begin_block + c.i;
    const bool in_main = j < c.piece.sets.main_blocks;
    const SparseIndexSet& set = in_main ? p.main : p.extra;
    const int64_t column = (in_main ? j : j - c.piece.sets.main_blocks) * kEntriesPerBlock + e;
    if (column < (in_main ? c.piece.sets.main_length : c.piece.sets.extra_length)) {
      const int64_t at = c.piece.r * set.stride_b + s * set.stride_s + column * set.stride_k;
      if (copy) copy_index_value(set, at, index_slot + e * 8);
      flag = uint8_t((in_main ? 0 : kFlagExtra) | (set.is_int64 ? kFlagWide : 0));
    }
  }
  flag_slot[e] = flag;
}

// Where the bytes of an entry are (nullptr: not attended: no index, negative or outside the cache). With pages of
// one entry (the prefill's bf16 rows) the offset is 0, so data is the page itself whatever the entry's size.
struct EntrySource {
  const uint8_t* data;
  const uint8_t* scales;
};

template <Record kRec>
DSV4_SM90_DEVICE EntrySource entry_source(const SparseMlaDecodeParams& p, const uint8_t* index_slot,
                                          const uint8_t* flag_slot, int e) {
  const uint8_t flag = flag_slot[e];
  if (flag == kFlagNone) return {nullptr, nullptr};
  const int64_t slot = (flag & kFlagWide) ? *reinterpret_cast<const int64_t*>(index_slot + e * 8)
                                          : *reinterpret_cast<const int32_t*>(index_slot + e * 8);
  const PagedCache& cache = ((flag & kFlagExtra) ? p.extra : p.main).cache;
  if (slot < 0 || slot >= cache.num_blocks * cache.block_size) return {nullptr, nullptr};
  int64_t block;
  if ((slot | cache.block_size) <= INT32_MAX) {  // 32-bit division: a fraction of the 64-bit one's cost
    block = uint32_t(slot) / uint32_t(cache.block_size);
  } else {
    block = slot / cache.block_size;
  }
  const int64_t offset = slot - block * cache.block_size;
  if constexpr (kRec == Record::v41) {  // the set's record (the main set's is fp8) in the cache's placement
    const KvLayout layout = (flag & kFlagExtra) ? p.extra.layout : KvLayout::v41_fp8;
    const EntryBytes bytes = entry_bytes(layout, cache, cache.base + block * cache.block_stride, offset);
    return {bytes.data, bytes.scales};
  }
  const uint8_t* page = cache.base + block * cache.block_stride;
  return {page + offset * kEntryDataBytes, page + cache.block_size * kEntryDataBytes + offset * kEntryScaleBytes};
}

// Address stage s has two mbarriers: full (the valuer's 128 threads arrive after writing it) and free (the
// decoders' 256 threads arrive after reading it).
DSV4_SM90_DEVICE uint32_t ptr_full_bar(uint8_t* smem, int stage) {
  return shared_address(smem + kMbarOffset + 8 * stage);
}
DSV4_SM90_DEVICE uint32_t ptr_free_bar(uint8_t* smem, int stage) {
  return shared_address(smem + kMbarOffset + 8 * (kPtrStages + stage));
}
// K/V buffer b's empty barrier: the scorer's and valuer's 256 threads arrive once their wgmma reads of a tile in it
// are done; phase n completes with tile 2 n + b. Where the buffer fills in halves (the bf16 rows, kHalves), each
// half has its own: the scorer's 128 threads free the first (dims 0-255, read by S and its own P V), the valuer's
// the second (read by S, done before P is handed over, and the valuer's P V).
DSV4_SM90_DEVICE uint32_t empty_bar(uint8_t* smem, int buffer, int half = 0) {
  return shared_address(smem + kEmptyMbarOffset + 8 * buffer + 16 * half);
}
DSV4_SM90_DEVICE EntrySource* ptr_stage(uint8_t* smem, int stage) {
  return reinterpret_cast<EntrySource*>(smem + kPtrOffset + stage * kTile * int(sizeof(EntrySource)));
}

// Address stage s's record kind (V4.1): nonzero where its tile holds fp4 entries (an fp4 extra set's tile). Written
// with the stage's addresses by the valuer's thread 0, read by the decoders past the stage's full barrier.
DSV4_SM90_DEVICE uint8_t* stage_kind(uint8_t* smem, int stage) { return smem + kKindOffset + stage; }

DSV4_SM90_DEVICE uint8_t* index_slot(uint8_t* smem, int slot) { return smem + kIndexOffset + slot * kTile * 8; }
DSV4_SM90_DEVICE uint8_t* flag_slot(uint8_t* smem, int slot) { return smem + kIndexFlagOffset + slot * kTile; }

// One decoder thread's codes of one entry: its e4m3 items (part + 4 k) and one scale byte per item (MODEL1: the
// entry's eight scale bytes, the eighth padding).
template <int kItemCount>
struct E4m3Codes {
  static constexpr int kItems = kItemCount;
  uint4 nope[kItems];
  uint2 scales;

  DSV4_SM90_DEVICE uint32_t scale_byte(int k) const { return ((k < 4 ? scales.x : scales.y) >> (8 * (k % 4))) & 0xffu; }
};

// An entry's 16 codes; the L2 fetches the 256 bytes around them (the entry's other codes, its RoPE values).
DSV4_SM90_DEVICE uint4 load_16(const uint8_t* src, bool aligned) {
  if (aligned) {
    uint4 v;
    asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(src));
    return v;
  }
  const uint2 lo = __ldg(reinterpret_cast<const uint2*>(src)), hi = __ldg(reinterpret_cast<const uint2*>(src + 8));
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

using EntryCodes = E4m3Codes<kDecodeItems>;

DSV4_SM90_DEVICE void load_entry(const EntrySource& src, int part, EntryCodes& c) {
  if (src.data == nullptr) return;
  const bool aligned = reinterpret_cast<uintptr_t>(src.data) % kVectorBytes == 0;
#pragma unroll
  for (int k = 0; k < kDecodeItems; ++k)
    c.nope[k] = load_16(src.data + (part + kDecodeThreadsPerEntry * k) * kVectorBytes, aligned);
  c.scales = __ldg(reinterpret_cast<const uint2*>(src.scales));
}

// Starts pulling this thread's share of entry e of tile x (its codes, RoPE values and scale bytes) into L2 when the
// tile's addresses are already published (a test, never a wait): issued while the tile before it loads, so that
// the decoders' own loads of tile x find L2 rather than HBM (their latency is the fill's, once per tile).
DSV4_SM90_DEVICE void prefetch_next_entry(uint8_t* smem, int64_t x, int e, int part) {
  constexpr int kLineBytes = 128;  // the entry's four threads take 128-byte steps from its start, one more the tail
  const int stage = int(x % kPtrStages);
  if (!mbarrier_ready(ptr_full_bar(smem, stage), uint32_t(x / kPtrStages) & 1u)) return;
  const EntrySource src = ptr_stage(smem, stage)[e];
  if (src.data == nullptr) return;
  prefetch_l2(src.data + part * kLineBytes);
  if (part == 0) prefetch_l2(src.data + kDecodeThreadsPerEntry * kLineBytes);
  if (part == 1) prefetch_l2(src.scales);
}

// Copies this thread's RoPE chunks (2 part, 2 part + 1) of entry e into the tile by cp.async (zero for an entry
// that is not attended).
DSV4_SM90_DEVICE void copy_rope(const uint8_t* data, int e, int part, uint8_t* tile) {
#pragma unroll
  for (int k = 0; k < kDecodeRopeChunks; ++k) {
    const int chunk = kDecodeRopeChunks * part + k;
    uint8_t* dst = tile + tile_offset(e, kNopeChunks + chunk);
    if (data == nullptr) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    } else if (reinterpret_cast<uintptr_t>(data) % kVectorBytes == 0) {
      cp_async_16(shared_address(dst), data + kNopeDim + chunk * kVectorBytes);
    } else {
      cp_async_8(shared_address(dst), data + kNopeDim + chunk * kVectorBytes);
      cp_async_8(shared_address(dst + kPieceBytes), data + kNopeDim + chunk * kVectorBytes + kPieceBytes);
    }
  }
}

// Copies this thread's chunks part + 4 k, k in [kFirst, kEnd), of a bf16 row into row e of the tile by cp.async
// (zero for an entry that is not attended); k < kRowCopies / 2 is the row's first half (dims 0-255).
constexpr int kRowCopies = kChunksPerRow / kDecodeThreadsPerEntry;
template <int kFirst, int kEnd>
DSV4_SM90_DEVICE void copy_row(const uint8_t* data, int e, int part, uint8_t* tile) {
#pragma unroll
  for (int k = kFirst; k < kEnd; ++k) {
    const int chunk = part + kDecodeThreadsPerEntry * k;
    uint8_t* dst = tile + tile_offset(e, chunk);
    if (data == nullptr) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    } else {
      cp_async_16(shared_address(dst), data + chunk * kVectorBytes);
    }
  }
}

// The exact route of a share (decode_nope_16 per item; zeros for an invalid entry).
template <typename Codes>
DSV4_SM90_DEVICE void store_exact_items(const Codes& c, bool ok, int e, int part, uint8_t* tile) {
  for (int k = 0; k < Codes::kItems; ++k) {
    const int item = part + kDecodeThreadsPerEntry * k;
    uint4 first = make_uint4(0, 0, 0, 0), second = first;
    if (ok) decode_nope_16(c.nope[k], uint8_t(c.scale_byte(k)), first, second);
    *reinterpret_cast<uint4*>(tile + tile_offset(e, 2 * item)) = first;
    *reinterpret_cast<uint4*>(tile + tile_offset(e, 2 * item + 1)) = second;
  }
}

// store_entry's rare route (an e4m3 NaN code, a large scale or an invalid entry), out of line: inlined, its code
// sat inside the decoders' tile loop and the instruction fetch paid for it every tile. The codes come by value, in
// registers (by reference they went to the stack on the common route too).
__noinline__ __device__ void store_entry_exact(const EntryCodes c, bool ok, int e, int part, uint8_t* tile) {
  store_exact_items(c, ok, e, part, tile);
}

// Whether every item of this thread's share takes the direct route (a valid entry, no NaN code, no large scale).
template <typename Codes>
DSV4_SM90_DEVICE bool decodes_share_directly(const Codes& c, bool ok) {
  uint32_t scales[Codes::kItems];
#pragma unroll
  for (int k = 0; k < Codes::kItems; ++k) scales[k] = c.scale_byte(k);
  bool direct = ok;
#pragma unroll
  for (int k = 0; k < Codes::kItems; ++k) direct = direct && decodes_directly(c.nope[k], scales[k]);
  return direct;
}

// The direct route of this thread's items of entry e (item part + 4 k under scale byte k).
template <typename Codes>
DSV4_SM90_DEVICE void store_direct(const Codes& c, int e, int part, uint8_t* tile) {
  // Each scale byte plus the bias, four at a time: every used byte is at most kMaxDirectScale here, so no add
  // carries into a neighbour (MODEL1's eighth byte, padding, may overflow out of the word).
  const uint32_t biased[2] = {c.scales.x + 0x01010101u * kBiasShift, c.scales.y + 0x01010101u * kBiasShift};
#pragma unroll
  for (int k = 0; k < Codes::kItems; ++k) {
    const int item = part + kDecodeThreadsPerEntry * k;
    uint4 first, second;
    decode_nope_16_factor(c.nope[k], direct_factor(biased[k / 4], k % 4), first, second);
    *reinterpret_cast<uint4*>(tile + tile_offset(e, 2 * item)) = first;
    *reinterpret_cast<uint4*>(tile + tile_offset(e, 2 * item + 1)) = second;
  }
}

// Writes this thread's nope items of entry e as bf16 (part + 4 k, scale byte k). Invalid entries become zero rows
// (0 * NaN would poison P V); the common case (every item on the direct route) runs straight through.
DSV4_SM90_DEVICE void store_entry(const EntryCodes& c, bool ok, int e, int part, uint8_t* tile) {
  if (decodes_share_directly(c, ok)) {
    store_direct(c, e, part, tile);
  } else {
    store_entry_exact(c, ok, e, part, tile);
  }
}

// ---- V4.1 decoders: each thread takes items part + 4 k (16 dims each) of its entry, as MODEL1's, so that a
// quarter warp's 16-byte stores of one item step hit eight distinct chunk columns of the swizzled rows ----
constexpr int kV41ThreadItems = kV41Items / kDecodeThreadsPerEntry;

// 8 bytes of an entry (fp4 codes, pages 8-byte aligned); the L2 fetches the 256 bytes around them.
DSV4_SM90_DEVICE uint2 load_8(const uint8_t* src) {
  uint2 v;
  asm volatile("ld.global.nc.L2::256B.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(src));
  return v;
}

// load_16 for V4.1: its 8-byte route also by asm volatile loads, which the compiler neither speculates nor merges
// across the fp8 and fp4 tiles' branches (merged loads stayed live through both and spilled).
DSV4_SM90_DEVICE uint4 load_16_v41(const uint8_t* src, bool aligned) {
  if (aligned) return load_16(src, true);
  const uint2 lo = load_8(src), hi = load_8(src + 8);
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

// One decoder thread's share of a V4.1 entry, either record in the same registers, so that the fp8 and fp4 tiles'
// paths join before the waits with one set of live values (two separate paths spilled): fp8: item k's 16 codes in
// w[k] and its scale byte in byte k of (scales.x, scales.y); fp4: item k's 8 bytes of codes in w[k].x, .y and the
// entry's scale word k (of 8) in w[k].z. An entry's scales sit 16-byte aligned exactly where its data does.
struct V41Codes {
  uint4 w[kV41ThreadItems];
  uint2 scales;

  DSV4_SM90_DEVICE void load_fp8(const EntrySource& src, int part) {
    if (src.data == nullptr) return;
    const bool aligned = reinterpret_cast<uintptr_t>(src.data) % kVectorBytes == 0;
#pragma unroll
    for (int k = 0; k < kV41ThreadItems; ++k)
      w[k] = load_16_v41(src.data + (part + kDecodeThreadsPerEntry * k) * kVectorBytes, aligned);
    scales = v41_fp8_item_scales(load_16_v41(src.scales, aligned), part);  // two registers held, not four
  }

  // An invalid entry's codes are zeros (its scales zero too, see store_fp4): its row is then zeros.
  DSV4_SM90_DEVICE void load_fp4(const EntrySource& src, int part) {
    if (src.data == nullptr) {
#pragma unroll
      for (int k = 0; k < kV41ThreadItems; ++k) w[k] = make_uint4(0, 0, 0, 0);
      return;
    }
    const bool aligned = reinterpret_cast<uintptr_t>(src.data) % kVectorBytes == 0;
#pragma unroll
    for (int k = 0; k < kV41ThreadItems; ++k) {
      const uint2 codes = load_8(src.data + (part + kDecodeThreadsPerEntry * k) * 8);
      w[k].x = codes.x, w[k].y = codes.y;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 words = load_16_v41(src.scales + h * kVectorBytes, aligned);
      w[4 * h].z = words.x, w[4 * h + 1].z = words.y, w[4 * h + 2].z = words.z, w[4 * h + 3].z = words.w;
    }
  }

  // MODEL1's direct route with one scale byte per item (no NaN code, scale byte at most kMaxDirectScale), else its
  // exact route, inlined: a call spilled the tile loop, by-value codes or not (and the codes stay in registers).
  DSV4_SM90_DEVICE void store_fp8(bool ok, int e, int part, uint8_t* tile) const {
    E4m3Codes<kV41ThreadItems> c;
#pragma unroll
    for (int k = 0; k < kV41ThreadItems; ++k) c.nope[k] = w[k];
    c.scales = scales;
    if (__builtin_expect(decodes_share_directly(c, ok), 1)) {
      store_direct(c, e, part, tile);
    } else {
      store_exact_items(c, ok, e, part, tile);
    }
  }

  // Two routes, both exact for every code and finite scale (a NaN scale's factor is NaN: its 16 values NaN, as the
  // portable tier's; an invalid entry's factor zero): one product per pair where the thread's scales are all below 4
  // (real caches' are), else two.
  DSV4_SM90_DEVICE void store_fp4(bool ok, int e, int part, uint8_t* tile) const {
    const uint4 raw[2] = {make_uint4(w[0].z, w[1].z, w[2].z, w[3].z), make_uint4(w[4].z, w[5].z, w[6].z, w[7].z)};
    const uint2 item_scales = v41_fp4_item_scales(raw, part);
    uint32_t factors[4];  // item k's scale: half k % 2 of factors[k / 2]
    e4m3x4_scales_to_bf16(item_scales.x, factors[0], factors[1]);
    e4m3x4_scales_to_bf16(item_scales.y, factors[2], factors[3]);
    if (__builtin_expect(e4m3x4_below_four(item_scales.x) && e4m3x4_below_four(item_scales.y), 1)) {
#pragma unroll
      for (int i = 0; i < 4; ++i) factors[i] = mul_bf16x2(factors[i], kTwoTo126);
      store_fp4_items<false>(ok, factors, e, part, tile);
    } else {
      store_fp4_items<true>(ok, factors, e, part, tile);
    }
  }

  template <bool kRaise>
  DSV4_SM90_DEVICE void store_fp4_items(bool ok, const uint32_t (&factors)[4], int e, int part, uint8_t* tile) const {
#pragma unroll
    for (int k = 0; k < kV41ThreadItems; ++k) {
      const int item = part + kDecodeThreadsPerEntry * k;
      uint4 first, second;
      decode_e2m1_16<kRaise>(make_uint2(w[k].x, w[k].y), ok ? bf16_broadcast(factors[k / 2], k % 2) : 0u, first,
                             second);
      *reinterpret_cast<uint4*>(tile + tile_offset(e, 2 * item)) = first;
      *reinterpret_cast<uint4*>(tile + tile_offset(e, 2 * item + 1)) = second;
    }
  }
};

// prefetch_next_entry for V4.1 (the stage's record gives the entry's size): fp8 data in four 128-byte steps, fp4 in
// two, each with the line of its last byte (entries need not start on a line), and the scales.
DSV4_SM90_DEVICE void prefetch_next_v41_entry(uint8_t* smem, int64_t x, int e, int part) {
  constexpr int kLineBytes = 128;
  const int stage = int(x % kPtrStages);
  if (!mbarrier_ready(ptr_full_bar(smem, stage), uint32_t(x / kPtrStages) & 1u)) return;
  const EntrySource src = ptr_stage(smem, stage)[e];
  if (src.data == nullptr) return;
  const int data_bytes = *stage_kind(smem, stage) ? kV41Fp4DataBytes : kV41Fp8DataBytes;
  if (part * kLineBytes < data_bytes) prefetch_l2(src.data + part * kLineBytes);
  if (part == 3) prefetch_l2(src.data + data_bytes - 1);
  if (part == 1) prefetch_l2(src.scales);
}

// The cursors of the index copies: slot k % kCursorSlots holds the cursor at tile k. The valuer's start writes
// those of tiles kIndexLead .. kWalkAhead - 1; the walker (thread 0 of decoder 1, which has registers to spare)
// writes the one of tile g + kWalkAhead once it has handed tile g over (the walk stays off the fill's chain) and
// then frees tile g's address stage, so that publish(x) (which waits for that stage's release for x >= kPtrStages)
// finds the cursor of tile x + kIndexLead.
DSV4_SM90_DEVICE TileCursor* cursor_slot(uint8_t* smem, int64_t k) {
  return reinterpret_cast<TileCursor*>(smem + kCursorOffset) + k % kCursorSlots;
}

DSV4_SM90_DEVICE void walk_cursor(const SparseMlaDecodeParams& p, const int32_t* meta, uint8_t* smem, int64_t g) {
  TileCursor c = *cursor_slot(smem, g + kWalkAhead - 1);
  next_tile(p, meta, c);
  *cursor_slot(smem, g + kWalkAhead) = c;
}

// This decoder's half of the valid-entry mask of buffer `buffer`: lanes 0, 4, .. 28 of warp w hold entries
// 32 d + 8 w .. + 7, whose valid bits form byte 4 d + w.
DSV4_SM90_DEVICE void write_valid_bits(bool ok, int d, int t, int part, int buffer, uint8_t* smem) {
  const uint32_t mask = __ballot_sync(0xffffffffu, ok && part == 0);
  if (t % 32 == 0) {
    uint32_t bits = 0;
    for (int j = 0; j < 8; ++j) bits |= ((mask >> (kDecodeThreadsPerEntry * j)) & 1u) << j;
    smem[kValidOffset + 8 * buffer + 4 * d + t / 32] = uint8_t(bits);
  }
}

// One V4.1 tile g of a decoder (see decode_role): load this thread's codes of its entry, prefetch the next tile's,
// free the address stage, wait for the buffer, write the valid bits and the bf16 rows (no RoPE copies: every dim
// is a code) and hand the tile over.
DSV4_SM90_DEVICE void decode_v41_tile(const SparseMlaDecodeParams& p, const int32_t* meta, const EntrySource& src,
                                      int64_t g, int64_t total, int d, int t, uint8_t* smem) {
  const int part = t % kDecodeThreadsPerEntry, e = kDecodeHalfEntries * d + t / kDecodeThreadsPerEntry;
  const int stage = int(g % kPtrStages), buffer = int(g % 2);
  uint8_t* tile = smem + kKvOffset + buffer * kTileBytes;
  const bool fp4 = *stage_kind(smem, stage);  // uniform
  V41Codes codes;
  if (fp4) {
    codes.load_fp4(src, part);
  } else {
    codes.load_fp8(src, part);
  }
  if (g + 1 < total) prefetch_next_v41_entry(smem, g + 1, e, part);
  const bool walker = d == 1 && t == 0;
  if (!walker) mbarrier_arrive(ptr_free_bar(smem, stage));
  if (g >= 2) mbarrier_wait(empty_bar(smem, buffer), uint32_t(g / 2 - 1) & 1u);
  const bool ok = src.data != nullptr;
  write_valid_bits(ok, d, t, part, buffer, smem);
  if (fp4) {
    codes.store_fp4(ok, e, part, tile);
  } else {
    codes.store_fp8(ok, e, part, tile);
  }
  fence_async_shared();
  named_arrive(kBarFull + buffer, kFullThreads);
  if (walker) {
    walk_cursor(p, meta, smem, g);
    mbarrier_arrive(ptr_free_bar(smem, stage));
  }
}

// Decoder warpgroup d (0 or 1) writes entries 32 d .. 32 d + 31 of every tile: it reads the tile's entry addresses
// and loads the codes of its share into registers, then waits for the tile's buffer (g % 2) to be empty, copies
// the RoPE chunks (no conversion: cp.async), writes the bf16 rows and its half of the valid mask and hands the tile
// to the scorer. Lanes 0, 4, .. 28 of warp w hold entries 32 d + 8 w .. + 7, whose valid bits form byte 4 d + w of
// the tile's mask. kBf16Rows: the entries are bf16 rows (prefill), copied by cp.async in two halves, each handed
// over once it has landed (the scorer's S starts on the first half; measured 3.5-4.5% faster:
// docs/perf/2026-12-01-gpu-22-kv-buffers-in-halves.md, "the bf16 prefill's K/V buffers fill in halves").
template <bool kBf16Rows, Record kRec>
DSV4_SM90_DEVICE void decode_role(const SparseMlaDecodeParams& p, const int32_t* meta, int d, uint8_t* smem) {
  const int t = threadIdx.x % kGroupThreads, part = t % kDecodeThreadsPerEntry;
  const int e = kDecodeHalfEntries * d + t / kDecodeThreadsPerEntry;
  // A plan without split requests leaves the combine nothing to do: let its grid be scheduled now (it leaves as soon
  // as this grid is done) rather than after this grid ends. One thread's trigger counts for the CTA; its loads
  // overlap the walk's. With splits the combine starts at this grid's end, as without a trigger.
  const bool unsplit = d == 1 && t == 0 && p.sched.num_splits != nullptr && mla::plan_splits_nothing(p);
  const int64_t total = partition_tiles(p, meta);
  if (unsplit) asm volatile("griddepcontrol.launch_dependents;\n");
  for (int64_t g = 0; g < total; ++g) {
    const int stage = int(g % kPtrStages), buffer = int(g % 2);
    uint8_t* tile = smem + kKvOffset + buffer * kTileBytes;
    mbarrier_wait(ptr_full_bar(smem, stage), uint32_t(g / kPtrStages) & 1u);
    const EntrySource src = ptr_stage(smem, stage)[e];
    if constexpr (kRec == Record::v41) {
      decode_v41_tile(p, meta, src, g, total, d, t, smem);
      continue;
    }
    EntryCodes codes;
    if constexpr (!kBf16Rows) load_entry(src, part, codes);
    if (!kBf16Rows && g + 1 < total) prefetch_next_entry(smem, g + 1, e, part);
    const bool walker = d == 1 && t == 0;
    if (!walker) mbarrier_arrive(ptr_free_bar(smem, stage));
    const uint32_t empty_phase = uint32_t(g / 2 - 1) & 1u;  // the first two tiles find their buffers empty
    if (g >= 2) mbarrier_wait(empty_bar(smem, buffer), empty_phase);
    if constexpr (kBf16Rows) {  // in halves: the first is freed by the scorer, often well before the second
      copy_row<0, kRowCopies / 2>(src.data, e, part, tile);
      cp_async_commit();
      if (g >= 2) mbarrier_wait(empty_bar(smem, buffer, 1), empty_phase);
      copy_row<kRowCopies / 2, kRowCopies>(src.data, e, part, tile);
    } else {
      copy_rope(src.data, e, part, tile);
    }
    cp_async_commit();
    const bool ok = src.data != nullptr;
    write_valid_bits(ok, d, t, part, buffer, smem);
    if constexpr (kBf16Rows) {  // the first half's copies have landed: S can start on it
      cp_async_wait_group<1>();
      fence_async_shared();
      named_arrive(kBarFull + buffer, kFullThreads);
    } else {
      store_entry(codes, ok, e, part, tile);
    }
    cp_async_wait_all();
    fence_async_shared();
    named_arrive((kBf16Rows ? kBarSecondHalf : kBarFull) + buffer, kFullThreads);
    if (walker) {
      walk_cursor(p, meta, smem, g);
      mbarrier_arrive(ptr_free_bar(smem, stage));
    }
  }
}

// The valuer's publishing side: publish(x) writes tile x's entry addresses into address stage x % kPtrStages (once
// the decoders freed it) and starts copying the index values of tile x + kIndexLead into the index ring. Tiles past
// the partition's last are not published (nobody reads them).
template <Record kRec>
struct Publisher {
  int64_t s, total;
  uint8_t* smem;
  int e, part;

  DSV4_SM90_DEVICE void copy_index(const SparseMlaDecodeParams& p, const TileCursor& c, int64_t x, bool copy = true) {
    const int slot = int(x % kIndexSlots);
    if (part == 0)
      issue_index_copy(p, c, s, e, index_slot(smem, slot), flag_slot(smem, slot), copy);
  }

  // Publishes the first tiles, then counts the partition's tiles (a walk over its pieces' lengths). When the
  // partition starts a request at its first block (always in the main set), that tile's index values are copied
  // before the request's lengths are known; its flags follow from them.
  DSV4_SM90_DEVICE void start(const SparseMlaDecodeParams& p, const int32_t* meta) {
    const int64_t first = meta[0] < 0 ? 0 : meta[0];
    const bool early = meta[2] == 0 && first < p.b && p.main.indices != nullptr && p.main.topk >= kTile;
    if (early && part == 0)
      copy_index_value(p.main, first * p.main.stride_b + s * p.main.stride_s + e * p.main.stride_k,
                       index_slot(smem, 0) + e * 8);
    TileCursor c = first_tile(p, meta);
    const bool matches = !c.done && c.r == first;  // then its tile 0 is block 0 (meta[2] == 0), the copied one
    if (early && !matches) {  // tile 0 is another one: the early copy lands before the one below
      cp_async_commit();
      cp_async_wait_all();
    }
    uint32_t present = 0;  // bit x: the partition has tile x
    for (int x = 0; x < kIndexLead; ++x) {  // one group per tile, as publish's wait counts them
      present |= c.done ? 0u : 1u << x;
      copy_index(p, c, x, !(x == 0 && early && matches));
      cp_async_commit();
      next_tile(p, meta, c);
    }
    for (int k = kIndexLead; k < kWalkAhead; ++k) {
      if (threadIdx.x % kGroupThreads == 0) *cursor_slot(smem, k) = c;
      next_tile(p, meta, c);
    }
    named_sync(kBarValuer, kGroupThreads);
    static_assert(kPublishLead <= kIndexLead, "the first publishes are of tiles the start walked");
    for (int x = 0; x < kPublishLead; ++x)
      if ((present >> x) & 1u) publish_tile(p, meta, x);
    total = partition_tiles(p, meta);
  }

  DSV4_SM90_DEVICE void publish(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t x) {
    if (x < total) publish_tile(p, meta, x);
  }

  DSV4_SM90_DEVICE void publish_tile(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t x) {
    const int stage = int(x % kPtrStages), slot = int(x % kIndexSlots);
    if (x >= kPtrStages) mbarrier_wait(ptr_free_bar(smem, stage), uint32_t(x / kPtrStages - 1) & 1u);
    cp_async_wait_group<kIndexLead - 1>();  // the group that carried tile x's indices
    __syncwarp();
    if (part == 0)
      ptr_stage(smem, stage)[e] = entry_source<kRec>(p, index_slot(smem, slot), flag_slot(smem, slot), e);
    if (kRec == Record::v41 && threadIdx.x % kGroupThreads == 0)  // entry 0 is in every tile of its set
      *stage_kind(smem, stage) = (flag_slot(smem, slot)[0] & kFlagExtra) && p.extra.layout == KvLayout::v41_fp4;
    copy_index(p, *cursor_slot(smem, x + kIndexLead), x + kIndexLead);
    cp_async_commit();
    mbarrier_arrive(ptr_full_bar(smem, stage));
  }
};

// The scorer copies the CTA's sink logits into shared memory (cp.async, waited for with the first q) when it starts,
// so that no piece's finish waits on a cold load; the valuer's first read is past a P handover or the staging
// barrier, or its rows have no weight (sum 0) and do not use it.
DSV4_SM90_DEVICE void copy_sinks(const SparseMlaDecodeParams& p, int64_t head0, int t, uint8_t* smem) {
  if (p.attn_sink != nullptr && t < kHeadsPerCta && head0 + t < p.h_q)
    cp_async_4(shared_address(smem + kSinkOffset + 4 * t), p.attn_sink + head0 + t);
  cp_async_commit();
}

// y[i] = x[i ^ q] for the lane's quad position q (selects: no local memory).
DSV4_SM90_DEVICE void quad_permute(const uint32_t (&x)[4], int q, uint32_t (&y)[4]) {
  const bool odd = q & 1, high = q & 2;
  const uint32_t a0 = odd ? x[1] : x[0], a1 = odd ? x[0] : x[1], a2 = odd ? x[3] : x[2], a3 = odd ? x[2] : x[3];
  y[0] = high ? a2 : a0, y[1] = high ? a3 : a1, y[2] = high ? a0 : a2, y[3] = high ? a1 : a3;
}

// Lane q of a quad holds word j = columns 8 j + 2 q, +1 of four n8 tiles; returns the four words of tile q (its 16
// contiguous bytes): a 4 x 4 transpose over the quad in three exchanges, each lane sending the word its partner needs.
DSV4_SM90_DEVICE uint4 quad_transpose(const uint32_t (&w)[4], int q) {
  uint32_t u[4], r[4], v[4];
  quad_permute(w, q, u);  // u[i]: the word lane q ^ i needs
  r[0] = u[0];
#pragma unroll
  for (int i = 1; i < 4; ++i) r[i] = __shfl_xor_sync(0xffffffffu, u[i], i);  // lane q ^ i's word q
  quad_permute(r, q, v);
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// Row r of this thread's O fragments, scaled, into `row` (this warpgroup's 256 dims) as 16-byte stores of whole
// sectors: each lane of a quad writes one n8 tile of every four (4-byte stores of the fragments write half sectors,
// with four times the store instructions). Every lane of the warp takes part in the transposes; a null `row` (a
// row past h_q) stores nothing.
DSV4_SM90_DEVICE void store_row_wide(const RowState& st, int r, float scale, int q, uint16_t* row) {
#pragma unroll
  for (int g = 0; g < kValueTiles / 4; ++g) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = pack_bf16x2(st.o[4 * g + j][2 * r] * scale, st.o[4 * g + j][2 * r + 1] * scale);
    const uint4 words = quad_transpose(w, q);
    if (row != nullptr) *reinterpret_cast<uint4*>(row + 8 * (4 * g + q)) = words;
  }
}

// Whether output rows start on 16-byte boundaries (rows are 1 KB apart): bulk copies and 16-byte stores can write
// them.
DSV4_SM90_DEVICE bool out_rows_aligned(const SparseMlaDecodeParams& p) {
  return reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
}

// Finalises this thread's rows with the portable tier's row finishers (one definition of the lse, sink and
// no-valid-entry conventions): a single piece writes out (into `stage` rows instead where given, see finish_piece)
// and lse (and max_logits, the largest scaled score, where given), a split piece its fp32 partial and lse.
// kSingle: piece.target.single (each kind of row straight through: the code is cold at the CTA's end). kWide: output
// rows not staged go out in 16-byte stores (store_row_wide), for a role with the registers for its transposes.
template <bool kSingle, bool kWide>
DSV4_SM90_DEVICE void finish_rows(const SparseMlaDecodeParams& p, const Piece& piece, int64_t s, int64_t head0,
                                  int row_group, int half, int lane, RowState& st, float* max_logits,
                                  const uint8_t* smem, uint8_t* stage) {
  const PieceTarget& target = piece.target;
  const bool wide_rows = kSingle && kWide && stage == nullptr && out_rows_aligned(p);  // uniform: store_row_wide
  const float* sink_logits = reinterpret_cast<const float*>(smem + kSinkOffset);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = st.sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = 16 * row_group + 8 * r + (lane >> 2);  // of the CTA's 64 heads; a warp's rows for r: 8 in a run
    const int64_t head = head0 + row;
    // Rows past h_q write nothing; where the wide stores run, those of a warp that has valid rows still take part in
    // their shuffles.
    const bool valid = head < p.h_q, warp_past = head - (lane >> 2) >= p.h_q;
    if (!valid && (!wide_rows || warp_past)) continue;
    const float max = st.max[r] * kLn2;  // the weights' offset, kept in the log2 domain
    const float sink = sink_logits[row];  // used only with a sink and a weight
    const mla::RowFinish f = kSingle ? mla::finish_output_row(max, sum, p.attn_sink != nullptr, sink, st.peak[r] * kLn2)
                                     : mla::finish_partial_row(max, sum);
    const int64_t dim0 = int64_t(kHalfDim) * half + 2 * (lane & 3);
    const bool writes_lse = half == 0 && (lane & 3) == 0;
    if constexpr (kSingle) {
      uint16_t* out_row =
          valid ? p.out + ((piece.r * p.s_q + s) * p.h_q + head) * kDim + int64_t(kHalfDim) * half : nullptr;
      if (wide_rows) {
        store_row_wide(st, r, f.out_scale, lane & 3, out_row);
        if (!valid) continue;
      } else {
        uint16_t* out = stage != nullptr ? reinterpret_cast<uint16_t*>(stage + row * kStageRowBytes) + dim0
                                         : out_row + 2 * (lane & 3);
#pragma unroll
        for (int t = 0; t < kValueTiles; ++t)
          *reinterpret_cast<uint32_t*>(out + 8 * t) =
              pack_bf16x2(st.o[t][2 * r] * f.out_scale, st.o[t][2 * r + 1] * f.out_scale);
      }
      const int64_t lse_at = (piece.r * p.h_q + head) * p.s_q + s;
      if (writes_lse) p.lse[lse_at] = f.lse;
      if (writes_lse && max_logits != nullptr) max_logits[lse_at] = f.max_logit;
    } else {
      const int64_t row = mla::accum_row(p, target.split_row, s, head);
      float* out = p.sched.o_accum + row * kDim + dim0;
#pragma unroll
      for (int t = 0; t < kValueTiles; ++t)
        *reinterpret_cast<float2*>(out + 8 * t) =
            make_float2(st.o[t][2 * r] * f.out_scale, st.o[t][2 * r + 1] * f.out_scale);
      if (writes_lse) p.sched.lse_accum[row] = f.lse;
    }
  }
}

// One 16-byte chunk of q row `head` by element loads (q rows not 16-byte aligned; zero past h_q).
DSV4_SM90_DEVICE uint4 load_q_chunk(const SparseMlaDecodeParams& p, const uint16_t* q, int64_t head, int chunk) {
  if (head >= p.h_q) return make_uint4(0, 0, 0, 0);
  const uint16_t* src = q + head * p.q_stride_h + chunk * kChunkElems;
  uint16_t x[kChunkElems];
  for (int i = 0; i < kChunkElems; ++i) x[i] = __ldg(src + i);
  return make_uint4(x[0] | uint32_t(x[1]) << 16, x[2] | uint32_t(x[3]) << 16, x[4] | uint32_t(x[5]) << 16,
                    x[6] | uint32_t(x[7]) << 16);
}

// How the scorer fills the q tile: eight tensor copies of q_map's 128-byte-swizzled slabs (64 dims of 64 heads, the
// heads past h_q filled with zeros), issued by one thread and completing on the q barrier, or element loads where q
// has no tensor map (map null). `issued` and `waited` count the tensor loads.
struct QLoader {
  const CUtensorMap* map;
  uint32_t bar;
  uint32_t issued, waited;

  // Starts loading the q rows of heads [head0, head0 + 64) of query (b, s) into the tile; wait finishes it.
  DSV4_SM90_DEVICE void start(const SparseMlaDecodeParams& p, int64_t b, int64_t s, int64_t head0, uint8_t* tile) {
    if (map != nullptr) {  // uniform
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(bar, kTileBytes);
        for (int slab = 0; slab < kDim / kSlabDims; ++slab)
          tensor_copy_4d(shared_address(tile + slab * kSlabBytes), map, slab * kSlabDims, int(head0), int(s), int(b),
                         bar);
      }
      ++issued;
      return;
    }
    constexpr int kPerThread = kHeadsPerCta * kChunksPerRow / kGroupThreads;
    const uint16_t* q = p.q + b * p.q_stride_b + s * p.q_stride_s;
    for (int k = 0; k < kPerThread; ++k) {
      const int u = threadIdx.x + k * kGroupThreads, row = u / kChunksPerRow, chunk = u % kChunksPerRow;
      *reinterpret_cast<uint4*>(tile + tile_offset(row, chunk)) = load_q_chunk(p, q, head0 + row, chunk);
    }
  }

  // Waits for the last tensor load, if it is still in flight.
  DSV4_SM90_DEVICE void land() {
    if (waited < issued) mbarrier_wait(bar, waited++ & 1u);
  }

  // The tile and the sink logits (see copy_sinks), visible to every scorer thread and to wgmma.
  DSV4_SM90_DEVICE void wait() {
    land();
    cp_async_wait_all();
    fence_async_shared();  // the element path's stores
    named_sync(kBarScorer, kGroupThreads);
  }
};

DSV4_SM90_DEVICE void clear_rows(RowState& st) {
#pragma unroll
  for (int t = 0; t < kValueTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) st.o[t][i] = 0.0f;
  st.max[0] = st.max[1] = st.peak[0] = st.peak[1] = -INFINITY;
  st.sum[0] = st.sum[1] = 0.0f;
}

// The P handover of tile t (see kProbsSlotBytes); thread t of the scorer writes what thread t of the valuer reads
// (both hold the same rows and columns of the fragments).
struct ProbsSlot {
  uint4* p;  // k16 step kk at p[kk * kGroupThreads + thread]
  float4* scale_max;
  float2* sums;
};

DSV4_SM90_DEVICE ProbsSlot probs_slot(uint8_t* smem, int tile) {
  uint8_t* base = smem + kProbsOffset + tile * kProbsSlotBytes;
  return {reinterpret_cast<uint4*>(base), reinterpret_cast<float4*>(base + 16 * kPvSteps * kGroupThreads),
          reinterpret_cast<float2*>(base + 16 * (kPvSteps + 1) * kGroupThreads)};
}

// Whether the piece's output rows go out through the staging rows: the CTA's last piece, written to the output.
DSV4_SM90_DEVICE bool stages_rows(const SparseMlaDecodeParams& p, const Piece& piece, int64_t last) {
  return piece.r == last && piece.target.single && out_rows_aligned(p);
}

// Finishes a piece's rows; the CTA's last piece goes through the staging rows: once both roles' P V are done (the
// rows overlap K/V buffer 0), each writes its half of the rows there, then thread h of the scorer copies row h
// to the output. One call site of finish_rows per role keeps the row registers in one place.
template <bool kWide>
DSV4_SM90_DEVICE void finish_piece(const SparseMlaDecodeParams& p, const Piece& piece, bool staged, int64_t s,
                                   int64_t head0, int row_group, int half, int lane, RowState& st, float* max_logits,
                                   uint8_t* smem) {
  uint8_t* stage = staged ? smem + kQOffset : nullptr;
  if (staged) named_sync(kBarStage, 2 * kGroupThreads);
  if (piece.target.single) {
    finish_rows<true, kWide>(p, piece, s, head0, row_group, half, lane, st, max_logits, smem, stage);
  } else {
    finish_rows<false, kWide>(p, piece, s, head0, row_group, half, lane, st, max_logits, smem, stage);
  }
  if (!staged) return;
  fence_async_shared();  // the rows' stores, before the bulk copies read them
  named_sync(kBarStage, 2 * kGroupThreads);
  const int t = threadIdx.x % kGroupThreads;
  if (half == 0 && t < kHeadsPerCta && head0 + t < p.h_q) {
    bulk_copy_to_global(p.out + ((piece.r * p.s_q + s) * p.h_q + head0 + t) * kDim,
                        shared_address(stage + t * kStageRowBytes), kDim * 2);
    bulk_commit();
    bulk_wait_all();
  }
}

// Scorer warpgroup: per piece loads q; per tile S, the softmax, the P handover and O += P V for dims 0-255.
// kHalves: the K/V buffers fill in halves (see empty_bar).
template <bool kHalves>
DSV4_SM90_DEVICE void score_role(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t s,
                                 const CUtensorMap* q_map, float* max_logits, uint8_t* smem) {
  uint8_t* q_tile = smem + kQOffset;
  const uint32_t q_base = shared_address(q_tile), kv_base = shared_address(smem + kKvOffset);
  const uint64_t* valid = reinterpret_cast<const uint64_t*>(smem + kValidOffset);
  const int t = threadIdx.x, row_group = t / 32, lane = t % 32;
  const int64_t head0 = int64_t(blockIdx.x) * kHeadsPerCta;
  const float scale_log2 = p.sm_scale * kLog2e;
  const int64_t first = meta[0] < 0 ? 0 : meta[0], last = meta[1] < p.b ? meta[1] : p.b - 1;
  int64_t g = 0, q_request = first;  // q_request: the request whose q is in (or on its way to) the tile
  QLoader q{q_map, shared_address(smem + kQMbarOffset), 0, 0};
  copy_sinks(p, head0, t, smem);
  if (first <= last) q.start(p, first, s, head0, q_tile);
  for (int64_t r = first; r <= last; ++r) {
    const Piece piece = piece_of(p, meta, r);
    if (piece.skip) continue;
    if (q_request != r) {
      q.land();  // a load for a passed-over request may still be in flight
      named_sync(kBarScorer, kGroupThreads);  // every scorer warp is done with the previous q
      q.start(p, r, s, head0, q_tile);
      q_request = r;
    }
    q.wait();
    RowState st;
    clear_rows(st);
    for (int64_t i = 0; i < piece.tiles; ++i, ++g) {
      const int tile = int(g % 2);
      const uint32_t kv_tile = kv_base + tile * kTileBytes;
      named_sync(kBarFull + tile, kFullThreads);
      float scores[kScoreTiles][4];
      issue_scores<kHalves>(q_base, kv_tile, tile, scores);
      wgmma_wait_all();
      if (i + 1 == piece.tiles && r < last) {  // the next request's q loads under this tile's softmax and P V
        named_sync(kBarScorer, kGroupThreads);
        q.start(p, r + 1, s, head0, q_tile);
        q_request = r + 1;
      }
      // The softmax, with P V of the first half of the tile's entries issued before the second half's weights are
      // computed (their ex2s run under it).
      float alpha[2];
      const TileWeights weights = softmax_rows(scores, valid[tile], scale_log2, lane, st, alpha);
      uint32_t probs[kPvSteps][4];
      tile_weights<0, kPvSteps / 2>(scores, weights, probs);
      fence_probs<0, kPvSteps / 2>(probs);
      slab_values<0, kPvSteps / 2>(kv_tile, probs, 0, st);
      tile_weights<kPvSteps / 2, kPvSteps>(scores, weights, probs);
      fence_probs<kPvSteps / 2, kPvSteps>(probs);  // the second half's P fragments come after the first fence
      slab_values<kPvSteps / 2, kPvSteps>(kv_tile, probs, 0, st);
      wgmma_commit();
      add_row_sums(scores, alpha, st);
      const ProbsSlot slot = probs_slot(smem, tile);
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk)
        slot.p[kk * kGroupThreads + t] = make_uint4(probs[kk][0], probs[kk][1], probs[kk][2], probs[kk][3]);
      slot.scale_max[t] = make_float4(alpha[0], alpha[1], st.max[0], st.max[1]);
      slot.sums[t] = make_float2(st.sum[0], st.sum[1]);
      named_arrive(kBarProbs + tile, kProbsThreads);
      wgmma_wait_all();
      mbarrier_arrive(empty_bar(smem, tile));
    }
    finish_piece<false>(p, piece, stages_rows(p, piece, last), s, head0, row_group, 0, lane, st, max_logits, smem);
  }
  q.land();  // a load for a request whose piece was passed over may still be in flight
  cp_async_wait_all();  // the sink logits, where no piece waited for them
}

// Valuer warpgroup: keeps the published entry addresses kPublishLead tiles ahead; per tile takes P and the rescale
// factors from the scorer and runs O += P V for dims 256-511. kHalves: the K/V buffers fill in halves.
template <bool kHalves, bool kWide, Record kRec>
DSV4_SM90_DEVICE void value_role(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t s, uint8_t* smem) {
  const uint32_t kv_base = shared_address(smem + kKvOffset);
  const int t = threadIdx.x % kGroupThreads, row_group = t / 32, lane = t % 32;
  const int64_t head0 = int64_t(blockIdx.x) * kHeadsPerCta;
  Publisher<kRec> publisher{s, 0, smem, t / kPublishThreadsPerEntry, t % kPublishThreadsPerEntry};
  publisher.start(p, meta);
  const int64_t first = meta[0] < 0 ? 0 : meta[0], last = meta[1] < p.b ? meta[1] : p.b - 1;
  int64_t g = 0;
  for (int64_t r = first; r <= last; ++r) {
    const Piece piece = piece_of(p, meta, r);
    if (piece.skip) continue;
    const int64_t tiles = piece.tiles;
    const bool staged = stages_rows(p, piece, last);
    RowState st;
    clear_rows(st);
    for (int64_t i = 0; i < tiles; ++i, ++g) {
      publisher.publish(p, meta, g + kPublishLead);
      const int tile = int(g % 2);
      named_sync(kBarProbs + tile, kProbsThreads);
      const ProbsSlot slot = probs_slot(smem, tile);
      uint32_t probs[kPvSteps][4];
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
        const uint4 w = slot.p[kk * kGroupThreads + t];
        probs[kk][0] = w.x, probs[kk][1] = w.y, probs[kk][2] = w.z, probs[kk][3] = w.w;
      }
      const float4 scale_max = slot.scale_max[t];
      const float2 sums = slot.sums[t];
      st.max[0] = scale_max.z, st.max[1] = scale_max.w;
      st.sum[0] = sums.x, st.sum[1] = sums.y;
      rescale_row(st, 0, scale_max.x);
      rescale_row(st, 1, scale_max.y);
      wgmma_fence();
      slab_values(kv_base + tile * kTileBytes, probs, 1, st);
      wgmma_commit();
      wgmma_wait_all();
      mbarrier_arrive(empty_bar(smem, tile, kHalves ? 1 : 0));
    }
    // The piece is reloaded: no piece fields held across the tiles.
    finish_piece<kWide>(p, piece_of(p, meta, r), staged, s, head0, row_group, 1, lane, st, nullptr, smem);
  }
  cp_async_wait_all();  // index copies past the last tile
}

// Word w of partition z of a plan-less run (no sched_meta): requests [z b / parts, (z + 1) b / parts), each whole
// (begin block 0, end block past any request's last).
DSV4_SM90_DEVICE int32_t whole_requests_word(const SparseMlaDecodeParams& p, int64_t z, int w) {
  const int64_t parts = p.sched.num_parts;  // one request per CTA (see kernel_params): no 64-bit division
  const int64_t begin = parts == p.b ? z : z * p.b / parts, end = parts == p.b ? z + 1 : (z + 1) * p.b / parts;
  return w == 0 ? int32_t(begin) : w == 1 ? int32_t(end - 1) : w == 3 ? INT32_MAX : 0;
}

// Grid (head groups, s_q, num_parts): CTA (x, s, z) attends heads [64x, 64x + 64) of query s of every request
// piece in schedule partition z. Warpgroup 0 scores, 1 values and publishes addresses, 2 and 3 decode.
// kBf16Rows: the main cache holds bf16 rows (one per page), the sparse prefill's layout. kWideValuer: see RoleRegs.
// kRec: the caches' records (kBf16Rows: model1).
template <bool kBf16Rows, bool kWideValuer, Record kRec>
__global__ void __launch_bounds__(kCtaThreads, 1)
    sparse_mla_decode_sm90_kernel(const SparseMlaDecodeParams p, const __grid_constant__ CUtensorMap q_map,
                                  bool q_tensor, float* max_logits) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((kSwizzleAtomBytes - shared_address(smem_raw) % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  int32_t* meta = reinterpret_cast<int32_t*>(smem + kMetaOffset);
  if (threadIdx.x < kDecodeSchedWords) {
    const int w = int(threadIdx.x);
    meta[w] = p.sched.sched_meta == nullptr ? whole_requests_word(p, blockIdx.z, w)
                                            : p.sched.sched_meta[int64_t(blockIdx.z) * kDecodeSchedWords + w];
  }
  if (threadIdx.x < kPtrStages) {
    mbarrier_init(ptr_full_bar(smem, threadIdx.x), kGroupThreads);
    mbarrier_init(ptr_free_bar(smem, threadIdx.x), 2 * kGroupThreads);
  }
  if (threadIdx.x < 4)  // the second halves' barriers are used only by the bf16 kernel
    mbarrier_init(empty_bar(smem, threadIdx.x % 2, threadIdx.x / 2), kBf16Rows ? kGroupThreads : 2 * kGroupThreads);
  if (threadIdx.x == 0) {
    mbarrier_init(shared_address(smem + kQMbarOffset), 1);
    fence_barrier_init();  // visible to the tensor copies
  }
  __syncthreads();
  const int role = threadIdx.x / kGroupThreads;
  using Regs = RoleRegs<kWideValuer>;
  if (role >= kDecoder) {
    lower_registers<Regs::kDecoder>();
    decode_role<kBf16Rows, kRec>(p, meta, role - kDecoder, smem);
  } else if (role == kScorer) {
    raise_registers<Regs::kScorer>();
    score_role<kBf16Rows>(p, meta, blockIdx.y, q_tensor ? &q_map : nullptr, max_logits, smem);
  } else {
    raise_registers<Regs::kValuer>();
    value_role<kBf16Rows, kWideValuer, kRec>(p, meta, blockIdx.y, smem);
  }
}

constexpr int64_t kMaxGridYZ = 65535;
constexpr uintptr_t kPieceAlign = kPieceBytes, kVectorAlign = 16;

bool cache_is_aligned(const SparseIndexSet& set) {
  if (set.indices == nullptr) return true;
  return pages_aligned(set.cache, kPieceAlign);
}

// The records the decoders take: MODEL1 (page-split), or a V4.1 fp8 main set with an fp8 or fp4 extra set (either
// placement; entry_source follows each cache's).
bool records_covered(const SparseMlaDecodeParams& p) {
  if (p.main.layout == KvLayout::model1) return !p.extra.indices || p.extra.layout == KvLayout::model1;
  return p.main.layout == KvLayout::v41_fp8 &&
         (!p.extra.indices || p.extra.layout == KvLayout::v41_fp8 || p.extra.layout == KvLayout::v41_fp4);
}

bool covered(const SparseMlaDecodeParams& p) {
  return records_covered(p) && p.d_qk == kDim && p.d_v == kDim && p.s_q <= kMaxGridYZ &&
         p.sched.num_parts >= 1 && p.sched.num_parts <= kMaxGridYZ && cache_is_aligned(p.main) &&
         cache_is_aligned(p.extra);
}

bool prefill_covered(const SparseMlaPrefillParams& p) {
  return p.d_qk == kDim && p.d_v == kDim && p.s_q <= INT32_MAX && rows_aligned(p.kv, p.kv_stride * 2, kVectorAlign);
}

// The prefill as a plan-less decode: each query token is a request of one query whose main set is its top-k row
// (lengths: topk_length) over a cache of one-row pages; no extra set, no split, so no combine.
SparseMlaDecodeParams prefill_as_decode(const SparseMlaPrefillParams& p, int64_t sms) {
  SparseMlaDecodeParams d;
  d.q = p.q;
  d.b = p.s_q, d.s_q = 1, d.h_q = p.h_q, d.d_qk = p.d_qk;
  d.q_stride_b = p.q_stride_s, d.q_stride_s = 0, d.q_stride_h = p.q_stride_h;
  d.main.indices = p.indices;
  d.main.is_int64 = p.is_int64;
  d.main.stride_b = p.idx_stride_s, d.main.stride_s = 0, d.main.stride_k = p.idx_stride_k, d.main.topk = p.topk;
  d.main.lengths = p.topk_length;
  // One row per page: entry_source's address is then the row whatever the MODEL1 entry size it assumes.
  d.main.cache = {reinterpret_cast<uint8_t*>(const_cast<uint16_t*>(p.kv)), p.s_kv, p.kv_stride * 2, 1};
  d.attn_sink = p.attn_sink;
  d.d_v = p.d_v, d.sm_scale = p.sm_scale;
  d.out = p.out, d.lse = p.lse;
  const int64_t parts = decode_partitions(sms, 1, p.h_q);
  d.sched.num_parts = parts < p.s_q ? parts : p.s_q;
  return d;
}

// The run as the kernel sees it. A whole-request plan with no more requests than partitions puts each request
// whole into one CTA, so it becomes a plan-less run of one CTA per request: no CTA then reads the plan or the split
// counts, two dependent cold loads ahead of its first index copy (the outputs are the same: a request's tiles and
// their order do not depend on which CTA attends it).
SparseMlaDecodeParams kernel_params(const SparseMlaDecodeParams& p) {
  if (p.b > p.sched.num_parts || !decode_plan_keeps_requests_whole(p)) return p;
  SparseMlaDecodeParams k = p;
  k.sched.sched_meta = nullptr, k.sched.num_splits = nullptr, k.sched.num_parts = p.b;
  return k;
}

// The driver's tensor-map encoder, looked up once through the runtime (nothing links the driver library); null
// where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    const cudaError_t error =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return error == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encoder;
}

// A tensor map of q [b, s_q, h_q, 512] bf16 whose box is one slab of the q tile (64 dims of 64 heads, 128-byte
// swizzle, heads past h_q read as zero). False where the tensor copies cannot read q: rows or strides not 16-byte
// aligned, a stride of 0 over more than one row, a dimension past int32, or no encoder.
bool q_tensor_map(const SparseMlaDecodeParams& p, CUtensorMap& map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  const int64_t extents[3] = {p.h_q, p.s_q, p.b}, strides[3] = {p.q_stride_h, p.q_stride_s, p.q_stride_b};
  cuuint64_t dims[4] = {cuuint64_t(kDim)}, byte_strides[3];
  for (int i = 0; i < 3; ++i) {
    if (extents[i] > INT32_MAX || (extents[i] > 1 && strides[i] <= 0)) return false;
    dims[i + 1] = cuuint64_t(extents[i]);
    byte_strides[i] = extents[i] > 1 ? cuuint64_t(strides[i]) * 2 : kDim * 2;  // a single row: any valid stride
    if (byte_strides[i] % kVectorAlign != 0 || byte_strides[i] >= (cuuint64_t(1) << 40)) return false;
  }
  if (encode == nullptr || reinterpret_cast<uintptr_t>(p.q) % kVectorAlign != 0) return false;
  const cuuint32_t box[4] = {kSlabDims, kHeadsPerCta, 1, 1}, element_strides[4] = {1, 1, 1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint16_t*>(p.q), dims, byte_strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <bool kBf16Rows, bool kWideValuer, Record kRec = Record::model1>
cudaError_t launch_attention(const SparseMlaDecodeParams& p, float* max_logits, cudaStream_t stream) {
  const auto kernel = sparse_mla_decode_sm90_kernel<kBf16Rows, kWideValuer, kRec>;
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return attr;
  CUtensorMap q_map{};
  const bool q_tensor = q_tensor_map(p, q_map);
  const dim3 grid(unsigned((p.h_q + kHeadsPerCta - 1) / kHeadsPerCta), unsigned(p.s_q), unsigned(p.sched.num_parts));
  kernel<<<grid, kCtaThreads, kSmemBytes, stream>>>(p, q_map, q_tensor, max_logits);
  return cudaGetLastError();
}

}  // namespace
}  // namespace dsv4::cuda::sm90

namespace dsv4::cuda {

cudaError_t launch_sparse_mla_decode_sm90(const SparseMlaDecodeParams& p, cudaStream_t stream) {
  using namespace sm90;
  if (!covered(p)) return launch_sparse_mla_decode(p, stream);
  if (p.b == 0 || p.s_q == 0 || p.h_q == 0) return cudaSuccess;
  if (p.sched.plan) {
    const cudaError_t planned = launch_sparse_mla_decode_schedule(p, stream);
    if (planned != cudaSuccess) return planned;
  }
  // More requests than partitions: CTAs finish several pieces, whose rows the wide valuer stores faster (RoleRegs).
  const SparseMlaDecodeParams k = kernel_params(p);
  const bool wide = k.b > k.sched.num_parts;
  cudaError_t launched;
  if (k.main.layout == KvLayout::v41_fp8) {  // one shape: the V4.1 decoders need their 72 registers (RoleRegs)
    launched = launch_attention<false, false, Record::v41>(k, nullptr, stream);
  } else {
    launched = wide ? launch_attention<false, true>(k, nullptr, stream)
                    : launch_attention<false, false>(k, nullptr, stream);
  }
  if (launched != cudaSuccess) return launched;
  return launch_decode_combine(p, stream, true);
}

cudaError_t launch_sparse_mla_prefill_sm90(const SparseMlaPrefillParams& p, cudaStream_t stream) {
  using namespace sm90;
  if (!prefill_covered(p)) return launch_sparse_mla_prefill(p, stream);
  if (p.s_q == 0 || p.h_q == 0) return cudaSuccess;
  return launch_attention<true, true>(prefill_as_decode(p, p.threads), p.max_logits, stream);
}

}  // namespace dsv4::cuda
