// The CPU kernel table: one instance per ISA tier, chosen once per process (isa_select.cpp).
#pragma once
#include <cstdint>

#include "common/kernel_table.h"

namespace dsv4::cpu {

using CpuKernels = KernelTable;

const CpuKernels& kernels_generic();
const CpuKernels& kernels_avx2();
const CpuKernels& kernels_avx512();
const CpuKernels& kernels_avx512dot();  // avx512 with bf16 dot products for attention (DSV4_BF16_DOT)
const CpuKernels& kernels_amx();
bool amx_selftest();  // runs one tile product; defined in the AMX tier
// The decode split planner (common/decode_schedule.h), compiled once in a baseline translation unit: an inline
// function instantiated in the tiers would be compiled with each tier's ISA flags and merged by the linker.
void plan_decode_schedule_host(const SparseMlaDecodeParams& p);

// The table of the selected tier (DSV4_CPU_ISA or the best the CPU supports).
const CpuKernels& kernels();

// Torch's intra-op pool, behind a plain function so ISA tiers never inline torch headers.
using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_for(int64_t begin, int64_t end, int64_t grain, RangeFn fn, void* ctx);

}  // namespace dsv4::cpu
