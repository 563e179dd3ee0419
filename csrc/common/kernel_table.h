// One function per op over its parameter struct: every CPU ISA tier and the CUDA tier fill one.
#pragma once
#include "common/params.h"

namespace dsv4 {

struct KernelTable {
  const char* isa_name;  // CPU tier or CUDA tier name
  void (*qnorm_rope_kv_insert)(const QNormRopeKvInsertParams&);
  void (*indexer_q_rope_quant)(const IndexerQRopeQuantParams&);
  void (*save_partial_states)(const SavePartialStatesParams&);
  void (*compress_norm_rope_store)(const CompressNormRopeStoreParams&);
  void (*quantize_kv_insert)(const QuantizeKvInsertParams&);
  void (*dequantize_kv_gather)(const DequantizeKvGatherParams&);
  void (*indexer_k_quant_insert)(const IndexerKQuantInsertParams&);
  void (*map_local_to_global_slots)(const MapLocalToGlobalSlotsParams&);
  void (*inverse_rope)(const InverseRopeParams&);
  void (*fp8_paged_mqa_logits)(const PagedMqaLogitsParams&);
  void (*fp8_mqa_logits)(const MqaLogitsParams&);
  void (*topk_transform)(const TopkTransformParams&);
  void (*fp8_paged_mqa_topk)(const PagedMqaTopkParams&);
  void (*sparse_mla_decode)(const SparseMlaDecodeParams&);
  void (*sparse_mla_decode_schedule)(const SparseMlaDecodeParams&);  // fills p.sched (the plan only)
  void (*sparse_mla_prefill)(const SparseMlaPrefillParams&);
};

}  // namespace dsv4
