// The avx512 CPU tier (flags set per file in CMakeLists.txt).
#define DSV4_ISA avx512
#include "cpu/tier.inc"
