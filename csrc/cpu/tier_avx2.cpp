// The avx2 CPU tier (flags set per file in CMakeLists.txt).
#define DSV4_ISA avx2
#include "cpu/tier.inc"
