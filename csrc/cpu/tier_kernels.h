// What one ISA tier exports: a function per op of the op list, in namespace dsv4::cpu::<isa>::entry. Each kernel
// family's translation unit (csrc/cpu/kernels/<family>.cpp) defines its ops' entries with DSV4_CPU_KERNEL, and
// tier_table.cpp puts them in the tier's table; every file is compiled once per tier with -DDSV4_ISA=<isa>.
#pragma once
#include "common/op_list.h"

#ifndef DSV4_ISA
#define DSV4_ISA generic
#endif

namespace dsv4::cpu::DSV4_ISA::entry {
#define DSV4_CPU_DECLARE(name, Params, hopper) void name(const Params& p);
DSV4_OPS(DSV4_CPU_DECLARE)
#undef DSV4_CPU_DECLARE
}  // namespace dsv4::cpu::DSV4_ISA::entry

// The entry of op `name`, calling the family's inline kernel of the same name. A qualified definition must match a
// declaration above, so a wrong Params or a name missing from the op list fails to compile.
#define DSV4_CPU_KERNEL(name, Params)                                                                  \
  void dsv4::cpu::DSV4_ISA::entry::name(const Params& p) { ::dsv4::cpu::DSV4_ISA::name(p); }
