// The sparse_mla family's entries (sparse MLA decode, its plan, and prefill), compiled once per CPU tier.
#include "cpu/kernels/sparse_mla/attention.h"
#include "cpu/tier_kernels.h"

DSV4_CPU_KERNEL(sparse_mla_decode, SparseMlaDecodeParams)
DSV4_CPU_KERNEL(sparse_mla_decode_schedule, SparseMlaDecodeParams)
DSV4_CPU_KERNEL(sparse_mla_prefill, SparseMlaPrefillParams)
