// AMX tile configuration shared by the AMX kernels (compiled only in the amx tier).
#pragma once
#include "cpu/kernels/numerics.h"

namespace dsv4::cpu::DSV4_ISA {

#if defined(__AMX_TILE__)

// Palette-1 tile configuration (64 bytes, layout fixed by the ISA).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

inline void load_tile_config(const TileConfig& cfg) {
  // gcc 12 drops the stores that fill cfg at -O1+ unless they are forced out before ldtilecfg.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// Tiles 0 .. count-1 as full 16 rows x 64 bytes (16 fp32 or 32 bf16 per row).
inline void configure_full_tiles(int count) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < count; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  load_tile_config(cfg);
}

// Tiles 0 (C: 16 x 16 fp32), 1 (A: 16 x 32 bf16) and 2 (B: 16 bf16 pairs x 16 columns).
inline void configure_bf16_16x16_tiles() { configure_full_tiles(3); }

#endif

}  // namespace dsv4::cpu::DSV4_ISA
