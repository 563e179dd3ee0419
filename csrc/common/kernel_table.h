// One function per op over its parameter struct (the ops of common/op_list.h): every CPU ISA tier and the CUDA tier
// fill one.
#pragma once
#include "common/op_list.h"

namespace dsv4 {

struct KernelTable {
  const char* isa_name;  // CPU tier or CUDA tier name
#define DSV4_KERNEL_FIELD(name, Params, hopper) void (*name)(const Params&);
  DSV4_OPS(DSV4_KERNEL_FIELD)
#undef DSV4_KERNEL_FIELD
};

}  // namespace dsv4
