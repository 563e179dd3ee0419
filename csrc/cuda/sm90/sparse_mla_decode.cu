// Hopper tier of the MODEL1 sparse decode: a CTA of two warpgroups attends 64 heads of one query over the 64-entry
// blocks of its schedule partition. Per block the entries' raw bytes arrive by cp.async while the two blocks
// before it are attended (two raw stages), are decoded to a bf16 K/V tile, then S = Q K^T and O += P V run on
// wgmma (bf16, fp32 accum). Both warpgroups form the same full S (bit-identical, nothing to exchange);
// warpgroup h owns output dims 256h .. +256, warp w heads 16 * (w % 4) .. +16.
#include <cmath>

#include "common/decode_schedule.h"
#include "cuda/launchers.h"
#include "cuda/sm90/decode_tiles.cuh"
#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace dsv4::cuda::sm90 {
namespace {

constexpr int kRowGroups = kHeadsPerCta / 16;  // warps sharing one dim half
constexpr int kHalfDim = kDim / 2;
constexpr int kScoreTiles = kEntriesPerBlock / 8;  // n8 tiles of S per warp
constexpr int kValueTiles = kHalfDim / 8;  // n8 tiles of O per warp
constexpr int kHalfSlabs = kHalfDim / (kSlabChunks * kChunkElems);  // 64-column slabs of a half of d_qk / d_v
constexpr int kSlabSteps = kSlabChunks * kChunkElems / 16;  // k16 steps per slab
constexpr int kPvSteps = kEntriesPerBlock / 16;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Dynamic shared memory (from a 1024-aligned base): q tile, K/V tile, two raw stages, their entry flags, valid.
constexpr int kStages = 2;
constexpr int kQOffset = 0;
constexpr int kKvOffset = kQOffset + kTileBytes;
constexpr int kStagingOffset = kKvOffset + kTileBytes;
constexpr int kEntryOkOffset = kStagingOffset + kStages * kStagingBytes;
constexpr int kValidOffset = kEntryOkOffset + kStages * kEntriesPerBlock;
constexpr int kSmemBytes = kValidOffset + kEntriesPerBlock + kSwizzleAtomBytes;  // + alignment slack

// One thread's share of its warp's 16 rows: fp32 O fragments (rows g and g + 8 of each n8 tile), the running
// max in the log2 domain of the scaled logits, and this thread's partial sum of exp2(x - max).
struct RowState {
  float o[kValueTiles][4];
  float max[2];
  float sum[2];
};

// s = Q K^T: a 64 x 64 wgmma per k16 step, K-major Q and K tiles (the k16 step inside a 128-byte row moves the
// start address by 32 bytes).
DSV4_SM90_DEVICE void block_scores(uint32_t q_base, uint32_t kv_base, float (&s)[kScoreTiles][4]) {
  for (int t = 0; t < kScoreTiles; ++t)
    for (int i = 0; i < 4; ++i) s[t][i] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 2 * kHalfSlabs * kSlabSteps; ++kk) {
    const uint32_t offset = uint32_t((kk / kSlabSteps) * kSlabBytes + (kk % kSlabSteps) * 32);
    wgmma_64x64x16_ss(s, swizzled_descriptor(q_base + offset, 16, kSwizzleAtomBytes),
                      swizzled_descriptor(kv_base + offset, 16, kSwizzleAtomBytes));
  }
  wgmma_commit();
  wgmma_wait_all();
}

// Online softmax of one block: masks invalid entries, raises the running max, rescales O and the sums, and
// returns P as bf16 A fragments (k16 step kk covers entries 16 kk .. +16).
DSV4_SM90_DEVICE void softmax_block(float (&s)[kScoreTiles][4], const uint8_t* valid, float scale_log2, int lane,
                                    RowState& st, uint32_t (&p)[kPvSteps][4]) {
  const int quad_col = 2 * (lane & 3);
  float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = valid[8 * t + quad_col + (i & 1)] != 0;
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
    const float alpha = exp2f(st.max[r] - offset[r]);
    st.max[r] = new_max;
    st.sum[r] *= alpha;
#pragma unroll
    for (int t = 0; t < kValueTiles; ++t) st.o[t][2 * r] *= alpha, st.o[t][2 * r + 1] *= alpha;
  }
#pragma unroll
  for (int t = 0; t < kScoreTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[t][i] = exp2f(s[t][i] - offset[i / 2]);
      st.sum[i / 2] += s[t][i];
    }
  // Accumulator tile 2kk (+1) holds columns 0-7 (8-15) of A step kk: rows g in regs 0-1, g + 8 in regs 2-3.
#pragma unroll
  for (int kk = 0; kk < kPvSteps; ++kk) {
    p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// O[64 rows, this warpgroup's 256 dims] += P V: per k16 step of entries and 64-dim slab a 64 x 64 wgmma with P
// from registers and V = the K/V tile read N-major (one swizzle atom spans 8 entries of 64 dims, so both atom
// strides are the 1024 bytes to the next 8 entries; the slab stride is never needed for n = 64).
template <int kSlab = 0>
DSV4_SM90_DEVICE void slab_values(uint32_t kv_base, const uint32_t (&p)[kPvSteps][4], int half, RowState& st) {
#pragma unroll
  for (int kk = 0; kk < kPvSteps; ++kk) {
    const uint32_t address = kv_base + uint32_t((kHalfSlabs * half + kSlab) * kSlabBytes + kk * 16 * kRowBytes);
    wgmma_64x64x16_rs_tn<8 * kSlab>(st.o, p[kk], swizzled_descriptor(address, kSwizzleAtomBytes, kSwizzleAtomBytes));
  }
  if constexpr (kSlab + 1 < kHalfSlabs) slab_values<kSlab + 1>(kv_base, p, half, st);
}

DSV4_SM90_DEVICE void accumulate_values(uint32_t kv_base, const uint32_t (&p)[kPvSteps][4], int half,
                                        RowState& st) {
  wgmma_fence();
  slab_values(kv_base, p, half, st);
  wgmma_commit();
  wgmma_wait_all();
}

// Where one piece's rows go: the output (single-piece request) or split row `split_row` of the partials.
struct PieceTarget {
  int64_t r, s, split_row;
  bool single;
};

// Single-piece output rows are staged in shared memory (over the K/V tile and the stages, free by then) and
// stored as whole 16-byte vectors; the row pitch is padded by 16 bytes so the fragment stores spread over banks.
constexpr int kOutPitch = kDim * 2 + 16;
static_assert(kHeadsPerCta * kOutPitch <= kEntryOkOffset - kKvOffset, "output staging fits");

// Copies the staged bf16 rows of heads head0 .. of query row `row` to out (rows past h_q were not staged).
DSV4_SM90_DEVICE void store_out_rows(const SparseMlaDecodeParams& p, const uint8_t* staged, int64_t row,
                                     int64_t head0) {
  constexpr int kVectorsPerRow = kDim * 2 / 16;
  const int64_t heads = p.h_q - head0 < kHeadsPerCta ? p.h_q - head0 : kHeadsPerCta;
  for (int u = threadIdx.x; u < heads * kVectorsPerRow; u += kThreads) {
    const int h = u / kVectorsPerRow, v = u % kVectorsPerRow;
    *reinterpret_cast<uint4*>(p.out + (row * p.h_q + head0 + h) * kDim + v * 8) =
        *reinterpret_cast<const uint4*>(staged + h * kOutPitch + v * 16);
  }
}

// Finalises this thread's rows: o / sum and the natural-log lse; a single piece applies the sink and writes
// out / lse (no valid entry: zeros and +inf), a split piece writes its fp32 partial (no valid entry: zeros, -inf).
DSV4_SM90_DEVICE void finish_rows(const SparseMlaDecodeParams& p, const PieceTarget& target, int64_t head0,
                                  int row_group, int half, int lane, RowState& st, uint8_t* out_staging) {
  if (target.single) __syncthreads();  // both warpgroups are done reading the K/V tile

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = st.sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int64_t head = head0 + 16 * row_group + (lane >> 2) + 8 * r;
    if (head >= p.h_q) continue;
    const bool any = sum > 0.0f;
    const float lse = any ? st.max[r] * kLn2 + logf(sum) : (target.single ? INFINITY : -INFINITY);
    float factor = any ? 1.0f / sum : 0.0f;
    if (target.single && any && p.attn_sink != nullptr) factor *= 1.0f / (1.0f + expf(p.attn_sink[head] - lse));
    const int64_t row = (target.single ? target.r : target.split_row) * p.s_q + target.s;
    const int64_t dim0 = int64_t(kHalfDim) * half + 2 * (lane & 3);
    if (target.single) {
      uint8_t* out = out_staging + (head - head0) * kOutPitch + dim0 * 2;
#pragma unroll
      for (int t = 0; t < kValueTiles; ++t)
        *reinterpret_cast<uint32_t*>(out + 16 * t) = pack_bf16x2(st.o[t][2 * r] * factor, st.o[t][2 * r + 1] * factor);
      if (half == 0 && (lane & 3) == 0) p.lse[(target.r * p.h_q + head) * p.s_q + target.s] = lse;
    } else {
      float* out = p.sched.o_accum + (row * p.h_q + head) * kDim + dim0;
#pragma unroll
      for (int t = 0; t < kValueTiles; ++t)
        *reinterpret_cast<float2*>(out + 8 * t) = make_float2(st.o[t][2 * r] * factor, st.o[t][2 * r + 1] * factor);
      if (half == 0 && (lane & 3) == 0) p.sched.lse_accum[row * p.h_q + head] = lse;
    }
  }
  if (target.single) {
    __syncthreads();  // every row staged
    store_out_rows(p, out_staging, target.r * p.s_q + target.s, head0);
  }
}

// Grid (head groups, s_q, num_parts): CTA (x, s, z) attends heads [64x, 64x + 64) of query s of every request
// piece in schedule partition z.
__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_decode_sm90_kernel(const SparseMlaDecodeParams p, bool q_aligned) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((kSwizzleAtomBytes - shared_address(smem_raw) % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  uint8_t* q_tile = smem + kQOffset;
  uint8_t* kv_tile = smem + kKvOffset;
  uint8_t* staging = smem + kStagingOffset;
  uint8_t* entry_ok = smem + kEntryOkOffset;
  uint8_t* valid = smem + kValidOffset;
  const uint32_t q_base = shared_address(q_tile), kv_base = shared_address(kv_tile);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_group = warp % kRowGroups, half = warp / kRowGroups;
  const int64_t head0 = int64_t(blockIdx.x) * kHeadsPerCta, s = blockIdx.y;
  const float scale_log2 = p.sm_scale * kLog2e;
  const int32_t* meta = p.sched.sched_meta + int64_t(blockIdx.z) * kDecodeSchedWords;
  const int64_t first = meta[0], last = meta[1];
  const int64_t split_rows = p.b + p.sched.num_parts;
  for (int64_t r = first < 0 ? 0 : first; r <= last && r < p.b; ++r) {
    const RequestSets sets = request_sets(p, r);
    int64_t begin = r == first ? meta[2] : 0, end = r == last ? meta[3] : sets.blocks;
    begin = begin < 0 ? 0 : begin;
    end = end > sets.blocks ? sets.blocks : end;
    const int64_t piece_splits = p.sched.num_splits[r + 1] - p.sched.num_splits[r];
    const PieceTarget target{r, s, p.sched.num_splits[r] + (r == first ? meta[4] : 0), piece_splits == 1};
    if (!target.single && (target.split_row < 0 || target.split_row >= split_rows)) continue;

    cp_async_wait_all();  // a piece without blocks left its q copies in flight
    __syncthreads();  // the previous piece is done with the q and K/V tiles
    load_q_tile(p, r, s, head0, q_aligned, q_tile);
    RowState st;
    for (int t = 0; t < kValueTiles; ++t)
      for (int i = 0; i < 4; ++i) st.o[t][i] = 0.0f;
    st.max[0] = st.max[1] = -INFINITY;
    st.sum[0] = st.sum[1] = 0.0f;
    const int entry = threadIdx.x / kThreadsPerEntry;
    for (int64_t j = begin; j < end && j < begin + kStages; ++j)
      issue_block_gather(p, sets, j, block_index(p, sets, r, s, j, entry), staging + (j % kStages) * kStagingBytes,
                         entry_ok + (j % kStages) * kEntriesPerBlock);
    // Index values are loaded a block before their gather is issued, so the issue never waits on them.
    int64_t next_index = begin + kStages < end ? block_index(p, sets, r, s, begin + kStages, entry) : -1;
    for (int64_t j = begin; j < end; ++j) {
      const int stage = int(j % kStages);
      if (j + 1 < end)
        cp_async_wait_one();  // block j (and the q tile) landed; block j + 1 may still be in flight
      else
        cp_async_wait_all();
      __syncthreads();  // every warp is done with block j - 1's tile
      decode_staged_block(staging + stage * kStagingBytes, entry_ok + stage * kEntriesPerBlock, kv_tile, valid);
      __syncthreads();  // tile ready; this stage is free for block j + 2
      if (j + kStages < end) {
        issue_block_gather(p, sets, j + kStages, next_index, staging + stage * kStagingBytes,
                           entry_ok + stage * kEntriesPerBlock);
        if (j + kStages + 1 < end) next_index = block_index(p, sets, r, s, j + kStages + 1, entry);
      }
      float scores[kScoreTiles][4];
      block_scores(q_base, kv_base, scores);
      uint32_t probs[kPvSteps][4];
      softmax_block(scores, valid, scale_log2, lane, st, probs);
      accumulate_values(kv_base, probs, half, st);
    }
    finish_rows(p, target, head0, row_group, half, lane, st, kv_tile);
  }
  cp_async_wait_all();  // a last piece without blocks must not leave its q copies in flight at exit
}

constexpr int64_t kMaxGridYZ = 65535;
constexpr uintptr_t kPieceAlign = kPieceBytes, kVectorAlign = 16;

bool cache_is_aligned(const SparseIndexSet& set) {
  if (set.indices == nullptr) return true;
  return (reinterpret_cast<uintptr_t>(set.cache.base) | uintptr_t(set.cache.block_stride)) % kPieceAlign == 0;
}

// What this kernel covers: MODEL1 (d_qk = d_v = 512), 8-byte aligned pages, grid dims within limits.
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
  const cudaError_t attr =
      cudaFuncSetAttribute(sparse_mla_decode_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const uintptr_t q_bits = reinterpret_cast<uintptr_t>(p.q) | uintptr_t(p.q_stride_b * 2) |
                           uintptr_t(p.q_stride_s * 2) | uintptr_t(p.q_stride_h * 2);
  const dim3 grid(unsigned((p.h_q + kHeadsPerCta - 1) / kHeadsPerCta), unsigned(p.s_q), unsigned(p.sched.num_parts));
  sparse_mla_decode_sm90_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, q_bits % kVectorAlign == 0);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  return launch_decode_combine(p, stream);
}

}  // namespace dsv4::cuda
