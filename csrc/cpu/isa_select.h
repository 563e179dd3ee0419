// Selection of the CPU tier (see isa_select.cpp).
#pragma once
#include <string>

#include "cpu/kernel_table.h"

namespace dsv4::cpu {

std::string supported_isas();  // comma-separated, best first
std::string isa_order_reason();  // why the tiers are in that order on this CPU
const CpuKernels& set_isa(const std::string& name);  // "auto" or a tier name; throws if unsupported

}  // namespace dsv4::cpu
