// Bindings of the lightning indexer: the q RoPE + quant, the logits (paged decode, ragged prefill), the fused
// prefill top-k (each over fp8 or mxfp4 keys and queries) and DeepSeek-V4.1's key writer.
#include <string>
#include <vector>

#include <torch/csrc/stable/library.h>

#include "api/checks.h"
#include "api/backend.h"

namespace dsv4::api {
namespace {

constexpr int64_t kMaxHeads = 128, kMaxHeadDim = 256, kHeadDimMultiple = 32;

void check_heads(const char* op, const Tensor& q, int64_t head_axis) {
  DSV4_CHECK(q.size(head_axis) >= 1 && q.size(head_axis) <= kMaxHeads, op, "argument 'q' must have 1 to ", kMaxHeads,
             " heads (dimension ", head_axis, "), got shape ", shape_str(q));
}

void check_weights(const char* op, const Tensor& weights, int64_t rows, int64_t heads) {
  check_dtype({op, "weights"}, weights, {ScalarType::Float});
  check_dim({op, "weights"}, weights, 2);
  check_size({op, "weights"}, weights, 0, rows);
  check_size({op, "weights"}, weights, 1, heads);
  check_last_dim_contiguous({op, "weights"}, weights);
}

// mxfp4 queries: the UE8M0 bytes q_scale (uint8, [*q.shape[:-1], dim / 32], last dim contiguous) beside the codes q
// (uint8, dim / 2 bytes per head); returns the head dim. e4m3 queries (no q_scale): q.size(-1).
int64_t check_query_scale(const char* op, const Tensor& q, const std::optional<Tensor>& q_scale) {
  if (!q_scale) {
    check_dtype({op, "q"}, q, {ScalarType::Float8_e4m3fn});
    return q.size(q.dim() - 1);
  }
  check_dtype({op, "q"}, q, {ScalarType::Byte});
  const int64_t dim = 2 * q.size(q.dim() - 1);
  check_dtype({op, "q_scale"}, *q_scale, {ScalarType::Byte});
  check_dim({op, "q_scale"}, *q_scale, q.dim());
  for (int64_t d = 0; d + 1 < q.dim(); ++d) check_size({op, "q_scale"}, *q_scale, d, q.size(d));
  DSV4_CHECK(dim % kMxfp4Block == 0, op, "argument 'q' (mxfp4 codes, two per byte) must hold a multiple of ",
             kMxfp4Block / 2, " bytes per head, got shape ", shape_str(q));
  check_size({op, "q_scale"}, *q_scale, q.dim() - 1, dim / kMxfp4Block);
  check_last_dim_contiguous({op, "q_scale"}, *q_scale);
  return dim;
}

void indexer_q_rope_quant_format(Tensor q, Tensor positions, Tensor cos_sin_cache, Tensor weights,
                                 double softmax_scale, double head_scale, Tensor q_fp8, Tensor weights_out,
                                 std::string query_format, std::optional<Tensor> q_scale_out) {
  const char* op = "indexer_q_rope_quant";
  const DeviceScope scope(q);
  check_same_device(op, q, {{"positions", &positions}, {"cos_sin_cache", &cos_sin_cache}, {"weights", &weights},
                            {"q_fp8", &q_fp8}, {"weights_out", &weights_out}, {"q_scale_out", present(q_scale_out)}});
  IndexerQRopeQuantParams p;
  p.query_format = parse_indexer_format({op, "query_format"}, query_format);
  const bool fp4 = p.query_format == IndexerFormat::mxfp4;
  p.dtype = float_dtype({op, "q"}, q);
  check_dim({op, "q"}, q, 3);
  check_size({op, "q"}, q, 2, kIndexerHeadDim);
  check_last_dim_contiguous({op, "q"}, q);
  p.positions = index_view({op, "positions"}, positions, 1);
  check_size({op, "positions"}, positions, 0, q.size(0));
  p.rope = rope_table({op, "cos_sin_cache"}, cos_sin_cache, kIndexerRopeDim);
  check_dtype({op, "weights"}, weights, {ScalarType::Float});
  check_dim({op, "weights"}, weights, 2);
  check_size({op, "weights"}, weights, 0, q.size(0));
  check_size({op, "weights"}, weights, 1, q.size(1));
  check_last_dim_contiguous({op, "weights"}, weights);
  if (fp4) {
    check_dtype({op, "q_fp8"}, q_fp8, {ScalarType::Byte});
    check_contiguous({op, "q_fp8"}, q_fp8);
    DSV4_CHECK(q_fp8.dim() == 3 && q_fp8.size(0) == q.size(0) && q_fp8.size(1) == q.size(1) &&
                   q_fp8.size(2) == kIndexerFp4DataBytes,
               op, "argument 'q_fp8' (the mxfp4 codes) must have shape [", q.size(0), ", ", q.size(1), ", ",
               kIndexerFp4DataBytes, "], got ", shape_str(q_fp8));
    DSV4_CHECK(q_scale_out.has_value(), op, "argument 'q_scale_out' must be a uint8 [", q.size(0), ", ", q.size(1),
               ", ", kIndexerFp4ScaleBytes, "] tensor with query_format 'mxfp4', got None");
    check_dtype({op, "q_scale_out"}, *q_scale_out, {ScalarType::Byte});
    check_contiguous({op, "q_scale_out"}, *q_scale_out);
    DSV4_CHECK(q_scale_out->dim() == 3 && q_scale_out->size(0) == q.size(0) && q_scale_out->size(1) == q.size(1) &&
                   q_scale_out->size(2) == kIndexerFp4ScaleBytes,
               op, "argument 'q_scale_out' must have shape [", q.size(0), ", ", q.size(1), ", ", kIndexerFp4ScaleBytes,
               "], got ", shape_str(*q_scale_out));
    check_no_overlap(op, "q_scale_out", *q_scale_out, {{"q", &q}, {"positions", &positions},
                                                        {"cos_sin_cache", &cos_sin_cache}, {"weights", &weights},
                                                        {"q_fp8", &q_fp8}, {"weights_out", &weights_out}});
    p.q_scale_out = static_cast<uint8_t*>(q_scale_out->data_ptr());
  } else {
    DSV4_CHECK(!q_scale_out.has_value(), op, "argument 'q_scale_out' must be None with query_format 'fp8' (the q ",
               "scale is folded into weights_out), got a tensor of shape ", shape_str(*q_scale_out));
    check_dtype({op, "q_fp8"}, q_fp8, {ScalarType::Float8_e4m3fn, ScalarType::Byte});
    check_contiguous({op, "q_fp8"}, q_fp8);
    DSV4_CHECK(q_fp8.dim() == 3 && q_fp8.size(0) == q.size(0) && q_fp8.size(1) == q.size(1) &&
                   q_fp8.size(2) == kIndexerHeadDim,
               op, "argument 'q_fp8' must have q's shape ", shape_str(q), ", got ", shape_str(q_fp8));
  }
  check_dtype({op, "weights_out"}, weights_out, {ScalarType::Float});
  check_contiguous({op, "weights_out"}, weights_out);
  DSV4_CHECK(weights_out.dim() == 2 && weights_out.size(0) == q.size(0) && weights_out.size(1) == q.size(1), op,
             "argument 'weights_out' must have shape [", q.size(0), ", ", q.size(1), "], got ", shape_str(weights_out));
  check_no_overlap(op, "q_fp8", q_fp8, {{"q", &q}, {"positions", &positions}, {"cos_sin_cache", &cos_sin_cache},
                                        {"weights", &weights}, {"weights_out", &weights_out}});
  check_no_overlap(op, "weights_out", weights_out, {{"q", &q}, {"positions", &positions},
                                                    {"cos_sin_cache", &cos_sin_cache}, {"weights", &weights}});
  p.q = q.const_data_ptr();
  p.num_tokens = q.size(0), p.num_heads = q.size(1), p.q_stride_t = q.stride(0), p.q_stride_h = q.stride(1);
  p.weights = static_cast<const float*>(weights.const_data_ptr());
  p.w_stride_t = weights.stride(0);
  p.softmax_scale = float(softmax_scale), p.head_scale = float(head_scale);
  p.q_fp8 = static_cast<uint8_t*>(q_fp8.data_ptr());
  p.weights_out = static_cast<float*>(weights_out.data_ptr());
  check_values_in_range({op, "positions"}, p.positions, p.num_tokens, p.rope.rows);
  backend_kernels().indexer_q_rope_quant(p);
}

void indexer_q_rope_quant(Tensor q, Tensor positions, Tensor cos_sin_cache, Tensor weights, double softmax_scale,
                          double head_scale, Tensor q_fp8, Tensor weights_out) {
  indexer_q_rope_quant_format(q, positions, cos_sin_cache, weights, softmax_scale, head_scale, q_fp8, weights_out,
                              "fp8", std::nullopt);
}

Tensor fp8_paged_mqa_logits_format(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_table,
                                   int64_t block_size, int64_t max_context_len, bool clean_logits,
                                   std::optional<Tensor> schedule_meta, std::optional<Tensor> q_scale,
                                   std::string key_format) {
  const char* op = "fp8_paged_mqa_logits";
  const DeviceScope scope(q);
  check_same_device(op, q, {{"kv_cache", &kv_cache}, {"weights", &weights}, {"context_lens", &context_lens},
                            {"block_table", &block_table}, {"q_scale", present(q_scale)}});
  PagedMqaLogitsParams p;
  p.key_format = parse_indexer_format({op, "key_format"}, key_format);
  check_dtype({op, "q"}, q, {q_scale ? ScalarType::Byte : ScalarType::Float8_e4m3fn});
  check_dim({op, "q"}, q, 4);
  check_size({op, "q"}, q, 3, q_scale ? kIndexerFp4DataBytes : kIndexerHeadDim);  // mxfp4: two codes per byte
  check_query_scale(op, q, q_scale);
  check_heads(op, q, 2);
  p.batch = q.size(0), p.next_n = q.size(1), p.num_heads = q.size(2), p.head_dim = kIndexerHeadDim;
  p.cache = paged_cache({op, "kv_cache"}, kv_cache, block_size, indexer_entry_bytes(p.key_format));
  check_weights(op, weights, p.batch * p.next_n, p.num_heads);
  check_dtype({op, "context_lens"}, context_lens, {ScalarType::Int, ScalarType::Long});
  p.lens_per_row = context_lens.dim() == 2;
  p.context_lens = index_view({op, "context_lens"}, context_lens, p.lens_per_row ? 2 : 1);
  check_size({op, "context_lens"}, context_lens, 0, p.batch);
  if (p.lens_per_row) check_size({op, "context_lens"}, context_lens, 1, p.next_n);
  p.block_table = index_view({op, "block_table"}, block_table, 2);
  check_size({op, "block_table"}, block_table, 0, p.batch);
  DSV4_CHECK(max_context_len >= 0, op, "argument 'max_context_len' must be >= 0, got ", max_context_len);
  const Tensor q_rows = torch::stable::contiguous(q);
  p.q = static_cast<const uint8_t*>(q_rows.const_data_ptr());
  const Tensor q_scale_rows = q_scale ? torch::stable::contiguous(*q_scale) : q_rows;  // q_rows: unused stand-in
  if (q_scale) p.q_scale = static_cast<const uint8_t*>(q_scale_rows.const_data_ptr());
  p.weights = static_cast<const float*>(weights.const_data_ptr());
  p.w_stride = weights.stride(0);
  p.max_blocks = block_table.size(1);
  p.max_context_len = max_context_len;
  p.clean_logits = clean_logits;
  Tensor out = float_output({op, "max_context_len"}, p.batch * p.next_n, max_context_len, q);
  p.out = static_cast<float*>(out.data_ptr());
  p.out_stride = max_context_len;
  backend_kernels().fp8_paged_mqa_logits(p);
  return out;
}

Tensor fp8_paged_mqa_logits(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_table,
                            int64_t block_size, int64_t max_context_len, bool clean_logits,
                            std::optional<Tensor> schedule_meta) {
  return fp8_paged_mqa_logits_format(q, kv_cache, weights, context_lens, block_table, block_size, max_context_len,
                                     clean_logits, schedule_meta, std::nullopt, "fp8");
}

Tensor fp8_mqa_logits_format(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor ks, Tensor ke,
                             bool clean_logits, std::optional<Tensor> q_scale, std::string key_format) {
  const char* op = "fp8_mqa_logits";
  const DeviceScope scope(q);
  check_same_device(op, q, {{"k", &k}, {"k_scale", &k_scale}, {"weights", &weights}, {"ks", &ks}, {"ke", &ke},
                            {"q_scale", present(q_scale)}});
  MqaLogitsParams p;
  p.key_format = parse_indexer_format({op, "key_format"}, key_format);
  const bool fp4_keys = p.key_format == IndexerFormat::mxfp4;
  check_dim({op, "q"}, q, 3);
  check_heads(op, q, 1);
  check_last_dim_contiguous({op, "q"}, q);
  const int64_t rows = q.size(0), heads = q.size(1), dim = check_query_scale(op, q, q_scale);
  DSV4_CHECK(dim > 0 && dim % kHeadDimMultiple == 0 && dim <= kMaxHeadDim, op, "argument 'q' head dim must be a multiple of ",
             kHeadDimMultiple, " up to ", kMaxHeadDim, q_scale ? " (two mxfp4 codes per byte)" : "", ", got shape ",
             shape_str(q));
  check_dtype({op, "k"}, k, {fp4_keys ? ScalarType::Byte : ScalarType::Float8_e4m3fn});
  check_dim({op, "k"}, k, 2);
  check_size({op, "k"}, k, 1, fp4_keys ? dim / 2 : dim);
  check_last_dim_contiguous({op, "k"}, k);
  if (fp4_keys) {
    check_dtype({op, "k_scale"}, k_scale, {ScalarType::Byte});
    check_dim({op, "k_scale"}, k_scale, 2);
    check_size({op, "k_scale"}, k_scale, 0, k.size(0));
    check_size({op, "k_scale"}, k_scale, 1, dim / kMxfp4Block);
    check_last_dim_contiguous({op, "k_scale"}, k_scale);
    p.k_scale_ue8m0 = static_cast<const uint8_t*>(k_scale.const_data_ptr());
    p.k_scale_stride = k_scale.stride(0);
  } else {
    check_dtype({op, "k_scale"}, k_scale, {ScalarType::Float});
    check_dim({op, "k_scale"}, k_scale, 1);
    check_size({op, "k_scale"}, k_scale, 0, k.size(0));
    check_contiguous({op, "k_scale"}, k_scale);
    p.k_scale = static_cast<const float*>(k_scale.const_data_ptr());
  }
  check_weights(op, weights, rows, heads);
  if (q_scale) {
    p.q_scale = static_cast<const uint8_t*>(q_scale->const_data_ptr());
    p.q_scale_stride_m = q_scale->stride(0), p.q_scale_stride_h = q_scale->stride(1);
  }
  p.ks = index_view({op, "ks"}, ks, 1);
  check_size({op, "ks"}, ks, 0, rows);
  p.ke = index_view({op, "ke"}, ke, 1);
  check_size({op, "ke"}, ke, 0, rows);
  p.q = static_cast<const uint8_t*>(q.const_data_ptr());
  p.rows = rows, p.num_heads = heads, p.head_dim = dim, p.q_stride_m = q.stride(0), p.q_stride_h = q.stride(1);
  p.k = static_cast<const uint8_t*>(k.const_data_ptr());
  p.num_keys = k.size(0), p.k_stride = k.stride(0);
  p.weights = static_cast<const float*>(weights.const_data_ptr());
  p.w_stride = weights.stride(0);
  p.clean_logits = clean_logits;
  Tensor out = float_output({op, "k"}, rows, p.num_keys, q);
  p.out = static_cast<float*>(out.data_ptr());
  p.out_stride = p.num_keys;
  backend_kernels().fp8_mqa_logits(p);
  return out;
}

Tensor fp8_mqa_logits(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor ks, Tensor ke, bool clean_logits) {
  return fp8_mqa_logits_format(q, k, k_scale, weights, ks, ke, clean_logits, std::nullopt, "fp8");
}

void fp8_paged_mqa_topk_format(Tensor q, Tensor kv_cache, Tensor weights, Tensor lengths, Tensor block_table,
                               Tensor row_requests, int64_t block_size, Tensor topk_indices,
                               std::optional<Tensor> q_scale, std::string key_format) {
  const char* op = "fp8_paged_mqa_topk";
  const DeviceScope scope(q);
  check_same_device(op, q, {{"kv_cache", &kv_cache}, {"weights", &weights}, {"lengths", &lengths},
                            {"block_table", &block_table}, {"row_requests", &row_requests},
                            {"topk_indices", &topk_indices}, {"q_scale", present(q_scale)}});
  PagedMqaTopkParams p;
  p.key_format = parse_indexer_format({op, "key_format"}, key_format);
  check_dtype({op, "q"}, q, {q_scale ? ScalarType::Byte : ScalarType::Float8_e4m3fn});
  check_dim({op, "q"}, q, 3);
  check_size({op, "q"}, q, 2, q_scale ? kIndexerFp4DataBytes : kIndexerHeadDim);  // mxfp4: two codes per byte
  check_query_scale(op, q, q_scale);
  check_heads(op, q, 1);
  p.rows = q.size(0), p.num_heads = q.size(1), p.head_dim = kIndexerHeadDim;
  p.cache = paged_cache({op, "kv_cache"}, kv_cache, block_size, indexer_entry_bytes(p.key_format));
  check_weights(op, weights, p.rows, p.num_heads);
  p.lengths = index_view({op, "lengths"}, lengths, 1);
  check_size({op, "lengths"}, lengths, 0, p.rows);
  p.block_table = index_view({op, "block_table"}, block_table, 2);
  p.row_requests = index_view({op, "row_requests"}, row_requests, 1);
  check_size({op, "row_requests"}, row_requests, 0, p.rows);
  p.num_requests = block_table.size(0), p.max_blocks = block_table.size(1);
  check_values_in_range({op, "row_requests"}, p.row_requests, p.rows, p.num_requests);
  check_dtype({op, "topk_indices"}, topk_indices, {ScalarType::Int});
  check_dim({op, "topk_indices"}, topk_indices, 2);
  check_size({op, "topk_indices"}, topk_indices, 0, p.rows);
  check_last_dim_contiguous({op, "topk_indices"}, topk_indices);
  p.k = topk_indices.size(1);
  DSV4_CHECK(supported_topk(p.k), op, "argument 'topk_indices' must have 512, 1024 or 2048 columns (k), got ",
             p.k);
  // Rows longer than k are scored into a per-thread buffer: bound them by what the caller's table addresses.
  const int64_t coverage = p.max_blocks * block_size;
  for (int64_t r = 0; kHostReadsValues && r < p.rows; ++r) {
    const int64_t len = index_at(p.lengths, r);
    DSV4_CHECK(len <= p.k || len <= coverage, op, "argument 'lengths' entry ", r, " is ", len, ", more than the ",
               coverage, " entries block_table can address");
  }
  check_no_overlap(op, "topk_indices", topk_indices, {{"q", &q}, {"kv_cache", &kv_cache}, {"weights", &weights},
                                                      {"lengths", &lengths}, {"block_table", &block_table},
                                                      {"row_requests", &row_requests},
                                                      {"q_scale", present(q_scale)}});
  const Tensor q_rows = torch::stable::contiguous(q);
  p.q = static_cast<const uint8_t*>(q_rows.const_data_ptr());
  const Tensor q_scale_rows = q_scale ? torch::stable::contiguous(*q_scale) : q_rows;  // q_rows: unused stand-in
  if (q_scale) p.q_scale = static_cast<const uint8_t*>(q_scale_rows.const_data_ptr());
  p.weights = static_cast<const float*>(weights.const_data_ptr());
  p.w_stride = weights.stride(0);
  p.out = static_cast<int32_t*>(topk_indices.data_ptr());
  p.out_stride = topk_indices.stride(0);
#if defined(DSV4_BACKEND_CUDA)
  // Scores of the rows in flight: one row of the longest addressable context per CTA.
  p.workspace_rows = cuda::paged_topk_workspace_ctas(p.rows);
  const Tensor workspace = torch::stable::empty({p.workspace_rows, coverage}, ScalarType::Float, std::nullopt,
                                                q.device());
  p.workspace = static_cast<float*>(workspace.data_ptr());
#endif
  backend_kernels().fp8_paged_mqa_topk(p);
}

void fp8_paged_mqa_topk(Tensor q, Tensor kv_cache, Tensor weights, Tensor lengths, Tensor block_table,
                        Tensor row_requests, int64_t block_size, Tensor topk_indices) {
  fp8_paged_mqa_topk_format(q, kv_cache, weights, lengths, block_table, row_requests, block_size, topk_indices,
                            std::nullopt, "fp8");
}

void indexer_k_norm_rope_store(Tensor k_pre, Tensor positions, Tensor cos_sin_cache, Tensor norm_weight, double eps,
                               Tensor kv_cache, Tensor slot_mapping, int64_t block_size, int64_t compress_ratio,
                               std::string key_format) {
  const char* op = "indexer_k_norm_rope_store";
  const DeviceScope scope(k_pre);
  check_same_device(op, k_pre, {{"positions", &positions}, {"cos_sin_cache", &cos_sin_cache},
                                {"norm_weight", &norm_weight}, {"kv_cache", &kv_cache},
                                {"slot_mapping", &slot_mapping}});
  IndexerKNormRopeStoreParams p;
  p.key_format = parse_indexer_format({op, "key_format"}, key_format);
  check_dtype({op, "k_pre"}, k_pre, {ScalarType::BFloat16});
  check_dim({op, "k_pre"}, k_pre, 2);
  check_size({op, "k_pre"}, k_pre, 1, kIndexerHeadDim);
  check_last_dim_contiguous({op, "k_pre"}, k_pre);
  p.num_tokens = k_pre.size(0);
  p.positions = index_view({op, "positions"}, positions, 1);
  check_size({op, "positions"}, positions, 0, p.num_tokens);
  p.rope = rope_table({op, "cos_sin_cache"}, cos_sin_cache, kIndexerRopeDim);
  check_dtype({op, "norm_weight"}, norm_weight, {ScalarType::Float});
  check_dim({op, "norm_weight"}, norm_weight, 1);
  check_size({op, "norm_weight"}, norm_weight, 0, kIndexerHeadDim);
  check_contiguous({op, "norm_weight"}, norm_weight);
  DSV4_CHECK(eps >= 0.0 && eps <= 1.0, op, "argument 'eps' must be in [0, 1], got ", eps);
  check_positive({op, "compress_ratio"}, compress_ratio);
  p.slots = index_view({op, "slot_mapping"}, slot_mapping, 1);
  check_size({op, "slot_mapping"}, slot_mapping, 0, p.num_tokens);
  p.cache = paged_cache({op, "kv_cache"}, kv_cache, block_size, indexer_entry_bytes(p.key_format));
  check_no_overlap(op, "kv_cache", kv_cache, {{"k_pre", &k_pre}, {"positions", &positions},
                                              {"cos_sin_cache", &cos_sin_cache}, {"norm_weight", &norm_weight},
                                              {"slot_mapping", &slot_mapping}});
  p.k_pre = static_cast<const uint16_t*>(k_pre.const_data_ptr());
  p.k_stride = k_pre.stride(0);
  p.norm_weight = static_cast<const float*>(norm_weight.const_data_ptr());
  p.eps = eps;
  p.ratio = compress_ratio;
  check_values_in_range({op, "positions"}, p.positions, p.num_tokens, p.rope.rows);
  check_write_slots({op, "slot_mapping"}, p.slots, p.num_tokens, p.cache.num_blocks * block_size);
  backend_kernels().indexer_k_norm_rope_store(p);
}

}  // namespace

DSV4_BACKEND_IMPL(m) {
  m.impl("indexer_q_rope_quant", TORCH_BOX(&indexer_q_rope_quant));
  m.impl("fp8_paged_mqa_logits", TORCH_BOX(&fp8_paged_mqa_logits));
  m.impl("fp8_mqa_logits", TORCH_BOX(&fp8_mqa_logits));
  m.impl("fp8_paged_mqa_topk", TORCH_BOX(&fp8_paged_mqa_topk));
  m.impl("indexer_q_rope_quant.format", TORCH_BOX(&indexer_q_rope_quant_format));
  m.impl("fp8_paged_mqa_logits.format", TORCH_BOX(&fp8_paged_mqa_logits_format));
  m.impl("fp8_mqa_logits.format", TORCH_BOX(&fp8_mqa_logits_format));
  m.impl("fp8_paged_mqa_topk.format", TORCH_BOX(&fp8_paged_mqa_topk_format));
  m.impl("indexer_k_norm_rope_store", TORCH_BOX(&indexer_k_norm_rope_store));
}

}  // namespace dsv4::api
