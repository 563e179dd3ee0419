// The AMX tier's start-up check (compiled in that tier only): the process selects AMX only if one tile product is
// right.
#include <cstring>

#include "cpu/kernels/amx_tiles.h"

namespace dsv4::cpu {

// C[16x16] fp32 = A[16x32] bf16 * B[32x16] bf16 (B in VNNI pairs) on the tile unit, checked
// against scalar math: proves tile permission, configuration and the bf16 path work.
bool amx_selftest() {
  uint16_t a[16][32], b[16][32];
  float c[16][16], ref[16][16] = {};
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 32; ++k) a[i][k] = amx::f32_to_bf16(float((i * 7 + k * 3) % 11) - 5.0f);
  for (int k = 0; k < 32; ++k)
    for (int j = 0; j < 16; ++j) b[k / 2][j * 2 + k % 2] = amx::f32_to_bf16(float((k * 5 + j) % 7) - 3.0f);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      for (int k = 0; k < 32; ++k) ref[i][j] += amx::bf16_to_f32(a[i][k]) * amx::bf16_to_f32(b[k / 2][j * 2 + k % 2]);
  amx::configure_bf16_16x16_tiles();
  _tile_zero(0);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, 64);
  _tile_release();
  return std::memcmp(c, ref, sizeof(c)) == 0;
}

}  // namespace dsv4::cpu
