// Every op with a kernel, once, in table order: X(name, Params, hopper). `hopper` is 1 where the CUDA table picks a
// Hopper (sm_90a) launcher on compute capability 9.0 and the portable one elsewhere. The kernel table's fields, each
// CPU tier's table, the CUDA launchers' declarations and the CUDA table are all generated from this list, so an
// entry can neither be missing from a tier nor land in another op's slot (docs/dev.md, "Adding an op").
#pragma once
#include "common/params.h"

#define DSV4_OPS(X)                                                                                   \
  X(qnorm_rope_kv_insert, QNormRopeKvInsertParams, 0)                                                 \
  X(indexer_q_rope_quant, IndexerQRopeQuantParams, 0)                                                 \
  X(save_partial_states, SavePartialStatesParams, 0)                                                  \
  X(compress_norm_rope_store, CompressNormRopeStoreParams, 0)                                         \
  X(quantize_kv_insert, QuantizeKvInsertParams, 0)                                                    \
  X(dequantize_kv_gather, DequantizeKvGatherParams, 0)                                                \
  X(indexer_k_quant_insert, IndexerKQuantInsertParams, 0)                                             \
  X(map_local_to_global_slots, MapLocalToGlobalSlotsParams, 0)                                        \
  X(inverse_rope, InverseRopeParams, 0)                                                               \
  X(fp8_paged_mqa_logits, PagedMqaLogitsParams, 1)                                                    \
  X(fp8_mqa_logits, MqaLogitsParams, 0)                                                               \
  X(topk_transform, TopkTransformParams, 0)                                                           \
  X(fp8_paged_mqa_topk, PagedMqaTopkParams, 1)                                                        \
  X(indexer_k_norm_rope_store, IndexerKNormRopeStoreParams, 0)                                        \
  X(sparse_mla_decode, SparseMlaDecodeParams, 1)                                                      \
  X(sparse_mla_decode_schedule, SparseMlaDecodeParams, 0) /* fills p.sched: the plan only */          \
  X(sparse_mla_prefill, SparseMlaPrefillParams, 1)

// DSV4_IF_HOPPER(h, code...): the code where h is 1, nothing where it is 0.
#define DSV4_IF_HOPPER(hopper, ...) DSV4_IF_HOPPER_##hopper(__VA_ARGS__)
#define DSV4_IF_HOPPER_0(...)
#define DSV4_IF_HOPPER_1(...) __VA_ARGS__
