// The public op contract: every dsv4 schema, in one place. Schemas are API: never change one
// in place; add a new op or overload. Kernels register per device in csrc/api/*.cpp.
#include <Python.h>

#include <string>
#include <vector>

#include <torch/csrc/stable/library.h>

#include "common/decode_schedule.h"
#include "cpu/isa_select.h"

STABLE_TORCH_LIBRARY(dsv4, m) {
  // ---- KV-cache writers and helpers ----
  m.def("qnorm_rope_kv_insert(Tensor q, Tensor kv, Tensor positions, Tensor cos_sin_cache, Tensor slot_mapping, "
        "Tensor(a!) kv_cache, int block_size, float eps, Tensor(b!) q_out) -> ()");
  // V4.1: q_norm False (RoPE only) and the kv record named (model1, v41_fp8, v41_fp4) with its placement.
  m.def("qnorm_rope_kv_insert.layout(Tensor q, Tensor kv, Tensor positions, Tensor cos_sin_cache, "
        "Tensor slot_mapping, Tensor(a!) kv_cache, int block_size, float eps, Tensor(b!) q_out, bool q_norm, "
        "str layout, str placement) -> ()");
  m.def("indexer_q_rope_quant(Tensor q, Tensor positions, Tensor cos_sin_cache, Tensor weights, float softmax_scale, "
        "float head_scale, Tensor(a!) q_fp8, Tensor(b!) weights_out) -> ()");
  m.def("save_partial_states(Tensor kv, Tensor score, Tensor ape, Tensor positions, Tensor(a!) state_cache, "
        "Tensor slot_mapping) -> ()");
  m.def("compress_norm_rope_store(Tensor state_cache, Tensor gather_slots, Tensor positions, Tensor kv_slot_mapping, "
        "Tensor rms_norm_weight, float rms_norm_eps, Tensor cos_sin_cache, Tensor(a!) kv_cache, int block_size, "
        "int compress_ratio) -> ()");
  // The same into any 512-dim record (model1, v41_fp8, v41_fp4) in either V4.1 placement (page_split, per_token);
  // latent_out (bf16 [T, 512]) also receives each written entry before its RoPE (V4.1's indexer keys start there).
  m.def("compress_norm_rope_store.layout(Tensor state_cache, Tensor gather_slots, Tensor positions, "
        "Tensor kv_slot_mapping, Tensor rms_norm_weight, float rms_norm_eps, Tensor cos_sin_cache, Tensor(a!) kv_cache, "
        "int block_size, int compress_ratio, str layout, str placement, Tensor(b!)? latent_out=None) -> ()");
  m.def("compress_norm_rope_store_indexer(Tensor state_cache, Tensor gather_slots, Tensor positions, "
        "Tensor kv_slot_mapping, Tensor rms_norm_weight, float rms_norm_eps, Tensor cos_sin_cache, Tensor(a!) kv_cache, "
        "int block_size, int compress_ratio) -> ()");
  m.def("quantize_kv_insert(Tensor kv, Tensor slot_mapping, Tensor(a!) kv_cache, int block_size) -> ()");
  m.def("dequantize_kv_gather(Tensor kv_cache, Tensor slots, int block_size, int head_dim) -> Tensor");
  // Overloads naming the record (model1, v32, v41_fp8, v41_fp4; "auto": by head dim) and the V4.1 placement.
  m.def("quantize_kv_insert.layout(Tensor kv, Tensor slot_mapping, Tensor(a!) kv_cache, int block_size, str layout, "
        "str placement) -> ()");
  m.def("dequantize_kv_gather.layout(Tensor kv_cache, Tensor slots, int block_size, str layout, str placement) "
        "-> Tensor");
  m.def("indexer_k_quant_insert(Tensor k, Tensor slot_mapping, Tensor(a!) kv_cache, int block_size) -> ()");
  // The indexer key format named: fp8 (132 B entries) or mxfp4 (68 B, DeepSeek-V4.1).
  m.def("indexer_k_quant_insert.format(Tensor k, Tensor slot_mapping, Tensor(a!) kv_cache, int block_size, "
        "str key_format) -> ()");
  m.def("map_local_to_global_slots(Tensor local_indices, Tensor req_ids, Tensor block_table, int block_size) -> Tensor");
  m.def("inverse_rope(Tensor o, Tensor positions, Tensor cos_sin_cache, Tensor(a!) out) -> ()");
  // ---- lightning indexer ----
  m.def("fp8_paged_mqa_logits(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_table, "
        "int block_size, int max_context_len, bool clean_logits, Tensor? schedule_meta=None) -> Tensor");
  m.def("fp8_mqa_logits(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor ks, Tensor ke, "
        "bool clean_logits) -> Tensor");
  m.def("topk_transform(Tensor scores, Tensor lengths, Tensor? row_starts, Tensor? page_table, int page_size, "
        "Tensor(a!) raw_indices, Tensor(b!)? slot_indices) -> ()");
  // Fused paged logits + top-k per row, without materialising the [rows, context] logits.
  m.def("fp8_paged_mqa_topk(Tensor q, Tensor kv_cache, Tensor weights, Tensor lengths, Tensor block_table, "
        "Tensor row_requests, int block_size, Tensor(a!) topk_indices) -> ()");
  // DeepSeek-V4.1: mxfp4 queries (uint8 e2m1 pairs with their UE8M0 bytes in q_scale; None: e4m3 q) and the cache's
  // key format (fp8 or mxfp4); the query's format for indexer_q_rope_quant (mxfp4 writes q_scale_out).
  m.def("indexer_q_rope_quant.format(Tensor q, Tensor positions, Tensor cos_sin_cache, Tensor weights, "
        "float softmax_scale, float head_scale, Tensor(a!) q_fp8, Tensor(b!) weights_out, str query_format, "
        "Tensor(c!)? q_scale_out) -> ()");
  m.def("fp8_paged_mqa_logits.format(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, "
        "Tensor block_table, int block_size, int max_context_len, bool clean_logits, Tensor? schedule_meta, "
        "Tensor? q_scale, str key_format) -> Tensor");
  m.def("fp8_mqa_logits.format(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor ks, Tensor ke, "
        "bool clean_logits, Tensor? q_scale, str key_format) -> Tensor");
  m.def("fp8_paged_mqa_topk.format(Tensor q, Tensor kv_cache, Tensor weights, Tensor lengths, Tensor block_table, "
        "Tensor row_requests, int block_size, Tensor(a!) topk_indices, Tensor? q_scale, str key_format) -> ()");
  // DeepSeek-V4.1's index key: RMSNorm (weighted) + RoPE at the group's first position + quantize, for the tokens
  // that close a compression group, into an indexer K cache of key_format entries.
  m.def("indexer_k_norm_rope_store(Tensor k_pre, Tensor positions, Tensor cos_sin_cache, Tensor norm_weight, "
        "float eps, Tensor(a!) kv_cache, Tensor slot_mapping, int block_size, int compress_ratio, str key_format) "
        "-> ()");
  // ---- sparse MLA attention ----
  m.def("sparse_mla_decode(Tensor q, Tensor kv_cache, Tensor indices, Tensor? topk_length, Tensor? attn_sink, "
        "Tensor? extra_kv_cache, Tensor? extra_indices, Tensor? extra_topk_length, int block_size, "
        "int extra_block_size, int head_dim_v, float sm_scale, Tensor? tile_scheduler_metadata=None, "
        "Tensor? num_splits=None) -> (Tensor, Tensor)");
  // The records of the two caches named: (model1, model1), (v32, v32), (v41_fp8, v41_fp8), (v41_fp8, v41_fp4).
  m.def("sparse_mla_decode.layout(Tensor q, Tensor kv_cache, Tensor indices, Tensor? topk_length, Tensor? attn_sink, "
        "Tensor? extra_kv_cache, Tensor? extra_indices, Tensor? extra_topk_length, int block_size, "
        "int extra_block_size, int head_dim_v, float sm_scale, Tensor? tile_scheduler_metadata, Tensor? num_splits, "
        "str layout, str extra_layout, str placement) -> (Tensor, Tensor)");
  // FlashMLA's decode split plan (tile_scheduler_metadata [parts, 8] int32, num_splits [b + 1] int32).
  m.def("sparse_mla_decode_schedule(Tensor q, Tensor indices, Tensor? topk_length, Tensor? extra_indices, "
        "Tensor? extra_topk_length) -> (Tensor, Tensor)");
  m.def("sparse_mla_prefill(Tensor q, Tensor kv, Tensor indices, float sm_scale, int head_dim_v, Tensor? attn_sink, "
        "Tensor? topk_length) -> (Tensor, Tensor, Tensor)");
  // The decode planner's numbers (csrc/common/decode_schedule.h), for fake kernels and tests: its partitions for
  // `units` SMs or threads, and [entries per block, per-piece cost, combine cost] in blocks.
  m.def("_sparse_mla_decode_partitions(int units, int s_q, int h_q) -> int");
  m.def("_sparse_mla_decode_plan_costs() -> int[]");
  // ---- build and CPU-tier information ----
  m.def("cpu_isa() -> str");
  m.def("supported_cpu_isas() -> str");
  m.def("cpu_isa_order() -> str");  // why supported_cpu_isas is in its order here
  m.def("_set_cpu_isa(str isa) -> str");
}

namespace {
std::string cpu_isa() { return dsv4::cpu::kernels().isa_name; }
std::string supported_cpu_isas() { return dsv4::cpu::supported_isas(); }
std::string cpu_isa_order() { return dsv4::cpu::isa_order_reason(); }
std::string set_cpu_isa(std::string isa) { return dsv4::cpu::set_isa(isa).isa_name; }
int64_t decode_partitions(int64_t units, int64_t s_q, int64_t h_q) { return dsv4::decode_partitions(units, s_q, h_q); }
std::vector<int64_t> decode_plan_costs() {
  return {dsv4::kDecodeBlockEntries, dsv4::kDecodeFixedCostBlocks, dsv4::kDecodeCombineCostBlocks};
}
}  // namespace

STABLE_TORCH_LIBRARY_IMPL(dsv4, CompositeExplicitAutograd, m) {
  m.impl("cpu_isa", TORCH_BOX(&cpu_isa));
  m.impl("supported_cpu_isas", TORCH_BOX(&supported_cpu_isas));
  m.impl("cpu_isa_order", TORCH_BOX(&cpu_isa_order));
  m.impl("_set_cpu_isa", TORCH_BOX(&set_cpu_isa));
  m.impl("_sparse_mla_decode_partitions", TORCH_BOX(&decode_partitions));
  m.impl("_sparse_mla_decode_plan_costs", TORCH_BOX(&decode_plan_costs));
}

// `import dsv4._C` loads this library (and so registers the ops); it exposes no Python names.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
