// Portable sparse MLA decode over paged MODEL1 / V32 / V4.1 caches, each index set in its own record (FlashMLA
// semantics): plans the split (unless the caller gave a plan), attends, then merges split pieces (combine.cu).
// Grid (head groups, s_q, partitions): a CTA walks its partition's pieces (sched_meta row), each a range of a
// request's 64-entry blocks for query s, and writes the final row of a request with one piece or an fp32 partial at
// its split row otherwise.
#include "cuda/launchers.h"
#include "cuda/portable/sparse_mla/cta.cuh"

namespace dsv4::cuda {
namespace {

using mla::kCtaThreads;
using mla::kHeadsPerCta;
using mla::kTileEntries;

constexpr int64_t kMaxGridDim = 65535;  // grid.y and grid.z; larger counts loop

__global__ void __launch_bounds__(kCtaThreads) sparse_mla_decode_kernel(SparseMlaDecodeParams p) {
  extern __shared__ uint4 shared_words[];
  mla::CtaShared& sm = *reinterpret_cast<mla::CtaShared*>(shared_words);
  mla::CtaState st;
  const int t = threadIdx.x;
  const int64_t head0 = int64_t(blockIdx.x) * kHeadsPerCta;
  const int heads = int(p.h_q - head0 < kHeadsPerCta ? p.h_q - head0 : kHeadsPerCta);
  const int words = int(p.d_qk / 2);
  for (int64_t part = blockIdx.z; part < p.sched.num_parts; part += gridDim.z) {
    const mla::PartitionRange range = mla::partition_range(p, part);
    for (int64_t s = blockIdx.y; s < p.s_q; s += gridDim.y) {
      for (int64_t r = range.begin_req; r <= range.end_req; ++r) {
        const mla::DecodePiece piece = mla::request_piece(p, range, r);
        if (!piece.valid) continue;
        mla::begin_query(sm, st, p.q + r * p.q_stride_b + s * p.q_stride_s + head0 * p.q_stride_h, p.q_stride_h,
                         heads, words);
        for (int64_t block = piece.block_begin; block < piece.block_end; ++block) {
          const mla::BlockColumns cols = mla::block_columns(p, r, block);
          const SparseIndexSet& set = cols.extra ? p.extra : p.main;
          const mla::CacheEntrySource src{set, set.layout, r, s};
          for (int64_t tile = 0; tile < cols.count; tile += kTileEntries) {
            const int64_t count = cols.count - tile < kTileEntries ? cols.count - tile : kTileEntries;
            mla::attend_tile(sm, st, src, cols.first + tile, int(count), words, p.sm_scale);
          }
        }
        mla::end_query(sm, st);
#pragma unroll  // constant indices keep st.acc in registers
        for (int h = 0; h < kHeadsPerCta; ++h) {
          if (h >= heads) break;
          const int64_t head = head0 + h;
          if (piece.direct) {
            const mla::RowFinish f = mla::finish_output_row(sm.row_max[h], sm.row_sum[h], p.attn_sink, head);
            mla::store_output_dims(st, h, f.out_scale, p.out + ((r * p.s_q + s) * p.h_q + head) * mla::kValueDim);
            if (t == h) p.lse[(r * p.h_q + head) * p.s_q + s] = f.lse;
          } else {
            const mla::RowFinish f = mla::finish_partial_row(sm.row_max[h], sm.row_sum[h]);
            const int64_t row = mla::accum_row(p, piece.split_row, s, head);
            mla::store_partial_dims(st, h, f.out_scale, p.sched.o_accum + row * mla::kValueDim);
            if (t == h) p.sched.lse_accum[row] = f.lse;
          }
        }
      }
    }
  }
}

}  // namespace

cudaError_t launch_sparse_mla_decode(const SparseMlaDecodeParams& p, cudaStream_t stream) {
  if (p.b == 0 || p.s_q == 0 || p.h_q == 0) return cudaSuccess;
  if (p.sched.plan) {
    const cudaError_t planned = launch_sparse_mla_decode_schedule(p, stream);
    if (planned != cudaSuccess) return planned;
  }
  constexpr int kSharedBytes = int(sizeof(mla::CtaShared));
  const cudaError_t sized = cudaFuncSetAttribute(reinterpret_cast<const void*>(&sparse_mla_decode_kernel),
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (sized != cudaSuccess) return sized;
  const dim3 grid(unsigned(ceil_div(p.h_q, kHeadsPerCta)), unsigned(p.s_q < kMaxGridDim ? p.s_q : kMaxGridDim),
                  unsigned(p.sched.num_parts < kMaxGridDim ? p.sched.num_parts : kMaxGridDim));
  sparse_mla_decode_kernel<<<grid, kCtaThreads, kSharedBytes, stream>>>(p);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  return launch_decode_combine(p, stream);
}

}  // namespace dsv4::cuda
