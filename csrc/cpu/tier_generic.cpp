// The generic CPU tier (flags set per file in CMakeLists.txt).
#define DSV4_ISA generic
#include "cpu/tier.inc"
