// Lightning-indexer scores, Hopper tier: fp8_paged_mqa_logits and the scoring half of the fused
// fp8_paged_mqa_topk. A warpgroup scores 64 keys per step against every (query row, head) column of a request with
// f16 wgmma: e4m3 -> f16 is exact and so are the products; the sums are fp32. Keys go from global memory straight
// into the A fragments, their dims permuted so that a thread's share of a key is 32 contiguous bytes (q is stored
// in the same order); the next tile's loads are in flight under this tile's MMA. The epilogue sums w[h] * relu(dot)
// over a thread's heads, then across its quad, and multiplies by the key's fp32 scale.
#include <algorithm>

#include "cuda/launchers.h"
#include "cuda/portable/mqa_score.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace dsv4::cuda::sm90 {
namespace {

constexpr int kThreads = 128;
constexpr int kTileKeys = 64;
constexpr int kDim = 128;  // indexer head dim
constexpr int kSteps = kDim / 16;  // k16 steps over a key
constexpr int kLaneBytes = kDim / 4;  // a quad lane's contiguous share of a key
constexpr int kMaxCols = 128;  // (query row, head) columns of one wgmma
constexpr int64_t kMaxTilesPerCta = 32;
constexpr int64_t kTargetCtas = 1024;  // enough CTAs for every SM to hold several while one waits on memory
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
  uint4 first[2], second[2];  // [row]: bytes [0, 16) and [16, 32) of the lane's share
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

// Rows of tile t0 at or past key_end, on missing pages or of an invalid request are absent (zero codes).
template <bool kVector, typename Params>
DSV4_SM90_DEVICE KeyTile load_keys(const Params& p, int64_t request, int64_t t0, int64_t key_end, int row0,
                                   int lane_c) {
  KeyTile k;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t pos = t0 + row0 + 8 * i;
    int64_t scale_at = 0;
    const int64_t at = request >= 0 && pos < key_end
                           ? paged_key_offset(p.cache, p.block_table, request, p.max_blocks, kDim, pos, scale_at)
                           : -1;
    k.present[i] = at >= 0;
    k.first[i] = k.second[i] = make_uint4(0u, 0u, 0u, 0u);
    k.scale[i] = 0.0f;
    if (at >= 0) {
      const uint8_t* key = p.cache.base + at + lane_c * kLaneBytes;
      k.first[i] = load_16<kVector>(key), k.second[i] = load_16<kVector>(key + 16);
      k.scale[i] = __ldg(reinterpret_cast<const float*>(p.cache.base + scale_at));
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

// Logical dim k (k16 step s = k / 16) lives at byte lane * 32 + 4 s + e of a key, where the A fragment puts
// logical dims 2 lane, 2 lane + 1 (e = 0, 1) and 2 lane + 8, 2 lane + 9 (e = 2, 3) of step s in that lane.
DSV4_SM90_DEVICE int physical_dim(int k) {
  const int s = k / 16, kl = k % 16;
  return ((kl & 7) >> 1) * kLaneBytes + 4 * s + (kl & 1) + 2 * (kl >> 3);
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
DSV4_SM90_DEVICE void wgmma_f16_rs(float (&d)[kCols / 8][4], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kCols == 64) {
    wgmma_64x64x16_f16_rs(d, a, b);
  } else {
    wgmma_64x128x16_f16_rs(d, a, b);
  }
}

// d[token row][column] = <key, q column> over the 128 dims of a tile.
template <int kCols>
DSV4_SM90_DEVICE void score_tile(const KeyTile& k, uint32_t q_base, float (&d)[kCols / 8][4]) {
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
#pragma unroll
  for (int t = 0; t < kCols / 8; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) d[t][i] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const uint32_t address = q_base + (s / 4) * kCols * 128 + (s % 4) * 32;
    wgmma_f16_rs<kCols>(d, a[s], swizzled_descriptor(address, 16, kSwizzleAtomBytes));
  }
  wgmma_commit();
  wgmma_wait_all();
#pragma unroll
  for (int t = 0; t < kCols / 8; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[t][i])::"memory");  // read only after the wait
}

// Grid (position chunks, groups): CTA (x, g) scores positions [x, x + 1) * tiles_per_cta * 64 of group g's rows.
template <int kHeadsPad, int kCols, bool kVector, typename Params>
__global__ void __launch_bounds__(kThreads) indexer_scores_kernel(const Params p, int64_t tiles_per_cta) {
  constexpr int kRows = kCols / kHeadsPad;
  __shared__ __align__(1024) uint8_t q_tile[kCols * kDim * 2];
  __shared__ float weights[kCols];
  __shared__ int64_t rows[kRows], lengths[kRows];
  __shared__ float* outs[kRows];
  const int t = threadIdx.x, lane = t % 32, lane_c = lane % 4, row0 = 16 * (t / 32) + lane / 4;
  const int64_t width = output_width(p), c0 = int64_t(blockIdx.x) * tiles_per_cta * kTileKeys;
  const int64_t c1 = std::min(c0 + tiles_per_cta * kTileKeys, width);
  const bool clean = cleans(p);
  const uint32_t q_base = shared_address(q_tile);
  for (int64_t g = blockIdx.y; g < groups(p); g += gridDim.y) {
    __syncthreads();  // the previous group's q tile and rows are no longer read
    if (t < kRows) {
      const RowSetup r = row_setup(p, g, t);
      rows[t] = r.row, lengths[t] = r.length, outs[t] = r.out;
    }
    __syncthreads();
    store_queries<kHeadsPad, kCols>(p, rows, q_tile, weights);
    fence_async_shared();  // the q tile's generic stores, before wgmma reads them
    __syncthreads();
    int64_t longest = 0;
#pragma unroll
    for (int j = 0; j < kRows; ++j) longest = std::max(longest, lengths[j]);
    if (c0 >= longest && !clean) continue;  // uniform: nothing to score or write
    const int64_t request = group_request(p, g), key_end = std::min(longest, c1);
    KeyTile cur = load_keys<kVector>(p, request, c0, key_end, row0, lane_c);
    for (int64_t t0 = c0; t0 < c1; t0 += kTileKeys) {
      const KeyTile next = load_keys<kVector>(p, request, t0 + kTileKeys, key_end, row0, lane_c);
      if (t0 >= longest) {  // uniform: only -inf past every row's length
        for (int i = t; i < kRows * kTileKeys; i += kThreads) {
          const int64_t pos = t0 + i % kTileKeys;
          if (outs[i / kTileKeys] != nullptr && pos < c1) outs[i / kTileKeys][pos] = -INFINITY;
        }
        cur = next;
        continue;
      }
      float d[kCols / 8][4];
      score_tile<kCols>(cur, q_base, d);
      float totals[kRows][2];
#pragma unroll
      for (int j = 0; j < kRows; ++j)
#pragma unroll
        for (int tok = 0; tok < 2; ++tok) {
          float total = 0.0f;
#pragma unroll
          for (int h8 = 0; h8 < kHeadsPad / 8; ++h8) {
            const int n8 = j * kHeadsPad / 8 + h8;
            const float2 w = *reinterpret_cast<const float2*>(&weights[8 * n8 + 2 * lane_c]);
            total += w.x * fmaxf(d[n8][2 * tok], 0.0f) + w.y * fmaxf(d[n8][2 * tok + 1], 0.0f);  // NaN dots count 0
          }
          total += __shfl_xor_sync(0xffffffffu, total, 1);
          totals[j][tok] = total + __shfl_xor_sync(0xffffffffu, total, 2);
        }
#pragma unroll
      for (int j = 0; j < kRows; ++j)
#pragma unroll
        for (int tok = 0; tok < 2; ++tok) {
          const int64_t pos = t0 + row0 + 8 * tok;
          if (((2 * j + tok) & 3) != lane_c || outs[j] == nullptr) continue;  // a quad's lanes share the writes
          if (pos < lengths[j]) {
            outs[j][pos] = cur.present[tok] ? totals[j][tok] * cur.scale[tok] : -INFINITY;
          } else if (clean && pos < c1) {
            outs[j][pos] = -INFINITY;
          }
        }
      cur = next;
    }
  }
}

// ---- launch ----

int heads_padded(int64_t heads) { return heads <= 16 ? 16 : heads <= 32 ? 32 : heads <= 64 ? 64 : 128; }

// Whether the Hopper kernel takes these scores; otherwise the portable tier does (same contract).
bool covered(int64_t heads, int64_t head_dim, int64_t rows_per_group, const PagedCache& cache) {
  const int64_t cols = int64_t(heads_padded(heads)) * rows_per_group;
  const bool word_aligned = ((reinterpret_cast<uintptr_t>(cache.base) | uintptr_t(cache.block_stride)) & 3u) == 0;
  return head_dim == kDim && heads >= 1 && heads <= kMaxCols && cols <= kMaxCols && word_aligned;
}

template <int kHeadsPad, int kCols, bool kVector, typename Params>
cudaError_t launch_scores(const Params& p, int64_t num_groups, int64_t width, cudaStream_t stream) {
  const int64_t tiles = (width + kTileKeys - 1) / kTileKeys;
  const int64_t per_cta = std::clamp((tiles * num_groups + kTargetCtas - 1) / kTargetCtas, int64_t(1),
                                     kMaxTilesPerCta);
  const dim3 grid(unsigned((tiles + per_cta - 1) / per_cta), unsigned(std::min(num_groups, kMaxGridY)));
  indexer_scores_kernel<kHeadsPad, kCols, kVector><<<grid, kThreads, 0, stream>>>(p, per_cta);
  return cudaGetLastError();
}

template <bool kVector, typename Params>
cudaError_t dispatch_scores(const Params& p, int64_t rows_per_group, int64_t num_groups, int64_t width,
                            cudaStream_t stream) {
  const int padded = heads_padded(p.num_heads);
  const bool wide = padded * rows_per_group > 64;
  if (padded == 16) return launch_scores<16, 64, kVector>(p, num_groups, width, stream);
  if (padded == 32) return launch_scores<32, 64, kVector>(p, num_groups, width, stream);
  if (padded == 64 && !wide) return launch_scores<64, 64, kVector>(p, num_groups, width, stream);
  if (padded == 64) return launch_scores<64, 128, kVector>(p, num_groups, width, stream);
  return launch_scores<128, 128, kVector>(p, num_groups, width, stream);
}

template <typename Params>
cudaError_t launch_indexer_scores(const Params& p, int64_t rows_per_group, int64_t num_groups, int64_t width,
                                  cudaStream_t stream) {
  if (num_groups <= 0 || width <= 0) return cudaSuccess;
  const bool vector = ((reinterpret_cast<uintptr_t>(p.cache.base) | uintptr_t(p.cache.block_stride)) & 15u) == 0;
  if (vector) return dispatch_scores<true>(p, rows_per_group, num_groups, width, stream);
  return dispatch_scores<false>(p, rows_per_group, num_groups, width, stream);
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
  if (!covered(p.num_heads, p.head_dim, p.next_n, p.cache) || p.batch * p.next_n <= 0 || p.max_context_len <= 0 ||
      (heads_padded(p.num_heads) < 64 && heads_padded(p.num_heads) * p.next_n > 64)) {
    return launch_fp8_paged_mqa_logits(p, stream);
  }
  return launch_indexer_scores(p, p.next_n, p.batch, p.max_context_len, stream);
}

// Rows go through the workspace in chunks of workspace_rows: the Hopper scores, then the portable tier's select.
cudaError_t launch_fp8_paged_mqa_topk_sm90(const PagedMqaTopkParams& p, cudaStream_t stream) {
  using namespace sm90;
  if (!covered(p.num_heads, p.head_dim, 1, p.cache)) return launch_fp8_paged_mqa_topk(p, stream);
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
