// One ISA tier's kernel table, compiled once per tier with -DDSV4_ISA=<isa> (CMakeLists.txt). The entries are the
// families' exported functions (tier_kernels.h); the table's order comes from the op list, so no entry can be
// missing or land in another op's slot.
#include "cpu/kernel_table.h"
#include "cpu/tier_kernels.h"

#define DSV4_CONCAT_(a, b) a##b
#define DSV4_CONCAT(a, b) DSV4_CONCAT_(a, b)
#define DSV4_STR_(a) #a
#define DSV4_STR(a) DSV4_STR_(a)

namespace dsv4::cpu {
const CpuKernels& DSV4_CONCAT(kernels_, DSV4_ISA)() {
  namespace k = DSV4_ISA::entry;
  static const CpuKernels table{
      DSV4_STR(DSV4_ISA),
#define DSV4_CPU_ENTRY(name, Params, hopper) &k::name,
      DSV4_OPS(DSV4_CPU_ENTRY)
#undef DSV4_CPU_ENTRY
  };
  return table;
}
}  // namespace dsv4::cpu
