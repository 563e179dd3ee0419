// The CPU tiers' entry of the decode split planner, compiled for the x86-64 baseline only.
#include "common/decode_schedule.h"
#include "cpu/kernel_table.h"

namespace dsv4::cpu {

void plan_decode_schedule_host(const SparseMlaDecodeParams& p) { plan_decode_schedule(p); }

}  // namespace dsv4::cpu
