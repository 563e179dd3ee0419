// Bindings of the small helpers: block-table slot mapping and the inverse output RoPE.
#include <torch/csrc/stable/library.h>

#include "api/checks.h"
#include "api/backend.h"

namespace dsv4::api {
namespace {

Tensor map_local_to_global_slots(Tensor local, Tensor req_ids, Tensor block_table, int64_t block_size) {
  const char* op = "map_local_to_global_slots";
  const DeviceScope scope(local);
  check_same_device(op, local, {{"req_ids", &req_ids}, {"block_table", &block_table}});
  MapLocalToGlobalSlotsParams p;
  p.local = index_view({op, "local_indices"}, local, 2);
  p.req_ids = index_view({op, "req_ids"}, req_ids, 1);
  check_size({op, "req_ids"}, req_ids, 0, local.size(0));
  p.block_table = index_view({op, "block_table"}, block_table, 2);
  check_positive({op, "block_size"}, block_size);
  p.rows = local.size(0), p.cols = local.size(1);
  p.num_reqs = block_table.size(0), p.max_blocks = block_table.size(1), p.block_size = block_size;
  Tensor out = torch::stable::empty({p.rows, p.cols}, local.scalar_type(), std::nullopt, local.device());
  p.out = out.data_ptr();
  p.out_is_int64 = local.scalar_type() == ScalarType::Long;
  // The slots keep local's dtype: an int32 call must not be handed pages whose slots need 64 bits.
  check_table_slots_fit({op, "block_table"}, p.block_table, p.num_reqs, p.max_blocks, block_size,
                        p.out_is_int64 ? INT64_MAX : INT32_MAX,
                        p.out_is_int64 ? "an int64 slot" : "an int32 slot (pass int64 local_indices for 64-bit slots)");
  backend_kernels().map_local_to_global_slots(p);
  return out;
}

void inverse_rope(Tensor o, Tensor positions, Tensor cos_sin_cache, Tensor out) {
  const char* op = "inverse_rope";
  const DeviceScope scope(o);
  check_same_device(op, o, {{"positions", &positions}, {"cos_sin_cache", &cos_sin_cache}, {"out", &out}});
  InverseRopeParams p;
  p.dtype = float_dtype({op, "o"}, o);
  check_dim({op, "o"}, o, 3);
  check_last_dim_contiguous({op, "o"}, o);
  p.positions = index_view({op, "positions"}, positions, 1);
  check_size({op, "positions"}, positions, 0, o.size(0));
  p.rope = rope_table({op, "cos_sin_cache"}, cos_sin_cache, 0);
  DSV4_CHECK(o.size(2) >= p.rope.rope_dim && o.size(2) <= kMaxInverseRopeHeadDim, op, "argument 'o' head dim ", o.size(2),
             " must be in [rope_dim = ", p.rope.rope_dim, ", ", kMaxInverseRopeHeadDim, "]");
  p.out_dtype = float_dtype({op, "out"}, out);
  check_contiguous({op, "out"}, out);
  DSV4_CHECK(out.dim() == 3 && out.size(0) == o.size(0) && out.size(1) == o.size(1) && out.size(2) == o.size(2), op,
             "argument 'out' must have o's shape ", shape_str(o), ", got ", shape_str(out));
  p.o = o.const_data_ptr();
  p.num_tokens = o.size(0), p.num_heads = o.size(1), p.head_dim = o.size(2);
  p.o_stride_t = o.stride(0), p.o_stride_h = o.stride(1);
  p.out = out.data_ptr();
  check_values_in_range({op, "positions"}, p.positions, p.num_tokens, p.rope.rows);
  backend_kernels().inverse_rope(p);
}

}  // namespace

DSV4_BACKEND_IMPL(m) {
  m.impl("map_local_to_global_slots", TORCH_BOX(&map_local_to_global_slots));
  m.impl("inverse_rope", TORCH_BOX(&inverse_rope));
}

}  // namespace dsv4::api
