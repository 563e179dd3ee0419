// Selection of the CPU tier (see isa_select.cpp).
#pragma once
#include <string>

#include "cpu/kernel_table.h"

namespace dsv4::cpu {

std::string supported_isas();  // comma-separated, best first
const CpuKernels& set_isa(const std::string& name);  // "auto" or a tier name; throws if unsupported

}  // namespace dsv4::cpu
