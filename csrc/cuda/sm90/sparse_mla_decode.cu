// Hopper tier of the MODEL1 sparse decode, warp-specialised: a CTA attends 64 heads of one query over its schedule
// partition in sub-blocks of 32 entries, with one job per warpgroup. The scorer (warpgroup 0) runs S = Q K^T, the
// online softmax and O += P V for output dims 0-255 on wgmma, and hands P and the row rescale factors to the valuer
// (warpgroup 1) through shared memory; the valuer runs O += P V for dims 256-511 and also streams the entries' raw
// bytes into a ring of kRawStages staging buffers by cp.async several sub-blocks ahead (the indices travel further
// ahead through a shared-memory ring, so no thread waits on an index load); two decoders (warpgroups 2 and 3, one
// per K/V tile, alternate sub-blocks) turn staged sub-blocks into bf16 tiles. Tiles and P are handed over with
// named barriers, staging buffers with mbarriers (the gathers' cp.async completion arrives on them).
#include <cmath>

#include "common/decode_schedule.h"
#include "cuda/launchers.h"
#include "cuda/portable/sparse_mla_common.cuh"
#include "cuda/sm90/decode_tiles.cuh"
#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace dsv4::cuda::sm90 {
namespace {

constexpr int kSub = 32;  // entries per sub-block (half a schedule block)
constexpr int kGroupThreads = 128, kCtaThreads = 4 * kGroupThreads;
constexpr int kThreadsPerEntry = kGroupThreads / kSub;  // threads per entry when a warpgroup gathers or decodes
constexpr int kScorer = 0, kDecoder = 2;  // warpgroup 0 scores, 1 values and gathers, 2 and 3 decode (alternate subs)
constexpr int kScorerRegs = 200, kValuerRegs = 168, kDecoderRegs = 72;  // setmaxnreg: 200 + 168 + 2 x 72 = 4 x 128
static_assert(kScorerRegs + kValuerRegs + 2 * kDecoderRegs <= 4 * 128,
              "setmaxnreg.inc waits for registers the decoders released: never more than the CTA holds");
// Named barriers (0 is __syncthreads): tile t full = 1 + t (decoder -> scorer), tile t empty = 3 + t (scorer and
// valuer -> decoder), P of tile t ready = 5 + t (scorer -> valuer), the scorer's own.
constexpr int kBarFull = 1, kBarEmpty = 3, kBarProbs = 5, kBarScorer = 7;
constexpr int kFullThreads = 2 * kGroupThreads, kEmptyThreads = 3 * kGroupThreads, kProbsThreads = 2 * kGroupThreads;
constexpr int kSubsPerBlock = kEntriesPerBlock / kSub;
constexpr int kRawStages = 4;
constexpr int kGatherLead = kRawStages - 1;  // sub-blocks gathered ahead of the one the scorer works on
constexpr int kHalfDim = kDim / 2;
constexpr int kScoreTiles = kSub / 8;  // n8 tiles of S per warp
constexpr int kValueTiles = kHalfDim / 8;  // n8 tiles of O per warp
constexpr int kSlabDims = kSlabChunks * kChunkElems;  // 64 dims per 128-byte swizzled slab
constexpr int kHalfSlabs = kHalfDim / kSlabDims;
constexpr int kSlabSteps = kSlabDims / 16;  // k16 steps per slab
constexpr int kQkSteps = kDim / 16;
constexpr int kPvSteps = kSub / 16;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

constexpr int kQSlabBytes = kHeadsPerCta * kRowBytes;  // 8 KB
constexpr int kKvSlabBytes = kSub * kRowBytes;  // 4 KB
constexpr int kKvTileBytes = kDim / kSlabDims * kKvSlabBytes;  // 32 KB
constexpr int kRawScaleOffset = kSub * kEntryDataBytes;  // staging: all data, then all scale rows
constexpr int kRawBytes = kRawScaleOffset + kSub * kEntryScaleBytes;  // 18688
constexpr int kItemsPerEntry = kEntryDataBytes / kVectorBytes;  // 36 16-byte items
constexpr int kNopeItems = kNopeDim / kVectorBytes;  // 28

// Dynamic shared memory (from a 1024-aligned base).
constexpr int kQOffset = 0;
constexpr int kKvOffset = kQOffset + kTileBytes;
constexpr int kRawOffset = kKvOffset + 2 * kKvTileBytes;
constexpr int kEntryOkOffset = kRawOffset + kRawStages * kRawBytes;
constexpr int kValidOffset = kEntryOkOffset + kRawStages * kSub;  // a 32-bit valid-entry mask per tile
constexpr int kIndexSlots = 8;  // ring of sub-blocks' index values (8 bytes per entry) and their set flags
constexpr int kIndexOffset = kValidOffset + 2 * 4 + 8;  // 16-byte aligned
constexpr int kIndexFlagOffset = kIndexOffset + kIndexSlots * kSub * 8;
// P handover, per tile: this thread's P fragments (two 16-byte words), then (alpha0, alpha1, max0, max1), then
// (sum0, sum1), each field thread-major so that the stores and loads are conflict-free.
constexpr int kProbsOffset = kIndexFlagOffset + kIndexSlots * kSub;
constexpr int kProbsSlotBytes = kGroupThreads * (16 + 16 + 16 + 8);
constexpr int kMbarOffset = kProbsOffset + 2 * kProbsSlotBytes;  // raw stage s full at + 8 s, free at + 8 (S + s)
constexpr int kSmemBytes = kMbarOffset + 2 * kRawStages * 8 + kSwizzleAtomBytes;  // + alignment slack
static_assert(kProbsOffset % 16 == 0 && kMbarOffset % 8 == 0, "aligned handover and barriers");
static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one CTA");
static_assert(kRawOffset % 16 == 0 && kRawBytes % 16 == 0, "16-byte staging");

// Byte offset of 16-byte chunk c of row r in a K/V tile of kSub rows (128-byte swizzle, slabs of 64 dims).
DSV4_SM90_DEVICE uint32_t kv_offset(int row, int chunk) {
  return uint32_t((chunk / kSlabChunks) * kKvSlabBytes + row * kRowBytes + (((chunk % kSlabChunks) ^ (row & 7)) * 16));
}


struct RowState {
  float o[kValueTiles][4];
  float max[2];
  float sum[2];
};

// Issues S = Q K^T of one sub-block (asynchronous; finish with wgmma_wait_all). The k16 step inside a 128-byte
// row moves the start address by 32 bytes.
DSV4_SM90_DEVICE void issue_scores(uint32_t q_base, uint32_t kv_base, float (&s)[kScoreTiles][4]) {
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[t][i] = 0.0f;
  // Descriptors hold the address >> 4 in their low bits: a k step adds its offset >> 4 (no carry below 256 KB).
  const uint64_t q_desc = swizzled_descriptor(q_base, 16, kSwizzleAtomBytes);
  const uint64_t k_desc = swizzled_descriptor(kv_base, 16, kSwizzleAtomBytes);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kQkSteps; ++kk) {
    const uint32_t slab = kk / kSlabSteps, step = (kk % kSlabSteps) * 32;
    wgmma_64x32x16_ss(s, q_desc + ((slab * kQSlabBytes + step) >> 4), k_desc + ((slab * kKvSlabBytes + step) >> 4));
  }
  wgmma_commit();
}


// Online softmax of one sub-block: masks invalid entries, raises the running max, rescales O and the sums, and
// returns P as bf16 A fragments (k16 step kk covers entries 16 kk .. +16).
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

DSV4_SM90_DEVICE void softmax_sub(float (&s)[kScoreTiles][4], uint32_t valid, float scale_log2, int lane,
                                  RowState& st, uint32_t (&p)[kPvSteps][4], float (&alpha)[2]) {
  const int quad_col = 2 * (lane & 3);
  float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = (valid >> (8 * t + quad_col + (i & 1))) & 1u;
      s[t][i] = ok ? s[t][i] * scale_log2 : -INFINITY;
      block_max[i / 2] = fmaxf(block_max[i / 2], s[t][i]);
    }
  float offset[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = block_max[r];
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float new_max = fmaxf(st.max[r], m);
    offset[r] = new_max == -INFINITY ? 0.0f : new_max;  // nothing valid yet: every weight is exp2(-inf) = 0
    alpha[r] = st.max[r] == new_max ? 1.0f : fast_exp2(st.max[r] - offset[r]);
    st.max[r] = new_max;
    st.sum[r] *= alpha[r];
    rescale_row(st, r, alpha[r]);
  }
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[t][i] = fast_exp2(s[t][i] - offset[i / 2]);
      st.sum[i / 2] += s[t][i];
    }
#pragma unroll
  for (int kk = 0; kk < kPvSteps; ++kk) {
    p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// O[64 rows, this warpgroup's 256 dims] += P V (V = the K/V tile read N-major: one swizzle atom spans 8 entries of
// 64 dims, so both atom strides are the 1024 bytes to the next 8 entries).
template <int kSlab = 0>
DSV4_SM90_DEVICE void slab_values(uint32_t kv_base, const uint32_t (&p)[kPvSteps][4], int half, RowState& st) {
#pragma unroll
  for (int kk = 0; kk < kPvSteps; ++kk) {
    const uint32_t address = kv_base + uint32_t((kHalfSlabs * half + kSlab) * kKvSlabBytes + kk * 16 * kRowBytes);
    wgmma_64x64x16_rs_tn<8 * kSlab>(st.o, p[kk], swizzled_descriptor(address, kSwizzleAtomBytes, kSwizzleAtomBytes));
  }
  if constexpr (kSlab + 1 < kHalfSlabs) slab_values<kSlab + 1>(kv_base, p, half, st);
}

DSV4_SM90_DEVICE void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
DSV4_SM90_DEVICE void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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

// One piece of this CTA's partition: request r, its blocks [begin_block, begin_block + subs / 2); `skip` marks a
// piece whose split row is out of range (a malformed plan): neither role touches it.
struct Piece {
  int64_t r, begin_block, subs;
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
  c.subs = end > begin ? (end - begin) * kSubsPerBlock : 0;
  const int64_t piece_splits = p.sched.num_splits[r + 1] - p.sched.num_splits[r];
  c.target = {p.sched.num_splits[r] + (r == first ? meta[4] : 0), piece_splits == 1};
  c.skip = !c.target.single && (c.target.split_row < 0 || c.target.split_row >= p.b + p.sched.num_parts);
  if (c.skip) c.subs = 0;
  return c;
}

// Walks the sub-blocks of a partition's pieces in order (pieces without sub-blocks are passed over).
struct SubCursor {
  int64_t r, last, i;
  Piece piece;
  bool done;
};

DSV4_SM90_DEVICE void settle(const SparseMlaDecodeParams& p, const int32_t* meta, SubCursor& c) {
  while (!c.done && c.i >= c.piece.subs) {
    if (++c.r > c.last) {
      c.done = true;
      break;
    }
    c.piece = piece_of(p, meta, c.r), c.i = 0;
  }
}

DSV4_SM90_DEVICE SubCursor first_sub(const SparseMlaDecodeParams& p, const int32_t* meta) {
  SubCursor c;
  const int64_t first = meta[0] < 0 ? 0 : meta[0];
  c.last = meta[1] < p.b ? meta[1] : p.b - 1;
  c.r = first, c.i = 0, c.done = first > c.last;
  if (!c.done) c.piece = piece_of(p, meta, first);
  settle(p, meta, c);
  return c;
}

DSV4_SM90_DEVICE void next_sub(const SparseMlaDecodeParams& p, const int32_t* meta, SubCursor& c) {
  ++c.i;
  settle(p, meta, c);
}

// Index values travel ahead of the gathers through a shared-memory ring: when the gather of sub-block x is issued,
// the index of entry e of sub-block x + kIndexLead is copied (cp.async, in the same group) into ring slot
// (x + kIndexLead) % kIndexSlots with a flag byte saying which set it indexes; the gather of that sub-block waits
// for the group (long complete by then) and reads the slot in the same warp, so no thread stalls on an index load.
constexpr int kIndexLead = 5;
static_assert(kIndexSlots >= kIndexLead + kGatherLead, "a slot is read before it is rewritten");
constexpr uint8_t kFlagExtra = 1, kFlagWide = 2, kFlagNone = 0xff;

DSV4_SM90_DEVICE void issue_index_copy(const SparseMlaDecodeParams& p, const SubCursor& c, int64_t s, int e,
                                       uint8_t* index_slot, uint8_t* flag_slot) {
  uint8_t flag = kFlagNone;
  if (!c.done) {
    const int64_t j = c.piece.begin_block + c.i / kSubsPerBlock;
    const bool in_main = j < c.piece.sets.main_blocks;
    const SparseIndexSet& set = in_main ? p.main : p.extra;
    const int64_t column = (in_main ? j : j - c.piece.sets.main_blocks) * kEntriesPerBlock +
                           int(c.i % kSubsPerBlock) * kSub + e;
    if (column < (in_main ? c.piece.sets.main_length : c.piece.sets.extra_length)) {
      const int64_t at = c.piece.r * set.stride_b + s * set.stride_s + column * set.stride_k;
      const uint32_t dst = shared_address(index_slot + e * 8);
      if (set.is_int64) {
        cp_async_8(dst, static_cast<const int64_t*>(set.indices) + at);
      } else {
        cp_async_4(dst, static_cast<const int32_t*>(set.indices) + at);
      }
      flag = uint8_t((in_main ? 0 : kFlagExtra) | (set.is_int64 ? kFlagWide : 0));
    }
  }
  flag_slot[e] = flag;
}

// Where the bytes of an entry are (nullptr: not attended: no index, negative or outside the cache).
struct EntrySource {
  const uint8_t* data;
  const uint8_t* scales;
};

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
  const uint8_t* page = cache.base + block * cache.block_stride;
  return {page + offset * kEntryDataBytes, page + cache.block_size * kEntryDataBytes + offset * kEntryScaleBytes};
}

// Starts copying the raw bytes of one entry of a sub-block into a staging buffer (kThreadsPerEntry valuer threads
// per entry, 16-byte copies where the page allows); entry_ok[e] records validity. The caller commits the group.
DSV4_SM90_DEVICE void issue_sub_gather(const EntrySource& src, int e, int part, uint8_t* staging, uint8_t* entry_ok) {
  const bool ok = src.data != nullptr;
  if (part == 0) entry_ok[e] = ok;
  if (ok) {
    const uint32_t dst = shared_address(staging + e * kEntryDataBytes);
    if (reinterpret_cast<uintptr_t>(src.data) % kVectorBytes == 0) {
#pragma unroll
      for (int k = 0; k < kItemsPerEntry / kThreadsPerEntry; ++k) {
        const int piece = part + kThreadsPerEntry * k;
        cp_async_16(dst + piece * kVectorBytes, src.data + piece * kVectorBytes);
      }
    } else {
      for (int piece = part; piece < kDataPieces; piece += kThreadsPerEntry)
        cp_async_8(dst + piece * kPieceBytes, src.data + piece * kPieceBytes);
    }
    if (part == kThreadsPerEntry - 1)
      cp_async_8(shared_address(staging + kRawScaleOffset + e * kEntryScaleBytes), src.scales);
  }
}

// Decodes this decoder thread's share of a staged sub-block into a K/V tile: entry e, nope items part + 4k (scale
// tile k) and RoPE chunks 2 part, 2 part + 1 (copied). Invalid entries become zero rows (0 * NaN would poison P V).
// All codes are loaded first and the common case (every item on the direct route) runs straight through. The
// tile's valid mask is written by lane 0 of each decoder warp (8 entries per warp).
DSV4_SM90_DEVICE void decode_sub(const uint8_t* staging, const uint8_t* entry_ok, uint8_t* tile, uint8_t* valid_bytes,
                                 int e, int part) {
  constexpr int kItems = kNopeItems / kThreadsPerEntry;
  const bool ok = entry_ok[e] != 0;
  const uint32_t mask = __ballot_sync(0xffffffffu, ok && part == 0);
  if (threadIdx.x % 32 == 0) {
    uint32_t bits = 0;  // lanes 0, 4, .. 28 hold entries 8w .. 8w + 7
    for (int k = 0; k < 8; ++k) bits |= ((mask >> (4 * k)) & 1u) << k;
    valid_bytes[(threadIdx.x % kGroupThreads) / 32] = uint8_t(bits);
  }
  const uint8_t* raw = staging + e * kEntryDataBytes;
  uint4 codes[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k)
    codes[k] = *reinterpret_cast<const uint4*>(raw + (part + kThreadsPerEntry * k) * kVectorBytes);
  const uint2 scale_words = *reinterpret_cast<const uint2*>(staging + kRawScaleOffset + e * kEntryScaleBytes);
  uint32_t scales[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) scales[k] = ((k < 4 ? scale_words.x : scale_words.y) >> (8 * (k % 4))) & 0xffu;
  bool direct = ok;
#pragma unroll
  for (int k = 0; k < kItems; ++k) direct = direct && decodes_directly(codes[k], scales[k]);
  if (direct) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int item = part + kThreadsPerEntry * k;
      uint4 first, second;
      decode_nope_16_direct(codes[k], scales[k], first, second);
      *reinterpret_cast<uint4*>(tile + kv_offset(e, 2 * item)) = first;
      *reinterpret_cast<uint4*>(tile + kv_offset(e, 2 * item + 1)) = second;
    }
  } else {
    for (int k = 0; k < kItems; ++k) {
      const int item = part + kThreadsPerEntry * k;
      uint4 first = make_uint4(0, 0, 0, 0), second = first;
      if (ok) decode_nope_16(codes[k], uint8_t(scales[k]), first, second);
      *reinterpret_cast<uint4*>(tile + kv_offset(e, 2 * item)) = first;
      *reinterpret_cast<uint4*>(tile + kv_offset(e, 2 * item + 1)) = second;
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int chunk = 2 * part + k;
    const uint4 v = ok ? *reinterpret_cast<const uint4*>(raw + kNopeDim + chunk * kVectorBytes) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(tile + kv_offset(e, kNopeChunks + chunk)) = v;
  }
  fence_async_shared();
}

// Staging buffer s has two mbarriers: full (the valuer's 128 threads arrive once their entry_ok stores are done and
// once more when their copies have landed) and free (the decoder's 128 threads arrive after decoding it).
DSV4_SM90_DEVICE uint32_t raw_full_bar(uint8_t* smem, int stage) { return shared_address(smem + kMbarOffset + 8 * stage); }
DSV4_SM90_DEVICE uint32_t raw_free_bar(uint8_t* smem, int stage) {
  return shared_address(smem + kMbarOffset + 8 * (kRawStages + stage));
}

// Sub-blocks of this CTA's partition (all pieces).
DSV4_SM90_DEVICE int64_t partition_subs(const SparseMlaDecodeParams& p, const int32_t* meta) {
  int64_t total = 0;
  for (SubCursor c = first_sub(p, meta); !c.done; c.i = c.piece.subs, settle(p, meta, c)) total += c.piece.subs;
  return total;
}

// Decoder warpgroup d (0 or 1) takes sub-blocks g = d, d + 2, ..: waits for g's bytes and for its tile (tile d) to be
// empty, decodes, hands the tile to the scorer and the staging buffer back to the gatherer.
DSV4_SM90_DEVICE void decode_role(const SparseMlaDecodeParams& p, const int32_t* meta, int d, uint8_t* smem) {
  const int t = threadIdx.x % kGroupThreads;
  const int e = t / kThreadsPerEntry, part = t % kThreadsPerEntry;
  const int64_t total = partition_subs(p, meta);
  for (int64_t g = d; g < total; g += 2) {
    const int stage = int(g % kRawStages);
    mbarrier_wait(raw_full_bar(smem, stage), uint32_t(g / kRawStages) & 1u);
    if (g >= 2) named_sync(kBarEmpty + d, kEmptyThreads);
    decode_sub(smem + kRawOffset + stage * kRawBytes, smem + kEntryOkOffset + stage * kSub,
               smem + kKvOffset + d * kKvTileBytes, smem + kValidOffset + 4 * d, e, part);
    named_arrive(kBarFull + d, kFullThreads);
    mbarrier_arrive(raw_free_bar(smem, stage));
  }
  if (total > d) named_sync(kBarEmpty + d, kEmptyThreads);  // the scorer and valuer are done with the last tile
}

// The valuer's gathering side: gather(x) copies sub-block x's raw bytes into staging buffer x % kRawStages (once the
// decoder freed it) and the index values of sub-block x + kIndexLead into the index ring. Past the partition's last
// sub-block the index slots are unset, so it copies nothing (and nobody waits for those stages).
struct Gatherer {
  int64_t s;
  uint8_t* smem;
  int e, part;
  SubCursor index_cursor;  // at the sub-block whose indices are copied next

  DSV4_SM90_DEVICE void copy_next_index(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t x) {
    const int slot = int(x % kIndexSlots);
    if (part == 0)
      issue_index_copy(p, index_cursor, s, e, smem + kIndexOffset + slot * kSub * 8,
                       smem + kIndexFlagOffset + slot * kSub);
    next_sub(p, meta, index_cursor);
  }

  DSV4_SM90_DEVICE void start(const SparseMlaDecodeParams& p, const int32_t* meta) {
    index_cursor = first_sub(p, meta);
    for (int x = 0; x < kIndexLead; ++x) copy_next_index(p, meta, x);
    cp_async_commit();
    cp_async_wait_all();
    __syncwarp();  // an entry's index is read by the four lanes of its quad
    for (int x = 0; x < kGatherLead; ++x) gather(p, meta, x);
  }

  DSV4_SM90_DEVICE void gather(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t x) {
    const int stage = int(x % kRawStages), slot = int(x % kIndexSlots);
    if (x >= kRawStages) mbarrier_wait(raw_free_bar(smem, stage), uint32_t(x / kRawStages - 1) & 1u);
    cp_async_wait_group<kIndexLead - 1>();  // the group that carried sub-block x's indices
    __syncwarp();
    const EntrySource src =
        entry_source(p, smem + kIndexOffset + slot * kSub * 8, smem + kIndexFlagOffset + slot * kSub, e);
    issue_sub_gather(src, e, part, smem + kRawOffset + stage * kRawBytes, smem + kEntryOkOffset + stage * kSub);
    copy_next_index(p, meta, x + kIndexLead);
    cp_async_commit();
    mbarrier_arrive(raw_full_bar(smem, stage));
    cp_async_mbarrier_arrive(raw_full_bar(smem, stage));
  }
};

// Finalises this thread's rows with the portable tier's row finishers (one definition of the lse, sink and
// no-valid-entry conventions): a single piece writes out / lse, a split piece its fp32 partial and lse.
DSV4_SM90_DEVICE void finish_rows(const SparseMlaDecodeParams& p, const Piece& piece, int64_t s, int64_t head0,
                                  int row_group, int half, int lane, RowState& st) {
  const PieceTarget& target = piece.target;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = st.sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int64_t head = head0 + 16 * row_group + (lane >> 2) + 8 * r;
    if (head >= p.h_q) continue;
    const float max = st.max[r] * kLn2;  // the running max is kept in the log2 domain
    const mla::RowFinish f =
        target.single ? mla::finish_output_row(max, sum, p.attn_sink, head) : mla::finish_partial_row(max, sum);
    const int64_t dim0 = int64_t(kHalfDim) * half + 2 * (lane & 3);
    const bool writes_lse = half == 0 && (lane & 3) == 0;
    if (target.single) {
      uint16_t* out = p.out + ((piece.r * p.s_q + s) * p.h_q + head) * kDim + dim0;
#pragma unroll
      for (int t = 0; t < kValueTiles; ++t)
        *reinterpret_cast<uint32_t*>(out + 8 * t) =
            pack_bf16x2(st.o[t][2 * r] * f.out_scale, st.o[t][2 * r + 1] * f.out_scale);
      if (writes_lse) p.lse[(piece.r * p.h_q + head) * p.s_q + s] = f.lse;
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

// One 16-byte chunk of q row `head` (zero past h_q; element loads where q rows are not 16-byte aligned).
DSV4_SM90_DEVICE uint4 load_q_chunk(const SparseMlaDecodeParams& p, const uint16_t* q, int64_t head, int chunk,
                                   bool q_aligned) {
  if (head >= p.h_q) return make_uint4(0, 0, 0, 0);
  const uint16_t* src = q + head * p.q_stride_h + chunk * kChunkElems;
  if (q_aligned) return __ldg(reinterpret_cast<const uint4*>(src));
  uint16_t x[kChunkElems];
  for (int i = 0; i < kChunkElems; ++i) x[i] = __ldg(src + i);
  return make_uint4(x[0] | uint32_t(x[1]) << 16, x[2] | uint32_t(x[3]) << 16, x[4] | uint32_t(x[5]) << 16,
                    x[6] | uint32_t(x[7]) << 16);
}

// Starts copying the q rows of heads [head0, head0 + 64) of query (b, s) into the tile (cp.async where q rows are
// 16-byte aligned, plain loads otherwise; heads past h_q are zero); wait_q finishes it.
DSV4_SM90_DEVICE void start_q(const SparseMlaDecodeParams& p, int64_t b, int64_t s, int64_t head0, bool q_aligned,
                              uint8_t* tile) {
  constexpr int kPerThread = kHeadsPerCta * kChunksPerRow / kGroupThreads;
  const uint16_t* q = p.q + b * p.q_stride_b + s * p.q_stride_s;
#pragma unroll 4
  for (int k = 0; k < kPerThread; ++k) {
    const int u = threadIdx.x + k * kGroupThreads, row = u / kChunksPerRow, chunk = u % kChunksPerRow;
    uint8_t* dst = tile + tile_offset(row, chunk);
    if (q_aligned && head0 + row < p.h_q) {
      cp_async_16(shared_address(dst), q + (head0 + row) * p.q_stride_h + chunk * kChunkElems);
    } else {
      *reinterpret_cast<uint4*>(dst) = load_q_chunk(p, q, head0 + row, chunk, q_aligned);
    }
  }
  cp_async_commit();
}

DSV4_SM90_DEVICE void wait_q() {
  cp_async_wait_all();
  fence_async_shared();  // the copies and stores, visible to wgmma
  named_sync(kBarScorer, kGroupThreads);
}

DSV4_SM90_DEVICE void clear_rows(RowState& st) {
#pragma unroll
  for (int t = 0; t < kValueTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) st.o[t][i] = 0.0f;
  st.max[0] = st.max[1] = -INFINITY;
  st.sum[0] = st.sum[1] = 0.0f;
}

// The P handover of tile t (see kProbsSlotBytes); thread t of the scorer writes what thread t of the valuer reads
// (both hold the same rows and columns of the fragments).
struct ProbsSlot {
  uint4* p0;
  uint4* p1;
  float4* scale_max;
  float2* sums;
};

DSV4_SM90_DEVICE ProbsSlot probs_slot(uint8_t* smem, int tile) {
  uint8_t* base = smem + kProbsOffset + tile * kProbsSlotBytes;
  return {reinterpret_cast<uint4*>(base), reinterpret_cast<uint4*>(base + 16 * kGroupThreads),
          reinterpret_cast<float4*>(base + 32 * kGroupThreads), reinterpret_cast<float2*>(base + 48 * kGroupThreads)};
}

// Scorer warpgroup: per piece loads q; per sub-block S, the softmax, the P handover and O += P V for dims 0-255.
DSV4_SM90_DEVICE void score_role(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t s, bool q_aligned,
                                 uint8_t* smem) {
  uint8_t* q_tile = smem + kQOffset;
  const uint32_t q_base = shared_address(q_tile), kv_base = shared_address(smem + kKvOffset);
  const uint32_t* valid = reinterpret_cast<const uint32_t*>(smem + kValidOffset);
  const int t = threadIdx.x, row_group = t / 32, lane = t % 32;
  const int64_t head0 = int64_t(blockIdx.x) * kHeadsPerCta;
  const float scale_log2 = p.sm_scale * kLog2e;
  const int64_t first = meta[0] < 0 ? 0 : meta[0], last = meta[1] < p.b ? meta[1] : p.b - 1;
  int64_t g = 0, q_request = first;  // q_request: the request whose q is in (or on its way to) the tile
  if (first <= last) start_q(p, first, s, head0, q_aligned, q_tile);
  for (int64_t r = first; r <= last; ++r) {
    const Piece piece = piece_of(p, meta, r);
    if (piece.skip) continue;
    if (q_request != r) {
      cp_async_wait_all();  // a copy for a passed-over request may still be in flight
      named_sync(kBarScorer, kGroupThreads);  // every scorer warp is done with the previous q
      start_q(p, r, s, head0, q_aligned, q_tile);
      q_request = r;
    }
    wait_q();
    RowState st;
    clear_rows(st);
    for (int64_t i = 0; i < piece.subs; ++i, ++g) {
      const int tile = int(g % 2);
      const uint32_t kv_tile = kv_base + tile * kKvTileBytes;
      named_sync(kBarFull + tile, kFullThreads);
      float scores[kScoreTiles][4];
      issue_scores(q_base, kv_tile, scores);
      wgmma_wait_all();
      if (i + 1 == piece.subs && r < last) {  // the next request's q loads under this sub-block's softmax and P V
        named_sync(kBarScorer, kGroupThreads);
        start_q(p, r + 1, s, head0, q_aligned, q_tile);
        q_request = r + 1;
      }
      uint32_t probs[kPvSteps][4];
      float alpha[2];
      softmax_sub(scores, valid[tile], scale_log2, lane, st, probs, alpha);
      const ProbsSlot slot = probs_slot(smem, tile);
      slot.p0[t] = make_uint4(probs[0][0], probs[0][1], probs[0][2], probs[0][3]);
      slot.p1[t] = make_uint4(probs[1][0], probs[1][1], probs[1][2], probs[1][3]);
      slot.scale_max[t] = make_float4(alpha[0], alpha[1], st.max[0], st.max[1]);
      slot.sums[t] = make_float2(st.sum[0], st.sum[1]);
      named_arrive(kBarProbs + tile, kProbsThreads);
      wgmma_fence();
      slab_values(kv_tile, probs, 0, st);
      wgmma_commit();
      wgmma_wait_all();
      named_arrive(kBarEmpty + tile, kEmptyThreads);
    }
    finish_rows(p, piece, s, head0, row_group, 0, lane, st);
  }
}

// Valuer warpgroup: keeps the gathers kGatherLead sub-blocks ahead; per sub-block takes P and the rescale factors
// from the scorer and runs O += P V for dims 256-511.
DSV4_SM90_DEVICE void value_role(const SparseMlaDecodeParams& p, const int32_t* meta, int64_t s, uint8_t* smem) {
  const uint32_t kv_base = shared_address(smem + kKvOffset);
  const int t = threadIdx.x % kGroupThreads, row_group = t / 32, lane = t % 32;
  const int64_t head0 = int64_t(blockIdx.x) * kHeadsPerCta;
  Gatherer gatherer{s, smem, t / kThreadsPerEntry, t % kThreadsPerEntry, {}};
  gatherer.start(p, meta);
  const int64_t first = meta[0] < 0 ? 0 : meta[0], last = meta[1] < p.b ? meta[1] : p.b - 1;
  int64_t g = 0;
  for (int64_t r = first; r <= last; ++r) {
    const Piece piece = piece_of(p, meta, r);
    if (piece.skip) continue;
    RowState st;
    clear_rows(st);
    for (int64_t i = 0; i < piece.subs; ++i, ++g) {
      gatherer.gather(p, meta, g + kGatherLead);
      const int tile = int(g % 2);
      named_sync(kBarProbs + tile, kProbsThreads);
      const ProbsSlot slot = probs_slot(smem, tile);
      const uint4 p0 = slot.p0[t], p1 = slot.p1[t];
      const float4 scale_max = slot.scale_max[t];
      const float2 sums = slot.sums[t];
      const uint32_t probs[kPvSteps][4] = {{p0.x, p0.y, p0.z, p0.w}, {p1.x, p1.y, p1.z, p1.w}};
      st.max[0] = scale_max.z, st.max[1] = scale_max.w;
      st.sum[0] = sums.x, st.sum[1] = sums.y;
      rescale_row(st, 0, scale_max.x);
      rescale_row(st, 1, scale_max.y);
      wgmma_fence();
      slab_values(kv_base + tile * kKvTileBytes, probs, 1, st);
      wgmma_commit();
      wgmma_wait_all();
      named_arrive(kBarEmpty + tile, kEmptyThreads);
    }
    finish_rows(p, piece, s, head0, row_group, 1, lane, st);
  }
  cp_async_wait_all();  // index copies past the last sub-block
}

// Grid (head groups, s_q, num_parts): CTA (x, s, z) attends heads [64x, 64x + 64) of query s of every request
// piece in schedule partition z. Warpgroup 0 scores, 1 values and gathers, 2 and 3 decode.
__global__ void __launch_bounds__(kCtaThreads, 1)
    sparse_mla_decode_sm90_kernel(const SparseMlaDecodeParams p, bool q_aligned) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((kSwizzleAtomBytes - shared_address(smem_raw) % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  const int32_t* meta = p.sched.sched_meta + int64_t(blockIdx.z) * kDecodeSchedWords;
  if (threadIdx.x < kRawStages) {
    mbarrier_init(raw_full_bar(smem, threadIdx.x), 2 * kGroupThreads);
    mbarrier_init(raw_free_bar(smem, threadIdx.x), kGroupThreads);
  }
  __syncthreads();
  const int role = threadIdx.x / kGroupThreads;
  if (role >= kDecoder) {
    lower_registers<kDecoderRegs>();
    decode_role(p, meta, role - kDecoder, smem);
  } else if (role == kScorer) {
    raise_registers<kScorerRegs>();
    score_role(p, meta, blockIdx.y, q_aligned, smem);
  } else {
    raise_registers<kValuerRegs>();
    value_role(p, meta, blockIdx.y, smem);
  }
}

constexpr int64_t kMaxGridYZ = 65535;
constexpr uintptr_t kPieceAlign = kPieceBytes, kVectorAlign = 16;

bool cache_is_aligned(const SparseIndexSet& set) {
  if (set.indices == nullptr) return true;
  return (reinterpret_cast<uintptr_t>(set.cache.base) | uintptr_t(set.cache.block_stride)) % kPieceAlign == 0;
}

bool covered(const SparseMlaDecodeParams& p) {
  return p.layout == KvLayout::model1 && p.d_qk == kDim && p.d_v == kDim && p.s_q <= kMaxGridYZ &&
         p.sched.num_parts >= 1 && p.sched.num_parts <= kMaxGridYZ && cache_is_aligned(p.main) &&
         cache_is_aligned(p.extra);
}

}  // namespace
}  // namespace dsv4::cuda::sm90

namespace dsv4::cuda {

cudaError_t launch_sparse_mla_decode_sm90(const SparseMlaDecodeParams& p, cudaStream_t stream) {
  using namespace sm90;
  if (!covered(p)) return launch_sparse_mla_decode(p, stream);
  if (p.b == 0 || p.s_q == 0 || p.h_q == 0) return cudaSuccess;
  if (p.sched.plan) {
    const cudaError_t planned = launch_decode_schedule(p, stream);
    if (planned != cudaSuccess) return planned;
  }
  const cudaError_t attr = cudaFuncSetAttribute(sparse_mla_decode_sm90_kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const uintptr_t q_bits = reinterpret_cast<uintptr_t>(p.q) | uintptr_t(p.q_stride_b * 2) |
                           uintptr_t(p.q_stride_s * 2) | uintptr_t(p.q_stride_h * 2);
  const dim3 grid(unsigned((p.h_q + kHeadsPerCta - 1) / kHeadsPerCta), unsigned(p.s_q), unsigned(p.sched.num_parts));
  sparse_mla_decode_sm90_kernel<<<grid, kCtaThreads, kSmemBytes, stream>>>(p, q_bits % kVectorAlign == 0);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  return launch_decode_combine(p, stream);
}

}  // namespace dsv4::cuda

