// The indexer family's entries (the lightning indexer: q quantization, logits, fused top-k, the V4.1 key writer), compiled once per CPU tier.
#include "cpu/kernels/indexer/q_rope_quant.h"
#include "cpu/kernels/indexer/logits.h"
#include "cpu/kernels/indexer/paged_topk.h"
#include "cpu/kernels/indexer/k_norm_rope_store.h"
#include "cpu/tier_kernels.h"

DSV4_CPU_KERNEL(indexer_q_rope_quant, IndexerQRopeQuantParams)
DSV4_CPU_KERNEL(fp8_paged_mqa_logits, PagedMqaLogitsParams)
DSV4_CPU_KERNEL(fp8_mqa_logits, MqaLogitsParams)
DSV4_CPU_KERNEL(fp8_paged_mqa_topk, PagedMqaTopkParams)
DSV4_CPU_KERNEL(indexer_k_norm_rope_store, IndexerKNormRopeStoreParams)
