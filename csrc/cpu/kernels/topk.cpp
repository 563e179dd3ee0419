// The topk family's entries (top-k over score rows), compiled once per CPU tier.
#include "cpu/kernels/topk.h"
#include "cpu/tier_kernels.h"

DSV4_CPU_KERNEL(topk_transform, TopkTransformParams)
