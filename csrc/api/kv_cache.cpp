// Bindings of the KV-cache writers and the gather (every attention record, the SWA insert, indexer K): checks, then
// tensor -> params, then the selected tier.
#include <string>
#include <vector>

#include <torch/csrc/stable/library.h>

#include "api/checks.h"
#include "api/backend.h"

namespace dsv4::api {
namespace {

// `a` names the argument that carries the head dim (kv's last dimension, or head_dim itself).
KvLayout layout_for_head_dim(Arg a, int64_t head_dim) {
  DSV4_CHECK(head_dim == kModel1HeadDim || head_dim == kV32HeadDim, a.op, "argument '", a.name, "' head dim must be ",
             kModel1HeadDim, " (MODEL1 layout) or ", kV32HeadDim, " (V32 layout), got ", head_dim);
  return head_dim == kModel1HeadDim ? KvLayout::model1 : KvLayout::v32;
}

// `layout` "auto": MODEL1 for 512 dims, V32 for 576 (the records a head dim alone names).
KvLayout resolve_layout(Arg a, const std::string& layout, Arg head_dim_arg, int64_t head_dim) {
  if (layout == "auto") return layout_for_head_dim(head_dim_arg, head_dim);
  const KvLayout l = parse_layout(a, layout);
  DSV4_CHECK(record_head_dim(l) == head_dim, a.op, "argument '", head_dim_arg.name, "' head dim must be ",
             record_head_dim(l), " for the ", layout, " record, got ", head_dim);
  return l;
}

void quantize_kv_insert_layout(Tensor kv, Tensor slot_mapping, Tensor kv_cache, int64_t block_size,
                               std::string layout, std::string placement) {
  const char* op = "quantize_kv_insert";
  const DeviceScope scope(kv);
  check_same_device(op, kv, {{"slot_mapping", &slot_mapping}, {"kv_cache", &kv_cache}});
  check_dim({op, "kv"}, kv, 2);
  QuantizeKvInsertParams p;
  p.layout = resolve_layout({op, "layout"}, layout, {op, "kv"}, kv.size(1));
  p.dtype = float_dtype({op, "kv"}, kv);
  check_last_dim_contiguous({op, "kv"}, kv);
  p.slots = index_view({op, "slot_mapping"}, slot_mapping, 1);
  check_size({op, "slot_mapping"}, slot_mapping, 0, kv.size(0));
  p.cache = record_cache({op, "kv_cache"}, kv_cache, block_size, p.layout,
                         parse_placement({op, "placement"}, placement, p.layout));
  check_no_overlap(op, "kv_cache", kv_cache, {{"kv", &kv}, {"slot_mapping", &slot_mapping}});
  p.kv = kv.const_data_ptr();
  p.num_tokens = kv.size(0);
  p.kv_stride = kv.stride(0);
  check_write_slots({op, "slot_mapping"}, p.slots, p.num_tokens, p.cache.num_blocks * block_size);
  backend_kernels().quantize_kv_insert(p);
}

void quantize_kv_insert(Tensor kv, Tensor slot_mapping, Tensor kv_cache, int64_t block_size) {
  quantize_kv_insert_layout(kv, slot_mapping, kv_cache, block_size, "auto", "page_split");
}

Tensor dequantize_kv_gather_layout(Tensor kv_cache, Tensor slots, int64_t block_size, std::string layout,
                                   std::string placement) {
  const char* op = "dequantize_kv_gather";
  const DeviceScope scope(kv_cache);
  check_same_device(op, kv_cache, {{"slots", &slots}});
  DequantizeKvGatherParams p;
  p.layout = parse_layout({op, "layout"}, layout);
  const int64_t head_dim = record_head_dim(p.layout);
  p.cache = record_cache({op, "kv_cache"}, kv_cache, block_size, p.layout,
                         parse_placement({op, "placement"}, placement, p.layout));
  check_dtype({op, "slots"}, slots, {ScalarType::Int, ScalarType::Long});
  const Tensor flat = torch::stable::reshape(torch::stable::contiguous(slots), {slots.numel()});
  p.slots = index_view({op, "slots"}, flat, 1);
  p.num_slots = flat.numel();
  std::vector<int64_t> shape(slots.sizes().begin(), slots.sizes().end());
  shape.push_back(head_dim);
  Tensor out = torch::stable::empty(shape, ScalarType::BFloat16, std::nullopt, kv_cache.device());
  p.out = static_cast<uint16_t*>(out.data_ptr());
  backend_kernels().dequantize_kv_gather(p);
  return out;
}

Tensor dequantize_kv_gather(Tensor kv_cache, Tensor slots, int64_t block_size, int64_t head_dim) {
  const KvLayout layout = layout_for_head_dim({"dequantize_kv_gather", "head_dim"}, head_dim);
  return dequantize_kv_gather_layout(kv_cache, slots, block_size, layout_name(layout), "page_split");
}

void qnorm_rope_kv_insert_layout(Tensor q, Tensor kv, Tensor positions, Tensor cos_sin_cache, Tensor slot_mapping,
                                 Tensor kv_cache, int64_t block_size, double eps, Tensor q_out, bool q_norm,
                                 std::string layout, std::string placement) {
  const char* op = "qnorm_rope_kv_insert";
  const DeviceScope scope(q);
  check_same_device(op, q, {{"kv", &kv}, {"positions", &positions}, {"cos_sin_cache", &cos_sin_cache},
                            {"slot_mapping", &slot_mapping}, {"kv_cache", &kv_cache}, {"q_out", &q_out}});
  QNormRopeKvInsertParams p;
  p.dtype = float_dtype({op, "q"}, q);
  check_dim({op, "q"}, q, 3);
  check_size({op, "q"}, q, 2, kModel1HeadDim);
  check_last_dim_contiguous({op, "q"}, q);
  check_dim({op, "kv"}, kv, 2);
  check_size({op, "kv"}, kv, 1, kModel1HeadDim);
  check_same_dtype({op, "kv"}, kv, "q", q);
  check_last_dim_contiguous({op, "kv"}, kv);
  p.positions = index_view({op, "positions"}, positions, 1);
  check_size({op, "positions"}, positions, 0, q.size(0));
  p.slots = index_view({op, "slot_mapping"}, slot_mapping, 1);
  DSV4_CHECK(slot_mapping.size(0) <= q.size(0) && slot_mapping.size(0) <= kv.size(0), op,
             "argument 'slot_mapping' has ", slot_mapping.size(0), " entries but q has ", q.size(0), " tokens and kv ",
             kv.size(0), " rows (one slot per inserted token, at most one per token)");
  p.rope = rope_table({op, "cos_sin_cache"}, cos_sin_cache, kModel1RopeDim);
  p.layout = parse_layout({op, "layout"}, layout);
  DSV4_CHECK(p.layout != KvLayout::v32, op, "argument 'layout' must be a 512-dim record (model1, v41_fp8, v41_fp4), ",
             "got v32");
  p.q_norm = q_norm;
  p.cache = record_cache({op, "kv_cache"}, kv_cache, block_size, p.layout,
                         parse_placement({op, "placement"}, placement, p.layout));
  check_dim({op, "q_out"}, q_out, 3);
  check_dtype({op, "q_out"}, q_out, {q.scalar_type()});
  check_contiguous({op, "q_out"}, q_out);
  check_size({op, "q_out"}, q_out, 0, q.size(0));
  check_size({op, "q_out"}, q_out, 2, kModel1HeadDim);
  DSV4_CHECK(q_out.size(1) >= q.size(1), op, "argument 'q_out' has ", q_out.size(1), " heads, fewer than q's ", q.size(1));
  check_positive({op, "eps"}, double(float(eps)));  // the kernels compute in fp32
  check_no_overlap(op, "q_out", q_out, {{"q", &q}, {"kv", &kv}, {"kv_cache", &kv_cache}, {"positions", &positions},
                                        {"cos_sin_cache", &cos_sin_cache}, {"slot_mapping", &slot_mapping}});
  check_no_overlap(op, "kv_cache", kv_cache, {{"q", &q}, {"kv", &kv}, {"positions", &positions},
                                              {"cos_sin_cache", &cos_sin_cache}, {"slot_mapping", &slot_mapping}});
  p.q = q.const_data_ptr();
  p.num_tokens = q.size(0), p.num_heads = q.size(1), p.q_stride_t = q.stride(0), p.q_stride_h = q.stride(1);
  p.q_out = q_out.data_ptr();
  p.padded_heads = q_out.size(1);
  p.kv = kv.const_data_ptr();
  p.num_kv_tokens = slot_mapping.size(0);
  p.kv_stride_t = kv.stride(0);
  p.eps = float(eps);
  check_values_in_range({op, "positions"}, p.positions, p.num_tokens, p.rope.rows);
  check_write_slots({op, "slot_mapping"}, p.slots, p.num_kv_tokens, p.cache.num_blocks * block_size);
  backend_kernels().qnorm_rope_kv_insert(p);
}

void qnorm_rope_kv_insert(Tensor q, Tensor kv, Tensor positions, Tensor cos_sin_cache, Tensor slot_mapping,
                          Tensor kv_cache, int64_t block_size, double eps, Tensor q_out) {
  qnorm_rope_kv_insert_layout(q, kv, positions, cos_sin_cache, slot_mapping, kv_cache, block_size, eps, q_out, true,
                              "model1", "page_split");
}

void indexer_k_quant_insert_format(Tensor k, Tensor slot_mapping, Tensor kv_cache, int64_t block_size,
                                   std::string key_format) {
  const char* op = "indexer_k_quant_insert";
  const DeviceScope scope(k);
  check_same_device(op, k, {{"slot_mapping", &slot_mapping}, {"kv_cache", &kv_cache}});
  IndexerKQuantInsertParams p;
  p.key_format = parse_indexer_format({op, "key_format"}, key_format);
  p.dtype = float_dtype({op, "k"}, k);
  check_dim({op, "k"}, k, 2);
  check_size({op, "k"}, k, 1, kIndexerHeadDim);
  check_last_dim_contiguous({op, "k"}, k);
  p.slots = index_view({op, "slot_mapping"}, slot_mapping, 1);
  check_size({op, "slot_mapping"}, slot_mapping, 0, k.size(0));
  p.cache = paged_cache({op, "kv_cache"}, kv_cache, block_size, indexer_entry_bytes(p.key_format));
  check_no_overlap(op, "kv_cache", kv_cache, {{"k", &k}, {"slot_mapping", &slot_mapping}});
  p.k = k.const_data_ptr();
  p.num_tokens = k.size(0);
  p.k_stride = k.stride(0);
  check_write_slots({op, "slot_mapping"}, p.slots, p.num_tokens, p.cache.num_blocks * block_size);
  backend_kernels().indexer_k_quant_insert(p);
}

void indexer_k_quant_insert(Tensor k, Tensor slot_mapping, Tensor kv_cache, int64_t block_size) {
  indexer_k_quant_insert_format(k, slot_mapping, kv_cache, block_size, "fp8");
}

}  // namespace

DSV4_BACKEND_IMPL(m) {
  m.impl("quantize_kv_insert", TORCH_BOX(&quantize_kv_insert));
  m.impl("quantize_kv_insert.layout", TORCH_BOX(&quantize_kv_insert_layout));
  m.impl("dequantize_kv_gather", TORCH_BOX(&dequantize_kv_gather));
  m.impl("dequantize_kv_gather.layout", TORCH_BOX(&dequantize_kv_gather_layout));
  m.impl("qnorm_rope_kv_insert", TORCH_BOX(&qnorm_rope_kv_insert));
  m.impl("qnorm_rope_kv_insert.layout", TORCH_BOX(&qnorm_rope_kv_insert_layout));
  m.impl("indexer_k_quant_insert", TORCH_BOX(&indexer_k_quant_insert));
  m.impl("indexer_k_quant_insert.format", TORCH_BOX(&indexer_k_quant_insert_format));
}

}  // namespace dsv4::api
