// The CPU kernel table: one instance per ISA tier, chosen once per process (isa_select.cpp).
#pragma once
#include <cstdint>

#include "common/params.h"

namespace dsv4::cpu {

enum class Isa : int32_t { generic = 0, avx2 = 1, avx512 = 2, amx = 3 };

struct CpuKernels {
  const char* isa_name;
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
  void (*sparse_mla_prefill)(const SparseMlaPrefillParams&);
};

const CpuKernels& kernels_generic();
const CpuKernels& kernels_avx2();
const CpuKernels& kernels_avx512();
const CpuKernels& kernels_amx();
bool amx_selftest();  // runs one tile product; defined in the AMX tier

// The table of the selected tier (DSV4_CPU_ISA or the best the CPU supports).
const CpuKernels& kernels();

// Torch's intra-op pool, behind a plain function so ISA tiers never inline torch headers.
using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_for(int64_t begin, int64_t end, int64_t grain, RangeFn fn, void* ctx);

}  // namespace dsv4::cpu
