// The kv_cache family's entries (the fp8 KV-cache writers and the gather), compiled once per CPU tier.
#include "cpu/kernels/kv_cache.h"
#include "cpu/tier_kernels.h"

DSV4_CPU_KERNEL(qnorm_rope_kv_insert, QNormRopeKvInsertParams)
DSV4_CPU_KERNEL(quantize_kv_insert, QuantizeKvInsertParams)
DSV4_CPU_KERNEL(dequantize_kv_gather, DequantizeKvGatherParams)
DSV4_CPU_KERNEL(indexer_k_quant_insert, IndexerKQuantInsertParams)
