// The rope_slots family's entries (slot maps and the inverse RoPE), compiled once per CPU tier.
#include "cpu/kernels/rope_slots.h"
#include "cpu/tier_kernels.h"

DSV4_CPU_KERNEL(map_local_to_global_slots, MapLocalToGlobalSlotsParams)
DSV4_CPU_KERNEL(inverse_rope, InverseRopeParams)
