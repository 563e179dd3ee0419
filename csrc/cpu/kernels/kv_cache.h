// KV-cache writers: the generic insert and gather of every attention record, the fused SWA insert, indexer K insert.
#pragma once
#include "cpu/kernels/numerics.h"
#include "cpu/kernels/records.h"
#include "cpu/kernels/indexer/mxfp4.h"

namespace dsv4::cpu::DSV4_ISA {

inline void quantize_kv_insert(const QuantizeKvInsertParams& p) {
  const int64_t dim = record_head_dim(p.layout);
  parallel(p.num_tokens, 16, [&](int64_t begin, int64_t end) {
    float row[kV32HeadDim];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = index_at(p.slots, t);
      if (!slot_entry(p.layout, p.cache, slot).data) continue;
      load_row_f32(static_cast<const char*>(p.kv) + t * p.kv_stride * dtype_bytes(p.dtype), p.dtype, dim, row);
      for (int64_t i = 0; i < dim; ++i) row[i] = round_bf16(row[i]);
      record_store(p.layout, p.cache, slot, row);
    }
  });
}

inline void dequantize_kv_gather(const DequantizeKvGatherParams& p) {
  const int64_t dim = record_head_dim(p.layout);
  parallel(p.num_slots, kGrainRows, [&](int64_t begin, int64_t end) {
    float row[kV32HeadDim];
    for (int64_t s = begin; s < end; ++s) {
      uint16_t* dst = p.out + s * dim;
      if (!record_load(p.layout, p.cache, index_at(p.slots, s), row)) {
        std::memset(dst, 0, dim * sizeof(uint16_t));
        continue;
      }
      for (int64_t i = 0; i < dim; ++i) dst[i] = f32_to_bf16(row[i]);
    }
  });
}

inline void qnorm_rope_kv_insert(const QNormRopeKvInsertParams& p) {
  constexpr int64_t dim = kModel1NopeDim + kModel1RopeDim;
  const int64_t esize = dtype_bytes(p.dtype);
  // Q: weight-free RMSNorm over 512 dims (V4.0 only), RoPE on the last 64; padded heads are zero.
  parallel(p.num_tokens * p.padded_heads, kGrainRows, [&](int64_t begin, int64_t end) {
    float row[dim];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / p.padded_heads, h = i % p.padded_heads;
      char* dst = static_cast<char*>(p.q_out) + i * dim * esize;
      if (h >= p.num_heads) {
        std::memset(dst, 0, dim * esize);
        continue;
      }
      load_row_f32(static_cast<const char*>(p.q) + (t * p.q_stride_t + h * p.q_stride_h) * esize, p.dtype, dim, row);
      if (p.q_norm) {
        const float inv_rms = 1.0f / std::sqrt(sum_squares(row, dim) / float(dim) + p.eps);
        for (int64_t d = 0; d < dim; ++d) row[d] *= inv_rms;
      }
      rope_rotate(row + kModel1NopeDim, p.rope, index_at(p.positions, t), 1.0f);
      store_row_from_f32(dst, p.dtype, dim, row);
    }
  });
  // KV: RoPE on the last 64 dims, then quantize + insert (MODEL1 keeps the rotated dims as bf16; the V4.1 records
  // quantize them too, from their bf16 rounding).
  parallel(p.num_kv_tokens, 16, [&](int64_t begin, int64_t end) {
    float row[dim];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = index_at(p.slots, t);
      if (!slot_entry(p.layout, p.cache, slot).data) continue;
      load_row_f32(static_cast<const char*>(p.kv) + t * p.kv_stride_t * esize, p.dtype, dim, row);
      for (int64_t d = 0; d < kModel1NopeDim; ++d) row[d] = round_bf16(row[d]);
      rope_rotate(row + kModel1NopeDim, p.rope, index_at(p.positions, t), 1.0f);
      if (p.layout != KvLayout::model1)
        for (int64_t d = kModel1NopeDim; d < dim; ++d) row[d] = round_bf16(row[d]);
      record512_store(p.layout, p.cache, slot, row);
    }
  });
}

inline void indexer_k_quant_insert(const IndexerKQuantInsertParams& p) {
  const int64_t esize = dtype_bytes(p.dtype);
  parallel(p.num_tokens, 64, [&](int64_t begin, int64_t end) {
    float row[kIndexerHeadDim];
    for (int64_t t = begin; t < end; ++t) {
      int64_t off;
      uint8_t* page = slot_page(p.cache, index_at(p.slots, t), &off);
      if (!page) continue;
      load_row_f32(static_cast<const char*>(p.k) + t * p.k_stride * esize, p.dtype, kIndexerHeadDim, row);
      for (int64_t d = 0; d < kIndexerHeadDim; ++d) row[d] = round_bf16(row[d]);
      indexer_key_store(p.key_format, page, p.cache.block_size, off, row);
    }
  });
}

}  // namespace dsv4::cpu::DSV4_ISA
