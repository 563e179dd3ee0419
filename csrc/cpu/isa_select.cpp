// Run-time choice of the CPU tier: CPUID + OS state (+ AMX permission), or DSV4_CPU_ISA.
// Compiled for the x86-64 baseline: nothing here may use an extended ISA.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/isa_select.h"
#include "cpu/kernel_table.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace dsv4::cpu {
namespace {

#if defined(__x86_64__)
struct CpuFeatures {
  bool avx2 = false, avx512 = false, amx = false;
  bool amd = false;  // AuthenticAMD
  unsigned family = 0;  // base + extended family (Zen 4: 25, Zen 5: 26)
};

uint64_t xgetbv0() {
  uint32_t lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

bool request_amx_permission() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  f.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "Auth" "enti" "cAMD"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const unsigned base_family = (a >> 8) & 0xf;
  f.family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
  const bool tile_os = (xcr0 & (3ull << 17)) == (3ull << 17);
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17);
  const bool avx512bw = b & (1u << 30), avx512vl = b & (1u << 31), avx512vnni = c & (1u << 11);
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25);
  __cpuid_count(7, 1, a, b, c, d);
  const bool avx512bf16 = a & (1u << 5);
  f.avx2 = ymm_os && avx2 && fma && f16c;
  f.avx512 = f.avx2 && zmm_os && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni && avx512bf16;
  f.amx = f.avx512 && tile_os && amx_tile && amx_bf16 && amx_int8;
  return f;
}
#endif

struct Selection {
  std::mutex mu;
  std::atomic<const CpuKernels*> table{nullptr};
};

// Every compiled tier by name (tier_order below says which comes first on this CPU).
struct Tier {
  const char* name;
  const CpuKernels& (*kernels)();
};
constexpr Tier kTiers[] = {{"amx", kernels_amx},
                           {"avx512", kernels_avx512},
                           {"avx512dot", kernels_avx512dot},
                           {"avx2", kernels_avx2},
                           {"generic", kernels_generic}};

Selection& selection() {
  static Selection s;
  return s;
}

#if defined(__x86_64__)
const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

// Whether vdpbf16ps issues at the FMA rate, so that bf16 dot products (avx512dot) beat widening to fp32 FMAs
// (avx512): AMD Zen 4 and later (family 25+) yes; Intel issues it at a quarter of the FMA rate (Sapphire Rapids).
bool bf16_dot_at_fma_rate() { return features().amd && features().family >= 25; }
#endif

// Tiers, best first on this CPU.
std::vector<const char*> tier_order() {
#if defined(__x86_64__)
  if (bf16_dot_at_fma_rate()) return {"amx", "avx512dot", "avx512", "avx2", "generic"};
#endif
  return {"amx", "avx512", "avx512dot", "avx2", "generic"};
}

bool tier_supported(const std::string& name, bool* amx_ready) {
#if defined(__x86_64__)
  const CpuFeatures& f = features();
  static const bool amx_ok = f.amx && request_amx_permission() && amx_selftest();
  *amx_ready = amx_ok;
  if (name == "amx") return amx_ok;
  if (name == "avx512" || name == "avx512dot") return f.avx512;
  if (name == "avx2") return f.avx2;
#else
  *amx_ready = false;
#endif
  return name == "generic";
}

const CpuKernels* table_for(const std::string& name) {
  for (const Tier& tier : kTiers)
    if (name == tier.name) return &tier.kernels();
  return nullptr;
}

std::string tier_names() {
  std::string out;
  for (const Tier& tier : kTiers) out += std::string(tier.name) + ", ";
  return out;
}

}  // namespace

std::string supported_isas() {
  std::string out;
  bool amx_ready = false;
  for (const char* name : tier_order()) {
    if (tier_supported(name, &amx_ready)) out += out.empty() ? name : std::string(",") + name;
  }
  return out;
}

const CpuKernels& set_isa(const std::string& requested) {
  Selection& s = selection();
  std::lock_guard<std::mutex> lock(s.mu);
  std::string name = requested;
  if (name.empty() || name == "auto") {
    const std::string all = supported_isas();
    name = all.substr(0, all.find(','));
  }
  DSV4_REQUIRE(table_for(name) != nullptr, "dsv4: unknown CPU ISA '", requested, "'; expected one of ", tier_names(),
               "auto");
  bool amx_ready = false;
  DSV4_REQUIRE(tier_supported(name, &amx_ready), "dsv4: CPU ISA '", name,
                  "' was requested but this CPU (or OS) does not support it; supported: ", supported_isas());
  s.table.store(table_for(name));
  return *s.table.load();
}

std::string isa_order_reason() {
#if defined(__x86_64__)
  const CpuFeatures& f = features();
  const std::string cpu = std::string(f.amd ? "AMD" : "non-AMD") + " family " + std::to_string(f.family);
  if (bf16_dot_at_fma_rate()) return cpu + ": vdpbf16ps at the FMA rate, so avx512dot (bf16 dot products) before avx512";
  return cpu + ": avx512 (bf16 widened to fp32 FMAs) before avx512dot";
#else
  return "not x86-64: generic only";
#endif
}

const CpuKernels& kernels() {
  const CpuKernels* t = selection().table.load();
  if (t) return *t;
  const char* env = std::getenv("DSV4_CPU_ISA");
  return set_isa(env ? env : "auto");
}

}  // namespace dsv4::cpu
