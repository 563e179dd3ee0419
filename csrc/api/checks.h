// Argument checks and tensor -> parameter-struct conversions shared by the op bindings.
// Every failure names the op, the argument, what was expected and what was given.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include "common/cache_layouts.h"
#include "common/error.h"
#include "common/indices.h"
#include "common/params.h"
#include "common/records.h"

namespace dsv4::api {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

#define DSV4_CHECK(cond, op, ...) DSV4_REQUIRE((cond), "dsv4::", op, ": ", __VA_ARGS__)

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// The record format an entry size belongs to, for messages.
inline const char* record_name(int64_t bytes_per_entry) {
  return bytes_per_entry == kModel1BytesPerEntry ? "MODEL1"
         : bytes_per_entry == kV32BytesPerEntry  ? "V32"
         : bytes_per_entry == kIndexerBytesPerEntry ? "indexer K"
         : bytes_per_entry == kIndexerFp4BytesPerEntry ? "mxfp4 indexer K"
         : bytes_per_entry == kV41Fp8BytesPerEntry  ? "V4.1 fp8"
         : bytes_per_entry == kV41Fp4BytesPerEntry  ? "V4.1 fp4"
                                                     : "cache";
}

inline int64_t bytes_per_entry(KvLayout layout) { return record_entry_bytes(layout); }

// Top-k widths the selection kernels support (topk_transform, fp8_paged_mqa_topk).
inline bool supported_topk(int64_t k) { return k == 512 || k == 1024 || k == 2048; }

// Describes one argument in messages: "argument 'name' of dsv4::op".
struct Arg {
  const char* op;
  const char* name;
};

std::string shape_str(const Tensor& t);
void check_dtype(Arg a, const Tensor& t, std::initializer_list<ScalarType> allowed);
// t must have like's dtype; the message names both arguments and both dtypes (either may be the wrong one).
void check_same_dtype(Arg a, const Tensor& t, const char* like_name, const Tensor& like);
void check_dim(Arg a, const Tensor& t, int64_t dim);
void check_size(Arg a, const Tensor& t, int64_t d, int64_t expected);
void check_last_dim_contiguous(Arg a, const Tensor& t);
void check_contiguous(Arg a, const Tensor& t);
// Null entries (absent optional arguments, see `present`) are skipped.
void check_same_device(const char* op, const Tensor& ref, std::initializer_list<std::pair<const char*, const Tensor*>> others);
inline const Tensor* present(const std::optional<Tensor>& t) { return t ? &*t : nullptr; }
void check_positive(Arg a, int64_t value);
void check_positive(Arg a, double value);  // also rejects NaN and infinity
// `out` shares no byte with any of `others` (null entries skipped): an output written while an input it overlaps
// is still being read gives a wrong result.
void check_no_overlap(const char* op, const char* out_name, const Tensor& out,
                      std::initializer_list<std::pair<const char*, const Tensor*>> others);
// An fp32 [rows, cols] output on like's device; a size that overflows or cannot be allocated names the argument
// that asked for it and the bytes.
Tensor float_output(Arg sized_by, int64_t rows, int64_t cols, const Tensor& like);

DType float_dtype(Arg a, const Tensor& t);  // bf16 / f16 / f32
DType dtype_of(ScalarType s);
IndexView index_view(Arg a, const Tensor& t, int64_t dim);  // int32/int64 of the given rank
// uint8/int8/fp8 cache of any rank >= 2 whose pages are stride(0) apart. Its geometry must match the call: a page
// (the bytes of dimensions 1..) holds exactly block_size entries, unpadded or padded to a multiple of 512 or 576
// bytes, and a view with an entry axis ([num_blocks, block_size, ...]) has block_size in dimension 1.
PagedCache paged_cache(Arg a, const Tensor& t, int64_t block_size, int64_t bytes_per_entry);
RopeTable rope_table(Arg a, const Tensor& t, int64_t rope_dim);

// The attention records by the names the ops take: "model1" (584 B), "v32" (656 B), "v41_fp8" (528 B), "v41_fp4"
// (288 B); the message lists them.
KvLayout parse_layout(Arg a, const std::string& name);
const char* layout_name(KvLayout layout);
// "page_split" or "per_token" (PagedCache::per_token): the V4.1 records come in both; MODEL1 is page-split and V32
// per-token by definition, and the argument is ignored for them.
bool parse_placement(Arg a, const std::string& placement, KvLayout layout);
// A paged cache of one record in one placement.
PagedCache record_cache(Arg a, const Tensor& t, int64_t block_size, KvLayout layout, bool per_token);

// Indexer key / query formats by the names the ops take: "fp8" (132-byte keys) or "mxfp4" (68-byte keys).
IndexerFormat parse_indexer_format(Arg a, const std::string& name);
inline int64_t indexer_entry_bytes(IndexerFormat f) {
  return f == IndexerFormat::mxfp4 ? kIndexerFp4BytesPerEntry : kIndexerBytesPerEntry;
}

// The two checks below read the values, so they run on CPU tensors only (no-ops in _C_cuda: a device read
// would synchronise; the CUDA kernels treat such entries as invalid instead).
// Slots a writer stores to: every entry of a rank-1 index tensor is -1 or in [0, capacity), and no slot repeats
// (two tokens racing for one entry would leave a winner that changes from run to run).
void check_write_slots(Arg a, const IndexView& v, int64_t n, int64_t capacity);
// Every entry e >= 0 of a [rows, cols] block table maps to slots up to e * block_size + block_size - 1; all must be at
// most `limit` (INT32_MAX where they land in an int32 output, named by `output`). With `reach`, row r is checked only
// in the pages its first reach[r] positions fall in (the ones a kernel can translate).
void check_table_slots_fit(Arg table, const IndexView& v, int64_t rows, int64_t cols, int64_t block_size, int64_t limit,
                           const char* output, const IndexView* reach = nullptr);
// Every entry of a rank-1 index tensor is in [0, limit).
void check_values_in_range(Arg a, const IndexView& v, int64_t n, int64_t limit);

}  // namespace dsv4::api
