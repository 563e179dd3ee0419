// Bindings of the sparse MLA attention ops (FlashMLA sparse decode over fp8 caches, sparse prefill on bf16 kv).
#include <optional>
#include <string>
#include <tuple>

#include <torch/csrc/stable/library.h>

#include "api/backend.h"
#include "api/checks.h"
#include "common/decode_schedule.h"

namespace dsv4::api {
namespace {

constexpr int64_t kHeadDimV = 512, kMaxHeads = 128;

void check_query(const char* op, const Tensor& q, int64_t rank, int64_t head_dim_v) {
  check_dtype({op, "q"}, q, {ScalarType::BFloat16});
  check_dim({op, "q"}, q, rank);
  const int64_t d_qk = q.size(rank - 1), heads = q.size(rank - 2);
  DSV4_CHECK(d_qk == kModel1HeadDim || d_qk == kV32HeadDim, op, "argument 'q' must have head dim d_qk ", kModel1HeadDim,
             " (MODEL1) or ", kV32HeadDim, " (V32), got shape ", shape_str(q));
  DSV4_CHECK(heads >= 1 && heads <= kMaxHeads, op, "argument 'q' must have 1 to ", kMaxHeads, " heads (dimension ",
             rank - 2, "), got shape ", shape_str(q));
  check_last_dim_contiguous({op, "q"}, q);
  DSV4_CHECK(head_dim_v == kHeadDimV, op, "argument 'head_dim_v' must be ", kHeadDimV, ", got ", head_dim_v);
}

// int32/int64 indices [rows, cols, >= min_topk].
void check_indices(Arg a, const Tensor& t, int64_t rows, int64_t cols, int64_t min_topk) {
  check_dtype(a, t, {ScalarType::Int, ScalarType::Long});
  check_dim(a, t, 3);
  check_size(a, t, 0, rows);
  check_size(a, t, 1, cols);
  DSV4_CHECK(t.size(2) >= min_topk, a.op, "argument '", a.name, "' must have at least ", min_topk,
             " columns, got shape ", shape_str(t));
}

std::optional<IndexView> optional_lengths(Arg a, const std::optional<Tensor>& t, int64_t size) {
  if (!t) return std::nullopt;
  IndexView v = index_view(a, *t, 1);
  check_size(a, *t, 0, size);
  return v;
}

// A contiguous fp32 [heads] sink, or nullopt.
std::optional<Tensor> checked_sink(const char* op, const std::optional<Tensor>& sink, int64_t heads) {
  if (!sink) return std::nullopt;
  check_dtype({op, "attn_sink"}, *sink, {ScalarType::Float});
  check_dim({op, "attn_sink"}, *sink, 1);
  check_size({op, "attn_sink"}, *sink, 0, heads);
  return torch::stable::contiguous(*sink);
}

SparseIndexSet index_set(const Tensor& indices, std::optional<IndexView> lengths, const PagedCache& cache) {
  SparseIndexSet s;
  s.indices = indices.const_data_ptr();
  s.is_int64 = indices.scalar_type() == ScalarType::Long;
  s.stride_b = indices.stride(0), s.stride_s = indices.stride(1), s.stride_k = indices.stride(2);
  s.topk = indices.size(2);
  if (lengths) s.lengths = *lengths;
  s.cache = cache;
  return s;
}

// What the attention kernels spread their work over: the SMs on CUDA, the intra-op threads on the CPU.
int64_t parallel_units() {
#if defined(DSV4_BACKEND_CUDA)
  return cuda::num_sms();
#else
  return torch::stable::get_num_threads();
#endif
}

// Partitions of a decode plan: one persistent CTA group per SM on CUDA, one per intra-op thread on the CPU
// (informational there), shared by the s_q rows and 64-head groups.
int64_t decode_parts(int64_t s_q, int64_t h_q) { return decode_partitions(parallel_units(), s_q, h_q); }

// The plan tensors [num_parts, 8] and [b + 1] (int32, on q's device) wired into p.sched.
std::tuple<Tensor, Tensor> new_schedule(SparseMlaDecodeParams& p, const Tensor& q) {
  p.sched.num_parts = decode_parts(p.s_q, p.h_q);
  Tensor meta = torch::stable::empty({p.sched.num_parts, kDecodeSchedWords}, ScalarType::Int, std::nullopt, q.device());
  Tensor splits = torch::stable::empty({p.b + 1}, ScalarType::Int, std::nullopt, q.device());
  p.sched.sched_meta = static_cast<int32_t*>(meta.data_ptr());
  p.sched.num_splits = static_cast<int32_t*>(splits.data_ptr());
  p.sched.plan = true;
  return {meta, splits};
}

// A caller's plan (from sparse_mla_decode_schedule / get_mla_metadata): int32, contiguous, shaped for this batch.
void use_schedule(const char* op, SparseMlaDecodeParams& p, const Tensor& meta, const Tensor& splits) {
  check_dtype({op, "tile_scheduler_metadata"}, meta, {ScalarType::Int});
  check_dim({op, "tile_scheduler_metadata"}, meta, 2);
  check_size({op, "tile_scheduler_metadata"}, meta, 1, kDecodeSchedWords);
  DSV4_CHECK(meta.size(0) >= 1, op, "argument 'tile_scheduler_metadata' must have at least one partition, got shape ",
             shape_str(meta));
  check_contiguous({op, "tile_scheduler_metadata"}, meta);
  check_dtype({op, "num_splits"}, splits, {ScalarType::Int});
  check_dim({op, "num_splits"}, splits, 1);
  check_size({op, "num_splits"}, splits, 0, p.b + 1);
  check_contiguous({op, "num_splits"}, splits);
  p.sched.num_parts = meta.size(0);
  p.sched.sched_meta = static_cast<int32_t*>(const_cast<void*>(meta.const_data_ptr()));
  p.sched.num_splits = static_cast<int32_t*>(const_cast<void*>(splits.const_data_ptr()));
  p.sched.plan = false;
}

// Checks the two index sets of a decode (and their optional lengths) and fills p.b .. p.extra (cache views empty).
void decode_index_sets(const char* op, SparseMlaDecodeParams& p, const Tensor& indices,
                       const std::optional<Tensor>& topk_length, const std::optional<Tensor>& extra_indices,
                       const std::optional<Tensor>& extra_topk_length, const PagedCache& cache,
                       const PagedCache& extra_cache) {
  check_indices({op, "indices"}, indices, p.b, p.s_q, 1);
  p.main = index_set(indices, optional_lengths({op, "topk_length"}, topk_length, p.b), cache);
  if (extra_indices) {
    check_indices({op, "extra_indices"}, *extra_indices, p.b, p.s_q, 0);
    p.extra = index_set(*extra_indices, optional_lengths({op, "extra_topk_length"}, extra_topk_length, p.b),
                        extra_cache);
  }
  DSV4_CHECK(!extra_topk_length || extra_indices, op,
             "argument 'extra_topk_length' must be None without extra_indices");
}

// FlashMLA's get_decoding_sched_meta: the split plan of a decode with these shapes and lengths, on q's device
// (planned by a device kernel on CUDA, no host synchronisation), to pass to later sparse_mla_decode calls.
std::tuple<Tensor, Tensor> sparse_mla_decode_schedule(Tensor q, Tensor indices, std::optional<Tensor> topk_length,
                                                      std::optional<Tensor> extra_indices,
                                                      std::optional<Tensor> extra_topk_length) {
  const char* op = "sparse_mla_decode_schedule";
  const DeviceScope scope(q);
  check_same_device(op, q, {{"indices", &indices}, {"topk_length", present(topk_length)},
                            {"extra_indices", present(extra_indices)},
                            {"extra_topk_length", present(extra_topk_length)}});
  check_query(op, q, 4, kHeadDimV);
  SparseMlaDecodeParams p;
  p.b = q.size(0), p.s_q = q.size(1), p.h_q = q.size(2), p.d_qk = q.size(3);
  decode_index_sets(op, p, indices, topk_length, extra_indices, extra_topk_length, PagedCache{}, PagedCache{});
  auto plan = new_schedule(p, q);
  backend_kernels().sparse_mla_decode_schedule(p);
  return plan;
}

// tile_scheduler_metadata and num_splits: FlashMLA's split plan. CUDA plans on the device when they are None;
// the CPU kernel balances its own work and ignores them.
// The (main, extra) records of a decode: "auto" gives MODEL1 for d_qk 512 and V32 for 576, the extra set's the main
// set's. Pairs: (model1, model1), (v32, v32), (v41_fp8, v41_fp8), (v41_fp8, v41_fp4).
std::pair<KvLayout, KvLayout> decode_layouts(const char* op, int64_t d_qk, const std::string& layout,
                                             const std::string& extra_layout) {
  const KvLayout main = layout == "auto" ? (d_qk == kModel1HeadDim ? KvLayout::model1 : KvLayout::v32)
                                         : parse_layout({op, "layout"}, layout);
  const KvLayout extra = extra_layout == "auto" ? main : parse_layout({op, "extra_layout"}, extra_layout);
  DSV4_CHECK(record_head_dim(main) == d_qk, op, "argument 'q' head dim ", d_qk, " does not match the ",
             layout_name(main), " record of kv_cache (", record_head_dim(main), " dims)");
  const bool paired = main == extra || (main == KvLayout::v41_fp8 && extra == KvLayout::v41_fp4);
  DSV4_CHECK(main != KvLayout::v41_fp4 && paired, op, "records (layout, extra_layout) = (", layout_name(main), ", ",
             layout_name(extra), ") are not a supported pair; supported: (model1, model1), (v32, v32), ",
             "(v41_fp8, v41_fp8), (v41_fp8, v41_fp4)");
  return {main, extra};
}

std::tuple<Tensor, Tensor> sparse_mla_decode_layout(
    Tensor q, Tensor kv_cache, Tensor indices, std::optional<Tensor> topk_length, std::optional<Tensor> attn_sink,
    std::optional<Tensor> extra_kv_cache, std::optional<Tensor> extra_indices, std::optional<Tensor> extra_topk_length,
    int64_t block_size, int64_t extra_block_size, int64_t head_dim_v, double sm_scale,
    std::optional<Tensor> tile_scheduler_metadata, std::optional<Tensor> num_splits, std::string layout,
    std::string extra_layout, std::string placement) {
  const char* op = "sparse_mla_decode";
  const DeviceScope scope(q);
  check_same_device(op, q, {{"kv_cache", &kv_cache}, {"indices", &indices}, {"topk_length", present(topk_length)},
                            {"attn_sink", present(attn_sink)}, {"extra_kv_cache", present(extra_kv_cache)},
                            {"extra_indices", present(extra_indices)},
                            {"extra_topk_length", present(extra_topk_length)}});
  check_query(op, q, 4, head_dim_v);
  SparseMlaDecodeParams p;
  p.b = q.size(0), p.s_q = q.size(1), p.h_q = q.size(2), p.d_qk = q.size(3);
  const auto [main_layout, extra_layout_] = decode_layouts(op, p.d_qk, layout, extra_layout);
  const PagedCache cache = record_cache({op, "kv_cache"}, kv_cache, block_size, main_layout,
                                        parse_placement({op, "placement"}, placement, main_layout));
  const std::optional<Tensor> sink = checked_sink(op, attn_sink, p.h_q);
  DSV4_CHECK(extra_kv_cache.has_value() == extra_indices.has_value(), op,
             "argument 'extra_indices' must be given exactly when extra_kv_cache is, got extra_kv_cache ",
             extra_kv_cache ? "given" : "absent");
  PagedCache extra_cache;
  if (extra_kv_cache) {
    check_positive({op, "extra_block_size"}, extra_block_size);
    extra_cache = record_cache({op, "extra_kv_cache"}, *extra_kv_cache, extra_block_size, extra_layout_,
                               parse_placement({op, "placement"}, placement, extra_layout_));
  }
  decode_index_sets(op, p, indices, topk_length, extra_indices, extra_topk_length, cache, extra_cache);
  p.main.layout = main_layout, p.extra.layout = extra_layout_;
  DSV4_CHECK(tile_scheduler_metadata.has_value() == num_splits.has_value(), op,
             "arguments 'tile_scheduler_metadata' and 'num_splits' must be given together");
  p.q = static_cast<const uint16_t*>(q.const_data_ptr());
  p.q_stride_b = q.stride(0), p.q_stride_s = q.stride(1), p.q_stride_h = q.stride(2);
  p.attn_sink = sink ? static_cast<const float*>(sink->const_data_ptr()) : nullptr;
  p.d_v = kHeadDimV;
  p.sm_scale = float(sm_scale);
  p.threads = torch::stable::get_num_threads();
  Tensor out = torch::stable::empty({p.b, p.s_q, p.h_q, kHeadDimV}, ScalarType::BFloat16, std::nullopt, q.device());
  Tensor lse = torch::stable::empty({p.b, p.h_q, p.s_q}, ScalarType::Float, std::nullopt, q.device());
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.lse = static_cast<float*>(lse.data_ptr());
#if defined(DSV4_BACKEND_CUDA)
  std::optional<std::tuple<Tensor, Tensor>> own_plan;
  if (tile_scheduler_metadata) {
    check_same_device(op, q, {{"tile_scheduler_metadata", &*tile_scheduler_metadata}, {"num_splits", &*num_splits}});
    use_schedule(op, p, *tile_scheduler_metadata, *num_splits);
  } else {
    own_plan = new_schedule(p, q);
  }
  // fp32 partials of split pieces: at most one extra piece per partition beyond one per request.
  const int64_t split_rows = p.b + p.sched.num_parts;
  Tensor o_accum = torch::stable::empty({split_rows, p.s_q, p.h_q, kHeadDimV}, ScalarType::Float, std::nullopt,
                                        q.device());
  Tensor lse_accum = torch::stable::empty({split_rows, p.s_q, p.h_q}, ScalarType::Float, std::nullopt, q.device());
  p.sched.o_accum = static_cast<float*>(o_accum.data_ptr());
  p.sched.lse_accum = static_cast<float*>(lse_accum.data_ptr());
#endif
  backend_kernels().sparse_mla_decode(p);
  return {out, lse};
}

std::tuple<Tensor, Tensor> sparse_mla_decode(Tensor q, Tensor kv_cache, Tensor indices,
                                             std::optional<Tensor> topk_length, std::optional<Tensor> attn_sink,
                                             std::optional<Tensor> extra_kv_cache, std::optional<Tensor> extra_indices,
                                             std::optional<Tensor> extra_topk_length, int64_t block_size,
                                             int64_t extra_block_size, int64_t head_dim_v, double sm_scale,
                                             std::optional<Tensor> tile_scheduler_metadata,
                                             std::optional<Tensor> num_splits) {
  return sparse_mla_decode_layout(q, kv_cache, indices, topk_length, attn_sink, extra_kv_cache, extra_indices,
                                  extra_topk_length, block_size, extra_block_size, head_dim_v, sm_scale,
                                  tile_scheduler_metadata, num_splits, "auto", "auto", "page_split");
}

std::tuple<Tensor, Tensor, Tensor> sparse_mla_prefill(Tensor q, Tensor kv, Tensor indices, double sm_scale,
                                                      int64_t head_dim_v, std::optional<Tensor> attn_sink,
                                                      std::optional<Tensor> topk_length) {
  const char* op = "sparse_mla_prefill";
  const DeviceScope scope(q);
  check_same_device(op, q, {{"kv", &kv}, {"indices", &indices}, {"attn_sink", present(attn_sink)},
                            {"topk_length", present(topk_length)}});
  check_query(op, q, 3, head_dim_v);
  SparseMlaPrefillParams p;
  p.s_q = q.size(0), p.h_q = q.size(1), p.d_qk = q.size(2);
  check_dtype({op, "kv"}, kv, {ScalarType::BFloat16});
  check_dim({op, "kv"}, kv, 3);
  check_size({op, "kv"}, kv, 1, 1);
  check_size({op, "kv"}, kv, 2, p.d_qk);
  check_last_dim_contiguous({op, "kv"}, kv);
  check_indices({op, "indices"}, indices, p.s_q, 1, 1);
  const std::optional<Tensor> sink = checked_sink(op, attn_sink, p.h_q);
  if (const auto lengths = optional_lengths({op, "topk_length"}, topk_length, p.s_q)) p.topk_length = *lengths;
  p.q = static_cast<const uint16_t*>(q.const_data_ptr());
  p.q_stride_s = q.stride(0), p.q_stride_h = q.stride(1);
  p.kv = static_cast<const uint16_t*>(kv.const_data_ptr());
  p.s_kv = kv.size(0), p.kv_stride = kv.stride(0);
  p.indices = indices.const_data_ptr();
  p.is_int64 = indices.scalar_type() == ScalarType::Long;
  p.idx_stride_s = indices.stride(0), p.idx_stride_k = indices.stride(2), p.topk = indices.size(2);
  p.attn_sink = sink ? static_cast<const float*>(sink->const_data_ptr()) : nullptr;
  p.d_v = kHeadDimV;
  p.sm_scale = float(sm_scale);
  p.threads = parallel_units();
  Tensor out = torch::stable::empty({p.s_q, p.h_q, kHeadDimV}, ScalarType::BFloat16, std::nullopt, q.device());
  Tensor max_logits = torch::stable::empty({p.s_q, p.h_q}, ScalarType::Float, std::nullopt, q.device());
  Tensor lse = torch::stable::empty({p.s_q, p.h_q}, ScalarType::Float, std::nullopt, q.device());
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.max_logits = static_cast<float*>(max_logits.data_ptr());
  p.lse = static_cast<float*>(lse.data_ptr());
  backend_kernels().sparse_mla_prefill(p);
  return {out, max_logits, lse};
}

}  // namespace

DSV4_BACKEND_IMPL(m) {
  m.impl("sparse_mla_decode", TORCH_BOX(&sparse_mla_decode));
  m.impl("sparse_mla_decode.layout", TORCH_BOX(&sparse_mla_decode_layout));
  m.impl("sparse_mla_prefill", TORCH_BOX(&sparse_mla_prefill));
  m.impl("sparse_mla_decode_schedule", TORCH_BOX(&sparse_mla_decode_schedule));
}

}  // namespace dsv4::api
