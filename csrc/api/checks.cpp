#include "api/checks.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "api/backend.h"

namespace dsv4::api {

std::string shape_str(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

void check_dtype(Arg a, const Tensor& t, std::initializer_list<ScalarType> allowed) {
  std::string names;
  for (ScalarType s : allowed) {
    if (t.scalar_type() == s) return;
    names += (names.empty() ? "" : " or ") + std::string(torch::headeronly::toString(s));
  }
  DSV4_CHECK(false, a.op, "argument '", a.name, "' must have dtype ", names, ", got ",
             torch::headeronly::toString(t.scalar_type()));
}

void check_same_dtype(Arg a, const Tensor& t, const char* like_name, const Tensor& like) {
  DSV4_CHECK(t.scalar_type() == like.scalar_type(), a.op, "argument '", a.name, "' is ",
             torch::headeronly::toString(t.scalar_type()), " but argument '", like_name, "' is ",
             torch::headeronly::toString(like.scalar_type()), ": they must have the same dtype");
}

void check_dim(Arg a, const Tensor& t, int64_t dim) {
  DSV4_CHECK(t.dim() == dim, a.op, "argument '", a.name, "' must have ", dim, " dimensions, got shape ", shape_str(t));
}

void check_size(Arg a, const Tensor& t, int64_t d, int64_t expected) {
  DSV4_CHECK(t.size(d) == expected, a.op, "argument '", a.name, "' must have size ", expected, " in dimension ", d,
             ", got shape ", shape_str(t));
}

void check_last_dim_contiguous(Arg a, const Tensor& t) {
  DSV4_CHECK(t.dim() == 0 || t.size(t.dim() - 1) <= 1 || t.stride(t.dim() - 1) == 1, a.op, "argument '", a.name,
             "' must be contiguous in its last dimension, got stride ", t.stride(t.dim() - 1));
}

void check_contiguous(Arg a, const Tensor& t) {
  DSV4_CHECK(t.is_contiguous(), a.op, "argument '", a.name, "' must be contiguous (shape ", shape_str(t), ")");
}

void check_same_device(const char* op, const Tensor& ref, std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  for (const auto& [name, t] : others) {
    if (!t) continue;  // an absent optional argument
    DSV4_CHECK(t->get_device() == ref.get_device() && t->is_cpu() == ref.is_cpu() && t->is_cuda() == ref.is_cuda(), op,
               "argument '", name, "' must be on the same device as the other tensors");
  }
}

void check_positive(Arg a, int64_t value) {
  DSV4_CHECK(value > 0, a.op, "argument '", a.name, "' must be positive, got ", value);
}

void check_positive(Arg a, double value) {
  DSV4_CHECK(value > 0 && std::isfinite(value), a.op, "argument '", a.name, "' must be positive and finite, got ", value);
}

namespace {
// First and one-past-last byte addresses an element of t can occupy (strides are never negative in torch).
std::pair<uintptr_t, uintptr_t> byte_span(const Tensor& t) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(t.data_ptr());
  uintptr_t last = first;
  for (int64_t d = 0; d < t.dim(); ++d) last += uintptr_t(t.size(d) - 1) * uintptr_t(t.stride(d)) * t.element_size();
  return {first, last + t.element_size()};
}
}  // namespace

// Bytes one dim-0 row of t spans (from its first to one past its last byte).
static uintptr_t row_span(const Tensor& t) {
  uintptr_t extent = t.element_size();
  for (int64_t d = 1; d < t.dim(); ++d) extent += uintptr_t(t.size(d) - 1) * uintptr_t(t.stride(d)) * t.element_size();
  return extent;
}

// Whether a and b can share a byte. Spans that meet are still disjoint when both are rows of one page stride whose
// bytes sit at non-colliding offsets inside the page: the per-layer views of an engine's shared cache allocation.
static bool may_overlap(const Tensor& a, const Tensor& b) {
  const auto [a_first, a_end] = byte_span(a);
  const auto [b_first, b_end] = byte_span(b);
  if (a_end <= b_first || b_end <= a_first) return false;
  if (a.dim() == 0 || b.dim() == 0) return true;
  const uintptr_t page = uintptr_t(a.stride(0)) * a.element_size();
  const uintptr_t a_row = row_span(a), b_row = row_span(b);
  if (page == 0 || page != uintptr_t(b.stride(0)) * b.element_size() || a_row > page || b_row > page) return true;
  const uintptr_t offset = (b_first >= a_first ? b_first - a_first : page - (a_first - b_first) % page) % page;
  return offset < a_row || offset + b_row > page;  // b's bytes inside a page start at offset, a's at 0
}

void check_no_overlap(const char* op, const char* out_name, const Tensor& out,
                      std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  if (out.numel() == 0) return;
  for (const auto& [name, t] : others) {
    if (!t || t->numel() == 0) continue;
    DSV4_CHECK(!may_overlap(out, *t), op, "argument '", out_name, "' overlaps argument '", name,
               "' in memory; outputs must not share storage with the inputs or the other outputs");
  }
}

Tensor float_output(Arg sized_by, int64_t rows, int64_t cols, const Tensor& like) {
  int64_t bytes = 0;
  const bool overflows = __builtin_mul_overflow(rows, cols, &bytes) || __builtin_mul_overflow(bytes, int64_t(4), &bytes);
  DSV4_CHECK(!overflows, sized_by.op, "argument '", sized_by.name, "' asks for an fp32 output of [", rows, ", ", cols,
             "], more bytes than a tensor can hold");
  try {
    return torch::stable::empty({rows, cols}, ScalarType::Float, std::nullopt, like.device());
  } catch (const std::exception&) {
    DSV4_CHECK(false, sized_by.op, "argument '", sized_by.name, "' asks for an fp32 output of [", rows, ", ", cols, "] (",
               (bytes + (int64_t(1) << 30) - 1) >> 30, " GiB), which could not be allocated");
  }
}

DType dtype_of(ScalarType s) {
  return s == ScalarType::BFloat16 ? DType::bf16 : (s == ScalarType::Half ? DType::f16 : DType::f32);
}

DType float_dtype(Arg a, const Tensor& t) {
  check_dtype(a, t, {ScalarType::BFloat16, ScalarType::Half, ScalarType::Float});
  return dtype_of(t.scalar_type());
}

IndexView index_view(Arg a, const Tensor& t, int64_t dim) {
  check_dtype(a, t, {ScalarType::Int, ScalarType::Long});
  check_dim(a, t, dim);
  IndexView v;
  v.data = t.const_data_ptr();
  v.is_int64 = t.scalar_type() == ScalarType::Long;
  v.row_stride = t.stride(0);
  v.col_stride = dim > 1 ? t.stride(1) : 0;
  return v;
}

PagedCache paged_cache(Arg a, const Tensor& t, int64_t block_size, int64_t bytes_per_entry) {
  check_dtype(a, t, {ScalarType::Byte, ScalarType::Char, ScalarType::Float8_e4m3fn});
  DSV4_CHECK(t.dim() >= 2, a.op, "argument '", a.name, "' must be a paged cache [num_blocks, ...] with at least 2 dimensions, got shape ",
             shape_str(t));
  check_positive({a.op, "block_size"}, block_size);
  int64_t page_bytes = 1, expected_stride = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    DSV4_CHECK(t.size(d) == 1 || t.stride(d) == expected_stride, a.op, "argument '", a.name,
               "': dimensions after the first must be contiguous (only stride(0), the page stride, is free)");
    expected_stride *= t.size(d);
    page_bytes *= t.size(d);
  }
  // The cache carries its geometry: a view with an entry axis names block_size, and a page is exactly
  // block_size entries, unpadded or padded to one of the alignments engines use.
  DSV4_CHECK(t.dim() < 3 || t.size(1) == block_size, a.op, "argument '", a.name, "' has ", t.size(1),
             " entries per page (dimension 1 of shape ", shape_str(t), "), but block_size is ", block_size);
  // Compared by division: block_size * bytes_per_entry could wrap around for a huge block_size.
  DSV4_CHECK(block_size <= page_bytes / bytes_per_entry, a.op, "argument '", a.name, "' pages hold ", page_bytes,
             " bytes, fewer than block_size ", block_size, " ", record_name(bytes_per_entry), " entries of ",
             bytes_per_entry, " bytes");
  const int64_t raw = block_size * bytes_per_entry;
  DSV4_CHECK(page_bytes == raw || page_bytes == round_up(raw, kPageAlignments[0]) ||
                 page_bytes == round_up(raw, kPageAlignments[1]),
             a.op, "argument '", a.name, "' pages hold ", page_bytes, " bytes, but block_size ", block_size, " ",
             record_name(bytes_per_entry), " entries of ", bytes_per_entry, " bytes make a page of ", raw, " bytes (",
             round_up(raw, kPageAlignments[0]), " or ", round_up(raw, kPageAlignments[1]), " padded to a multiple of ",
             kPageAlignments[0], " or ", kPageAlignments[1], "): block_size or the record format does not match the cache");
  DSV4_CHECK(t.size(0) <= 1 || t.stride(0) >= page_bytes, a.op, "argument '", a.name, "' page stride ", t.stride(0),
             " is smaller than the page size ", page_bytes);
  PagedCache c;
  c.base = static_cast<uint8_t*>(t.data_ptr());
  c.num_blocks = t.size(0);
  c.block_stride = t.stride(0);
  c.block_size = block_size;
  return c;
}

RopeTable rope_table(Arg a, const Tensor& t, int64_t rope_dim) {
  check_dtype(a, t, {ScalarType::Float});
  check_dim(a, t, 2);
  if (rope_dim > 0) check_size(a, t, 1, rope_dim);
  DSV4_CHECK(t.size(1) % 2 == 0 && t.size(1) > 0, a.op, "argument '", a.name, "' must have an even, positive width (cos | sin), got ",
             shape_str(t));
  check_last_dim_contiguous(a, t);
  RopeTable r;
  r.data = static_cast<const float*>(t.const_data_ptr());
  r.rows = t.size(0);
  r.row_stride = t.stride(0);
  r.rope_dim = t.size(1);
  return r;
}

void check_write_slots(Arg a, const IndexView& v, int64_t n, int64_t capacity) {
  if (!kHostReadsValues) return;
  std::vector<std::pair<int64_t, int64_t>> used;  // (slot, entry), to find repeats by sorting
  used.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = index_at(v, i);
    DSV4_CHECK(s == -1 || (s >= 0 && s < capacity), a.op, "argument '", a.name, "' entry ", i, " is ", s,
               "; slots must be -1 (skip) or in [0, ", capacity, ") for this cache");
    if (s >= 0) used.emplace_back(s, i);
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i)
    DSV4_CHECK(used[i].first != used[i - 1].first, a.op, "argument '", a.name, "' entries ", used[i - 1].second,
               " and ", used[i].second, " both write slot ", used[i].first, "; each slot may be written once per call");
}

void check_table_slots_fit(Arg table, const IndexView& v, int64_t rows, int64_t cols, int64_t block_size, int64_t limit,
                           const char* output, const IndexView* reach) {
  if (!kHostReadsValues) return;
  const int64_t max_block = (limit - (block_size - 1)) / block_size;  // the largest entry whose last slot fits
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t positions = reach ? std::max<int64_t>(index_at(*reach, r), 0) : INT64_MAX;
    const int64_t pages = std::min(cols, positions / block_size + (positions % block_size != 0));
    for (int64_t c = 0; c < pages; ++c) {
      const int64_t e = index_at(v, r, c);
      DSV4_CHECK(block_size <= limit && e <= max_block, table.op, "argument '", table.name, "' entry [", r, ", ", c,
                 "] is ", e, ": with block size ", block_size, " its slots reach ", double(e) * double(block_size),
                 ", past the largest ", output, " can hold (", limit, ")");
    }
  }
}

void check_values_in_range(Arg a, const IndexView& v, int64_t n, int64_t limit) {
  for (int64_t i = 0; kHostReadsValues && i < n; ++i) {
    const int64_t x = index_at(v, i);
    DSV4_CHECK(x >= 0 && x < limit, a.op, "argument '", a.name, "' entry ", i, " is ", x, "; expected a value in [0, ",
               limit, ")");
  }
}

KvLayout parse_layout(Arg a, const std::string& name) {
  for (KvLayout layout : {KvLayout::model1, KvLayout::v32, KvLayout::v41_fp8, KvLayout::v41_fp4})
    if (name == layout_name(layout)) return layout;
  DSV4_CHECK(false, a.op, "argument '", a.name, "' must be one of 'model1' (584-byte DeepSeek-V4.0 record), 'v32' (656), ",
             "'v41_fp8' (528) or 'v41_fp4' (288), got '", name, "'");
  return KvLayout::model1;
}

const char* layout_name(KvLayout layout) {
  switch (layout) {
    case KvLayout::model1: return "model1";
    case KvLayout::v32: return "v32";
    case KvLayout::v41_fp8: return "v41_fp8";
    default: return "v41_fp4";
  }
}

bool parse_placement(Arg a, const std::string& placement, KvLayout layout) {
  DSV4_CHECK(placement == "page_split" || placement == "per_token", a.op, "argument '", a.name,
             "' must be 'page_split' (a page's data rows, then its scale rows) or 'per_token' (each entry's scales ",
             "after its data), got '", placement, "'");
  const bool v41 = layout == KvLayout::v41_fp8 || layout == KvLayout::v41_fp4;
  return v41 && placement == "per_token";
}

IndexerFormat parse_indexer_format(Arg a, const std::string& name) {
  DSV4_CHECK(name == "fp8" || name == "mxfp4", a.op, "argument '", a.name, "' must be 'fp8' (e4m3 + an fp32 scale, ",
             "132-byte keys) or 'mxfp4' (e2m1 + a UE8M0 byte per 32 dims, 68-byte keys), got '", name, "'");
  return name == "mxfp4" ? IndexerFormat::mxfp4 : IndexerFormat::fp8;
}

PagedCache record_cache(Arg a, const Tensor& t, int64_t block_size, KvLayout layout, bool per_token) {
  PagedCache c = paged_cache(a, t, block_size, bytes_per_entry(layout));
  c.per_token = per_token;
  return c;
}

}  // namespace dsv4::api
