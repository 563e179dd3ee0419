// Plain parameter structs handed from the torch-facing layer to the kernels.
// Pure data (no functions): the same header is seen by every ISA tier and the CUDA tier.
#pragma once
#include <cstdint>

namespace dsv4 {

enum class DType : int32_t { f32, bf16, f16 };

// Read-only view of int32 or int64 indices: element (r, c) at data[r * row_stride + c * col_stride].
struct IndexView {
  const void* data = nullptr;
  bool is_int64 = true;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
};

// Paged byte cache: page b starts at base + b * block_stride; block_size entries per page. The V4.1 records come in
// two placements (common/records.h): page-split (a page's data rows, then its scale rows) or per-token (each
// entry's scales right after its data); the other records have one placement each.
struct PagedCache {
  uint8_t* base = nullptr;
  int64_t num_blocks = 0;
  int64_t block_stride = 0;
  int64_t block_size = 0;
  bool per_token = false;
};

// fp32 RoPE table [rows, rope_dim]: cos in [0, rope_dim/2), sin in [rope_dim/2, rope_dim).
struct RopeTable {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t row_stride = 0;
  int64_t rope_dim = 0;
};

// fp32 compressor state rows: entry (block, offset) at base + block*block_stride + offset*row_stride.
struct StateCache {
  float* base = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t block_stride = 0;
  int64_t row_stride = 0;
  int64_t row_width = 0;
};

// The attention records: MODEL1 (584 B, DeepSeek-V4.0), V32 (656 B, V3.2), V4.1 fp8 (528 B) and fp4 (288 B).
enum class KvLayout : int32_t { model1, v32, v41_fp8, v41_fp4 };

struct QNormRopeKvInsertParams {
  const void* q = nullptr;  // [num_tokens, num_heads, 512]
  DType dtype = DType::bf16;  // of q, kv and q_out
  int64_t num_tokens = 0, num_heads = 0, q_stride_t = 0, q_stride_h = 0;
  void* q_out = nullptr;  // contiguous [num_tokens, padded_heads, 512]
  int64_t padded_heads = 0;
  const void* kv = nullptr;  // [num_kv_tokens, 512]
  int64_t num_kv_tokens = 0, kv_stride_t = 0;
  IndexView positions;  // [num_tokens]
  IndexView slots;  // [num_kv_tokens]
  RopeTable rope;
  PagedCache cache;  // MODEL1 or V4.1 fp8 / fp4
  KvLayout layout = KvLayout::model1;
  bool q_norm = true;  // DeepSeek-V4.0's per-head RMSNorm of q; V4.1 has none (RoPE only)
  float eps = 1e-6f;
};

// Formats of indexer keys and queries: fp8 (e4m3; a key's one fp32 scale in its page, a query's folded into the
// weights) or mxfp4 (e2m1 pairs with one UE8M0 byte per 32 dims; keys 68 B per entry, queries' bytes beside them).
enum class IndexerFormat : int32_t { fp8, mxfp4 };

struct IndexerQRopeQuantParams {
  const void* q = nullptr;  // [num_tokens, num_heads, 128]
  DType dtype = DType::f32;
  int64_t num_tokens = 0, num_heads = 0, q_stride_t = 0, q_stride_h = 0;
  IndexView positions;
  RopeTable rope;
  const float* weights = nullptr;  // [num_tokens, num_heads], row stride w_stride_t
  int64_t w_stride_t = 0;
  float softmax_scale = 1.0f, head_scale = 1.0f;  // folded into weights_out with the q scale
  uint8_t* q_fp8 = nullptr;  // contiguous [num_tokens, num_heads, 128] (mxfp4: [.., 64] e2m1 pairs)
  float* weights_out = nullptr;  // contiguous [num_tokens, num_heads]
  IndexerFormat query_format = IndexerFormat::fp8;
  uint8_t* q_scale_out = nullptr;  // mxfp4: contiguous [num_tokens, num_heads, 4] UE8M0 bytes
};

struct SavePartialStatesParams {
  const float* kv = nullptr;  // [num_tokens, width], row stride kv_stride
  const float* score = nullptr;  // [num_tokens, width], row stride score_stride
  int64_t kv_stride = 0, score_stride = 0;
  const float* ape = nullptr;  // contiguous [ratio, width]
  int64_t ratio = 0, width = 0, num_tokens = 0;
  IndexView positions, slots;
  StateCache state;  // rows of 2 * width
};

constexpr int64_t kMaxCompressWindow = 256;  // coff * ratio rows pooled per entry (8 for C4, 128 for C128)

struct CompressNormRopeStoreParams {
  StateCache state;  // read only
  IndexView gather_slots;  // [num_tokens, window]
  int64_t window = 0;  // coff * ratio
  IndexView positions, kv_slots;
  const float* norm_weight = nullptr;  // [head_dim]
  float eps = 1e-6f;
  RopeTable rope;
  PagedCache cache;  // head_dim 512: a `layout` record (MODEL1, V4.1 fp8 or fp4); 128: indexer K
  KvLayout layout = KvLayout::model1;
  int64_t ratio = 0, head_dim = 0, coff = 1, num_tokens = 0;
  uint16_t* latent = nullptr;  // optional bf16 [num_tokens, head_dim], row stride latent_stride: the normed entry
  int64_t latent_stride = 0;
};

struct QuantizeKvInsertParams {
  const void* kv = nullptr;  // [num_tokens, head_dim]
  DType dtype = DType::bf16;
  int64_t num_tokens = 0, kv_stride = 0;
  KvLayout layout = KvLayout::model1;
  IndexView slots;
  PagedCache cache;
};

struct DequantizeKvGatherParams {
  PagedCache cache;  // read only
  KvLayout layout = KvLayout::model1;
  IndexView slots;  // flat [num_slots]
  int64_t num_slots = 0;
  uint16_t* out = nullptr;  // contiguous bf16 [num_slots, head_dim]
};

struct IndexerKQuantInsertParams {
  const void* k = nullptr;  // [num_tokens, 128]
  DType dtype = DType::bf16;
  int64_t num_tokens = 0, k_stride = 0;
  IndexView slots;
  PagedCache cache;  // indexer K layout
  IndexerFormat key_format = IndexerFormat::fp8;
};

struct MapLocalToGlobalSlotsParams {
  IndexView local;  // [rows, cols]
  int64_t rows = 0, cols = 0;
  IndexView req_ids;  // [rows]
  IndexView block_table;  // [num_reqs, max_blocks]
  int64_t num_reqs = 0, max_blocks = 0, block_size = 0;
  void* out = nullptr;  // contiguous [rows, cols], same index dtype as local
  bool out_is_int64 = true;
};

constexpr int64_t kMaxInverseRopeHeadDim = 576;  // the V32 head: the widest row the kernel buffers

struct InverseRopeParams {
  const void* o = nullptr;  // [num_tokens, num_heads, head_dim]
  DType dtype = DType::bf16;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0, o_stride_t = 0, o_stride_h = 0;
  IndexView positions;
  RopeTable rope;
  void* out = nullptr;  // contiguous [num_tokens, num_heads, head_dim]
  DType out_dtype = DType::f32;
};

}  // namespace dsv4

namespace dsv4 {

// ---- lightning indexer ----

// DeepSeek-V4.1's index key writer: RMSNorm (weighted), RoPE at the group's first position, quantize.
struct IndexerKNormRopeStoreParams {
  const uint16_t* k_pre = nullptr;  // bf16 [num_tokens, 128], row stride k_stride
  int64_t num_tokens = 0, k_stride = 0;
  IndexView positions, slots;  // [num_tokens]
  RopeTable rope;
  const float* norm_weight = nullptr;  // [128]
  double eps = 1e-6;  // the schema's double: the reference adds it in float64
  PagedCache cache;  // indexer K pages of key_format entries
  int64_t ratio = 1;
  IndexerFormat key_format = IndexerFormat::fp8;
};

struct PagedMqaLogitsParams {
  const uint8_t* q = nullptr;  // e4m3, contiguous [batch * next_n, num_heads, head_dim]
  int64_t batch = 0, next_n = 1, num_heads = 0, head_dim = 0;
  const float* weights = nullptr;  // [batch * next_n, num_heads], row stride w_stride
  int64_t w_stride = 0;
  IndexView context_lens;  // [batch] or [batch, next_n]
  bool lens_per_row = false;  // true for [batch, next_n]
  IndexView block_table;  // [batch, max_blocks]
  int64_t max_blocks = 0;
  PagedCache cache;  // indexer K pages (head_dim e4m3 bytes per entry, then one fp32 scale per entry)
  int64_t max_context_len = 0;
  bool clean_logits = true;
  float* out = nullptr;  // [batch * next_n, max_context_len], row stride out_stride
  int64_t out_stride = 0;
  IndexerFormat key_format = IndexerFormat::fp8;  // of the cache's entries
  // mxfp4 queries: q holds head_dim / 2 code bytes per head, q_scale contiguous [batch * next_n, num_heads,
  // head_dim / 32] UE8M0 bytes; nullptr for e4m3 queries.
  const uint8_t* q_scale = nullptr;
};

struct MqaLogitsParams {
  const uint8_t* q = nullptr;  // e4m3 [rows, num_heads, head_dim], strides q_stride_m / q_stride_h, last dim contiguous
  int64_t rows = 0, num_heads = 0, head_dim = 0, q_stride_m = 0, q_stride_h = 0;
  const uint8_t* k = nullptr;  // e4m3 [num_keys, head_dim], row stride k_stride
  int64_t num_keys = 0, k_stride = 0;
  const float* k_scale = nullptr;  // [num_keys]
  const float* weights = nullptr;  // [rows, num_heads], row stride w_stride
  int64_t w_stride = 0;
  IndexView ks, ke;  // [rows]
  bool clean_logits = true;
  float* out = nullptr;  // [rows, num_keys], row stride out_stride
  int64_t out_stride = 0;
  // mxfp4 keys: k holds head_dim / 2 code bytes per key and k_scale_ue8m0 [num_keys, head_dim / 32] UE8M0 bytes
  // (row stride k_scale_stride); k_scale is then unused.
  IndexerFormat key_format = IndexerFormat::fp8;
  const uint8_t* k_scale_ue8m0 = nullptr;
  int64_t k_scale_stride = 0;
  // mxfp4 queries: q holds head_dim / 2 code bytes per head, q_scale [rows, num_heads, head_dim / 32] UE8M0 bytes
  // (strides q_scale_stride_m / q_scale_stride_h, last dim contiguous); nullptr for e4m3 queries.
  const uint8_t* q_scale = nullptr;
  int64_t q_scale_stride_m = 0, q_scale_stride_h = 0;
};

struct TopkTransformParams {
  const float* scores = nullptr;  // [rows, width], row stride score_stride
  int64_t rows = 0, width = 0, score_stride = 0;
  IndexView lengths;  // [rows]
  IndexView row_starts;  // [rows]; data == nullptr means all rows start at 0
  IndexView page_table;  // [rows, max_pages]; data == nullptr means no translation
  int64_t max_pages = 0, page_size = 0;
  int64_t k = 0;
  int32_t* raw = nullptr;  // [rows, k], strides raw_stride / raw_col_stride
  int32_t* slots = nullptr;  // [rows, k] or nullptr, strides slot_stride / slot_col_stride
  int64_t raw_stride = 0, slot_stride = 0, raw_col_stride = 1, slot_col_stride = 1;
  int64_t threads = 1;  // intra-op threads: a long row is split into about this many pieces
};

struct PagedMqaTopkParams {
  const uint8_t* q = nullptr;  // e4m3, contiguous [rows, num_heads, head_dim]
  int64_t rows = 0, num_heads = 0, head_dim = 0;
  const float* weights = nullptr;  // [rows, num_heads], row stride w_stride
  int64_t w_stride = 0;
  IndexView lengths;  // [rows]
  IndexView row_requests;  // [rows]: the block-table row of each query row
  IndexView block_table;  // [num_requests, max_blocks]
  int64_t num_requests = 0, max_blocks = 0;
  PagedCache cache;  // indexer K pages
  int64_t k = 0;
  int32_t* out = nullptr;  // [rows, k], row stride out_stride
  int64_t out_stride = 0;
  // CUDA only: fp32 scores of the rows in flight, [workspace_rows, max_blocks * block_size]; CTA c scores rows
  // c, c + workspace_rows, ... into row c (memory bounded by the CTAs, not by the rows).
  float* workspace = nullptr;
  int64_t workspace_rows = 0;
  IndexerFormat key_format = IndexerFormat::fp8;  // of the cache's entries
  const uint8_t* q_scale = nullptr;  // mxfp4 queries: contiguous [rows, num_heads, head_dim / 32]; else nullptr
};

// ---- sparse MLA attention ----

// One set of attended entries per query: slot ids into a paged fp8 cache.
struct SparseIndexSet {
  const void* indices = nullptr;  // [b, s_q, topk]; nullptr: the set is absent
  bool is_int64 = false;
  int64_t stride_b = 0, stride_s = 0, stride_k = 1, topk = 0;
  IndexView lengths;  // [b]; data == nullptr: all topk columns are candidates
  PagedCache cache;
  KvLayout layout = KvLayout::model1;  // the record of cache
};

// FlashMLA-style split plan of a CUDA sparse decode (common/decode_schedule.h builds it): the requests' 64-entry
// blocks are cut into num_parts partitions, one persistent CTA (group) each; pieces of a split request are merged
// by a combine step from fp32 partials.
constexpr int64_t kDecodeBlockEntries = 64;  // entries per scheduling block
constexpr int64_t kDecodeFixedCostBlocks = 5;  // per-piece overhead (load q, store o) in blocks
constexpr int64_t kDecodeCombineCostBlocks = 2;  // a split plan's combine step, in blocks
constexpr int64_t kDecodeSchedWords = 8;  // int32 words per partition in the plan

struct DecodeSchedule {
  int32_t* sched_meta = nullptr;  // [num_parts, 8]: begin_req, end_req (inclusive), begin_block, end_block
                                  // (exclusive, in end_req), begin_split, first_req_split, last_req_split, 0
  int32_t* num_splits = nullptr;  // [b + 1]: exclusive prefix sum of pieces per request
  int64_t num_parts = 0;
  bool plan = false;  // true: the kernel fills sched_meta / num_splits before attending
  float* o_accum = nullptr;  // [b + num_parts, s_q, h_q, d_v] fp32 partials (each already divided by its sum)
  float* lse_accum = nullptr;  // [b + num_parts, s_q, h_q] natural-log lse of each partial (-inf: no valid entry)
};

struct SparseMlaDecodeParams {
  const uint16_t* q = nullptr;  // bf16 [b, s_q, h_q, d_qk], last dim contiguous
  int64_t b = 0, s_q = 0, h_q = 0, d_qk = 0, q_stride_b = 0, q_stride_s = 0, q_stride_h = 0;
  SparseIndexSet main, extra;  // each with its record: V4.1 pairs an fp8 main set with an fp8 or fp4 extra set
  const float* attn_sink = nullptr;  // [h_q] or nullptr
  int64_t d_v = 512;
  float sm_scale = 0.0f;
  uint16_t* out = nullptr;  // bf16, contiguous [b, s_q, h_q, d_v]
  float* lse = nullptr;  // contiguous [b, h_q, s_q]
  int64_t threads = 1;  // intra-op threads: with fewer queries than this, a query's entries are split
  DecodeSchedule sched;  // CUDA only
};

struct SparseMlaPrefillParams {
  const uint16_t* q = nullptr;  // bf16 [s_q, h_q, d_qk], last dim contiguous
  int64_t s_q = 0, h_q = 0, d_qk = 0, q_stride_s = 0, q_stride_h = 0;
  const uint16_t* kv = nullptr;  // bf16 [s_kv, d_qk], row stride kv_stride
  int64_t s_kv = 0, kv_stride = 0;
  const void* indices = nullptr;  // [s_q, topk]
  bool is_int64 = false;
  int64_t idx_stride_s = 0, idx_stride_k = 1, topk = 0;
  IndexView topk_length;  // [s_q]; data == nullptr: all columns are candidates
  const float* attn_sink = nullptr;
  int64_t d_v = 512;
  float sm_scale = 0.0f;
  uint16_t* out = nullptr;  // bf16, contiguous [s_q, h_q, d_v]
  float* max_logits = nullptr;  // contiguous [s_q, h_q]
  float* lse = nullptr;  // contiguous [s_q, h_q]
  // CPU: intra-op threads (with fewer queries than this, a query's entries are split); CUDA: the SMs, over which
  // the Hopper kernel spreads its persistent CTAs.
  int64_t threads = 1;
};

}  // namespace dsv4
