// Where an entry's bytes sit in a page, for every record and placement (host and device code alike; the byte-exact
// spec is python/dsv4/reference/quant.py).
//
// Page-split (MODEL1, and V4.1 as vLLM and SGLang write it): a page holds its block_size data rows first, then its
// block_size scale rows. Per-token (V32, and V4.1 as FlashMLA upstream writes it): each entry's scales follow its
// own data. V32's entry is one 656-byte row (codes, fp32 scales, bf16 RoPE): its "scales" are the bytes after the
// codes. The functions have internal linkage: each CPU tier compiles its own copy with its own ISA flags.
#pragma once
#include <cstdint>

#include "common/cache_layouts.h"
#include "common/host_device.h"
#include "common/params.h"

namespace dsv4 {

struct RecordBytes {
  int data, scales;  // bytes per entry of each part
};

DSV4_HOST_DEVICE static inline RecordBytes record_bytes(KvLayout layout) {
  switch (layout) {
    case KvLayout::model1: return {kModel1DataBytes, kModel1ScaleBytes};
    case KvLayout::v32: return {kV32NopeDim, kV32BytesPerEntry - kV32NopeDim};
    case KvLayout::v41_fp8: return {kV41Fp8DataBytes, kV41Fp8ScaleBytes};
    default: return {kV41Fp4DataBytes, kV41Fp4ScaleBytes};
  }
}

DSV4_HOST_DEVICE static inline int record_entry_bytes(KvLayout layout) {
  const RecordBytes r = record_bytes(layout);
  return r.data + r.scales;
}

// Dims of a record's entry: 576 for V32, 512 for the others.
DSV4_HOST_DEVICE static inline int record_head_dim(KvLayout layout) {
  return layout == KvLayout::v32 ? kV32HeadDim : kV41HeadDim;
}

// A record whose placement the cache's per_token flag chooses (the V4.1 ones); V32 is always per-token, MODEL1
// always page-split.
DSV4_HOST_DEVICE static inline bool record_is_per_token(KvLayout layout, const PagedCache& c) {
  return layout == KvLayout::v32 || ((layout == KvLayout::v41_fp8 || layout == KvLayout::v41_fp4) && c.per_token);
}

struct EntryBytes {
  uint8_t* data = nullptr;
  uint8_t* scales = nullptr;
};

// The bytes of entry `offset` of a page.
DSV4_HOST_DEVICE static inline EntryBytes entry_bytes(KvLayout layout, const PagedCache& c, uint8_t* page, int64_t offset) {
  const RecordBytes r = record_bytes(layout);
  if (record_is_per_token(layout, c)) {
    uint8_t* data = page + offset * (r.data + r.scales);
    return {data, data + r.data};
  }
  return {page + offset * r.data, page + c.block_size * r.data + offset * r.scales};
}

// The entry at slot of a paged cache; data == nullptr when the slot is -1 or outside the cache (nothing is read).
DSV4_HOST_DEVICE static inline EntryBytes slot_entry(KvLayout layout, const PagedCache& c, int64_t slot) {
  if (slot < 0 || c.block_size <= 0 || slot >= c.num_blocks * c.block_size) return {};
  const int64_t block = slot / c.block_size;
  return entry_bytes(layout, c, c.base + block * c.block_stride, slot - block * c.block_size);
}

}  // namespace dsv4
