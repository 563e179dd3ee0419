// The compressor family's entries (the KV compressor's state and store), compiled once per CPU tier.
#include "cpu/kernels/compressor.h"
#include "cpu/tier_kernels.h"

DSV4_CPU_KERNEL(save_partial_states, SavePartialStatesParams)
DSV4_CPU_KERNEL(compress_norm_rope_store, CompressNormRopeStoreParams)
