// Portable sparse MLA prefill over bf16 kv rows: one CTA per (query token, head group) attends the token's top-k
// rows (indices outside [0, s_kv) and columns at or past topk_length are skipped), writing out, lse and
// max_logits (the largest scaled score: -inf, with lse +inf and out 0, when nothing is attended).
#include "cuda/launchers.h"
#include "cuda/portable/sparse_mla/cta.cuh"

namespace dsv4::cuda {
namespace {

using mla::kCtaThreads;
using mla::kHeadsPerCta;
using mla::kTileEntries;

constexpr int64_t kMaxGridDim = 65535;  // grid.y; more tokens loop

__global__ void __launch_bounds__(kCtaThreads) sparse_mla_prefill_kernel(SparseMlaPrefillParams p) {
  extern __shared__ uint4 shared_words[];
  mla::CtaShared& sm = *reinterpret_cast<mla::CtaShared*>(shared_words);
  mla::CtaState st;
  const int t = threadIdx.x;
  const int64_t head0 = int64_t(blockIdx.x) * kHeadsPerCta;
  const int heads = int(p.h_q - head0 < kHeadsPerCta ? p.h_q - head0 : kHeadsPerCta);
  const int words = int(p.d_qk / 2);
  for (int64_t s = blockIdx.y; s < p.s_q; s += gridDim.y) {
    int64_t columns = p.topk;
    if (p.topk_length.data != nullptr) {
      const int64_t length = index_at(p.topk_length, s);
      columns = length < 0 ? 0 : (length < p.topk ? length : p.topk);
    }
    const mla::Bf16RowSource src{p.kv, p.s_kv, p.kv_stride, p.indices, p.is_int64, s * p.idx_stride_s, p.idx_stride_k};
    mla::begin_query(sm, st, p.q + s * p.q_stride_s + head0 * p.q_stride_h, p.q_stride_h, heads, words);
    for (int64_t c = 0; c < columns; c += kTileEntries)
      mla::attend_tile(sm, st, src, c, int(columns - c < kTileEntries ? columns - c : kTileEntries), words,
                       p.sm_scale);
    mla::end_query(sm, st);
#pragma unroll  // constant indices keep st.acc in registers
    for (int h = 0; h < kHeadsPerCta; ++h) {
      if (h >= heads) break;
      const int64_t head = head0 + h, row = s * p.h_q + head;
      const mla::RowFinish f = mla::finish_output_row(sm.row_max[h], sm.row_sum[h], p.attn_sink, head);
      mla::store_output_dims(st, h, f.out_scale, p.out + row * mla::kValueDim);
      if (t == h) p.lse[row] = f.lse, p.max_logits[row] = f.max_logit;
    }
  }
}

}  // namespace

cudaError_t launch_sparse_mla_prefill(const SparseMlaPrefillParams& p, cudaStream_t stream) {
  if (p.s_q == 0 || p.h_q == 0) return cudaSuccess;
  constexpr int kSharedBytes = int(sizeof(mla::CtaShared));
  const cudaError_t sized = cudaFuncSetAttribute(reinterpret_cast<const void*>(&sparse_mla_prefill_kernel),
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (sized != cudaSuccess) return sized;
  const dim3 grid(unsigned(ceil_div(p.h_q, kHeadsPerCta)), unsigned(p.s_q < kMaxGridDim ? p.s_q : kMaxGridDim));
  sparse_mla_prefill_kernel<<<grid, kCtaThreads, kSharedBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
