// Binding of the indexer's top-k transform: per-row top-k indices of fp32 scores, optionally as slot ids.
#include <optional>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include "api/checks.h"
#include "api/backend.h"

namespace dsv4::api {
namespace {

void topk_transform(Tensor scores, Tensor lengths, std::optional<Tensor> row_starts, std::optional<Tensor> page_table,
                    int64_t page_size, Tensor raw_indices, std::optional<Tensor> slot_indices) {
  const char* op = "topk_transform";
  const DeviceScope scope(scores);
  TopkTransformParams p;
  check_dtype({op, "scores"}, scores, {ScalarType::Float});
  check_dim({op, "scores"}, scores, 2);
  check_last_dim_contiguous({op, "scores"}, scores);
  p.rows = scores.size(0), p.width = scores.size(1), p.score_stride = scores.stride(0);
  DSV4_CHECK(p.width <= INT32_MAX, op, "argument 'scores' has ", p.width, " columns; int32 indices address at most ",
             INT32_MAX);
  p.lengths = index_view({op, "lengths"}, lengths, 1);
  check_size({op, "lengths"}, lengths, 0, p.rows);
  if (row_starts) {
    p.row_starts = index_view({op, "row_starts"}, *row_starts, 1);
    check_size({op, "row_starts"}, *row_starts, 0, p.rows);
  }
  if (page_table) {
    p.page_table = index_view({op, "page_table"}, *page_table, 2);
    check_size({op, "page_table"}, *page_table, 0, p.rows);
    p.max_pages = page_table->size(1);
  }
  check_dtype({op, "raw_indices"}, raw_indices, {ScalarType::Int});
  check_dim({op, "raw_indices"}, raw_indices, 2);
  check_size({op, "raw_indices"}, raw_indices, 0, p.rows);
  p.k = raw_indices.size(1);
  DSV4_CHECK(supported_topk(p.k), op, "argument 'raw_indices' must select k in (512, 1024, 2048), got ", p.k);
  if (!page_table) {
    DSV4_CHECK(!slot_indices, op, "argument 'slot_indices' must be None without a page_table, got a tensor");
  } else {
    check_positive({op, "page_size"}, page_size);
    DSV4_CHECK(slot_indices.has_value(), op, "argument 'slot_indices' must be given with a page_table, got None");
    check_dtype({op, "slot_indices"}, *slot_indices, {ScalarType::Int});
    check_dim({op, "slot_indices"}, *slot_indices, 2);
    check_size({op, "slot_indices"}, *slot_indices, 0, p.rows);
    check_size({op, "slot_indices"}, *slot_indices, 1, p.k);
    p.page_size = page_size;
    check_table_slots_fit({op, "page_table"}, p.page_table, p.rows, p.max_pages, page_size, INT32_MAX,
                          "int32 slot_indices", &p.lengths);
    check_no_overlap(op, "slot_indices", *slot_indices, {{"raw_indices", &raw_indices}, {"scores", &scores},
                                                         {"lengths", &lengths}, {"row_starts", present(row_starts)},
                                                         {"page_table", &*page_table}});
    p.slots = static_cast<int32_t*>(slot_indices->data_ptr());
    p.slot_stride = slot_indices->stride(0), p.slot_col_stride = slot_indices->stride(1);
  }
  check_same_device(op, scores, {{"lengths", &lengths}, {"raw_indices", &raw_indices}, {"row_starts", present(row_starts)},
                                 {"page_table", present(page_table)}, {"slot_indices", present(slot_indices)}});
  check_no_overlap(op, "raw_indices", raw_indices, {{"scores", &scores}, {"lengths", &lengths},
                                                    {"row_starts", present(row_starts)},
                                                    {"page_table", present(page_table)}});
  p.scores = static_cast<const float*>(scores.const_data_ptr());
  p.raw = static_cast<int32_t*>(raw_indices.data_ptr());
  p.raw_stride = raw_indices.stride(0), p.raw_col_stride = raw_indices.stride(1);
  p.threads = torch::stable::get_num_threads();
  backend_kernels().topk_transform(p);
}

}  // namespace

DSV4_BACKEND_IMPL(m) { m.impl("topk_transform", TORCH_BOX(&topk_transform)); }

}  // namespace dsv4::api
