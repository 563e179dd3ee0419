// Bindings of the KV-cache writers and the gather (MODEL1 / V32 records, the SWA insert, indexer K): checks, then
// tensor -> params, then the selected tier.
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

void quantize_kv_insert(Tensor kv, Tensor slot_mapping, Tensor kv_cache, int64_t block_size) {
  const char* op = "quantize_kv_insert";
  const DeviceScope scope(kv);
  check_same_device(op, kv, {{"slot_mapping", &slot_mapping}, {"kv_cache", &kv_cache}});
  check_dim({op, "kv"}, kv, 2);
  QuantizeKvInsertParams p;
  p.layout = layout_for_head_dim({op, "kv"}, kv.size(1));
  p.dtype = float_dtype({op, "kv"}, kv);
  check_last_dim_contiguous({op, "kv"}, kv);
  p.slots = index_view({op, "slot_mapping"}, slot_mapping, 1);
  check_size({op, "slot_mapping"}, slot_mapping, 0, kv.size(0));
  p.cache = paged_cache({op, "kv_cache"}, kv_cache, block_size, bytes_per_entry(p.layout));
  check_no_overlap(op, "kv_cache", kv_cache, {{"kv", &kv}, {"slot_mapping", &slot_mapping}});
  p.kv = kv.const_data_ptr();
  p.num_tokens = kv.size(0);
  p.kv_stride = kv.stride(0);
  check_write_slots({op, "slot_mapping"}, p.slots, p.num_tokens, p.cache.num_blocks * block_size);
  backend_kernels().quantize_kv_insert(p);
}

Tensor dequantize_kv_gather(Tensor kv_cache, Tensor slots, int64_t block_size, int64_t head_dim) {
  const char* op = "dequantize_kv_gather";
  const DeviceScope scope(kv_cache);
  check_same_device(op, kv_cache, {{"slots", &slots}});
  DequantizeKvGatherParams p;
  p.layout = layout_for_head_dim({op, "head_dim"}, head_dim);
  p.cache = paged_cache({op, "kv_cache"}, kv_cache, block_size, bytes_per_entry(p.layout));
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

void qnorm_rope_kv_insert(Tensor q, Tensor kv, Tensor positions, Tensor cos_sin_cache, Tensor slot_mapping,
                          Tensor kv_cache, int64_t block_size, double eps, Tensor q_out) {
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
  p.cache = paged_cache({op, "kv_cache"}, kv_cache, block_size, kModel1BytesPerEntry);
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

void indexer_k_quant_insert(Tensor k, Tensor slot_mapping, Tensor kv_cache, int64_t block_size) {
  const char* op = "indexer_k_quant_insert";
  const DeviceScope scope(k);
  check_same_device(op, k, {{"slot_mapping", &slot_mapping}, {"kv_cache", &kv_cache}});
  IndexerKQuantInsertParams p;
  p.dtype = float_dtype({op, "k"}, k);
  check_dim({op, "k"}, k, 2);
  check_size({op, "k"}, k, 1, kIndexerHeadDim);
  check_last_dim_contiguous({op, "k"}, k);
  p.slots = index_view({op, "slot_mapping"}, slot_mapping, 1);
  check_size({op, "slot_mapping"}, slot_mapping, 0, k.size(0));
  p.cache = paged_cache({op, "kv_cache"}, kv_cache, block_size, kIndexerBytesPerEntry);
  check_no_overlap(op, "kv_cache", kv_cache, {{"k", &k}, {"slot_mapping", &slot_mapping}});
  p.k = k.const_data_ptr();
  p.num_tokens = k.size(0);
  p.k_stride = k.stride(0);
  check_write_slots({op, "slot_mapping"}, p.slots, p.num_tokens, p.cache.num_blocks * block_size);
  backend_kernels().indexer_k_quant_insert(p);
}

}  // namespace

DSV4_BACKEND_IMPL(m) {
  m.impl("quantize_kv_insert", TORCH_BOX(&quantize_kv_insert));
  m.impl("dequantize_kv_gather", TORCH_BOX(&dequantize_kv_gather));
  m.impl("qnorm_rope_kv_insert", TORCH_BOX(&qnorm_rope_kv_insert));
  m.impl("indexer_k_quant_insert", TORCH_BOX(&indexer_k_quant_insert));
}

}  // namespace dsv4::api
