// Bindings of the compressor ops (state rows, pooled + normalized + rotated compressed entries).
#include <optional>
#include <string>

#include <torch/csrc/stable/library.h>

#include "api/checks.h"
#include "api/backend.h"

namespace dsv4::api {
namespace {

constexpr int64_t kRopeDim = 64;

// fp32 state cache [num_blocks, block_size, 2 * width]; rows contiguous, block and row strides free.
StateCache state_cache(Arg a, const Tensor& t) {
  check_dtype(a, t, {ScalarType::Float});
  check_dim(a, t, 3);
  check_last_dim_contiguous(a, t);
  StateCache s;
  s.base = static_cast<float*>(t.data_ptr());
  s.num_blocks = t.size(0), s.block_size = t.size(1);
  s.block_stride = t.stride(0), s.row_stride = t.stride(1), s.row_width = t.size(2);
  return s;
}

void save_partial_states(Tensor kv, Tensor score, Tensor ape, Tensor positions, Tensor state, Tensor slot_mapping) {
  const char* op = "save_partial_states";
  const DeviceScope scope(kv);
  check_same_device(op, kv, {{"score", &score}, {"ape", &ape}, {"positions", &positions}, {"state_cache", &state},
                             {"slot_mapping", &slot_mapping}});
  SavePartialStatesParams p;
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"kv", &kv}, {"score", &score}}) {
    check_dtype({op, name}, *t, {ScalarType::Float});
    check_dim({op, name}, *t, 2);
    check_last_dim_contiguous({op, name}, *t);
  }
  check_size({op, "score"}, score, 0, kv.size(0));
  check_size({op, "score"}, score, 1, kv.size(1));
  check_dtype({op, "ape"}, ape, {ScalarType::Float});
  check_dim({op, "ape"}, ape, 2);
  check_contiguous({op, "ape"}, ape);
  check_size({op, "ape"}, ape, 1, kv.size(1));
  DSV4_CHECK(ape.size(0) > 0, op, "argument 'ape' must have one row per position in a group (compress ratio), got 0");
  p.positions = index_view({op, "positions"}, positions, 1);
  check_size({op, "positions"}, positions, 0, kv.size(0));
  p.slots = index_view({op, "slot_mapping"}, slot_mapping, 1);
  check_size({op, "slot_mapping"}, slot_mapping, 0, kv.size(0));
  p.state = state_cache({op, "state_cache"}, state);
  check_size({op, "state_cache"}, state, 2, 2 * kv.size(1));
  check_no_overlap(op, "state_cache", state, {{"kv", &kv}, {"score", &score}, {"ape", &ape}, {"positions", &positions},
                                              {"slot_mapping", &slot_mapping}});
  p.kv = static_cast<const float*>(kv.const_data_ptr());
  p.score = static_cast<const float*>(score.const_data_ptr());
  p.kv_stride = kv.stride(0), p.score_stride = score.stride(0);
  p.ape = static_cast<const float*>(ape.const_data_ptr());
  p.ratio = ape.size(0), p.width = kv.size(1), p.num_tokens = kv.size(0);
  check_values_in_range({op, "positions"}, p.positions, p.num_tokens, INT64_MAX);
  check_write_slots({op, "slot_mapping"}, p.slots, p.num_tokens, p.state.num_blocks * p.state.block_size);
  backend_kernels().save_partial_states(p);
}

// kv_cache: the indexer K record for head_dim 128, `layout` in `placement` for 512.
void compress_common(const char* op, int64_t head_dim, KvLayout layout, bool per_token, Tensor state,
                     Tensor gather_slots, Tensor positions, Tensor kv_slot_mapping, Tensor norm_weight, double eps,
                     Tensor cos_sin_cache, Tensor kv_cache, int64_t block_size, int64_t ratio,
                     const std::optional<Tensor>& latent_out = std::nullopt) {
  const DeviceScope scope(state);
  check_same_device(op, state, {{"gather_slots", &gather_slots}, {"positions", &positions},
                                {"kv_slot_mapping", &kv_slot_mapping}, {"rms_norm_weight", &norm_weight},
                                {"cos_sin_cache", &cos_sin_cache}, {"kv_cache", &kv_cache}});
  CompressNormRopeStoreParams p;
  check_positive({op, "compress_ratio"}, ratio);
  p.state = state_cache({op, "state_cache"}, state);
  const int64_t width = p.state.row_width / 2;
  DSV4_CHECK(p.state.row_width % (2 * head_dim) == 0 && width > 0, op, "argument 'state_cache' rows must be 2 * coff * ",
             head_dim, " floats ([kv | score] for coff = 1 or 2), got ", p.state.row_width);
  p.coff = width / head_dim;
  DSV4_CHECK(p.coff == 1 || p.coff == 2, op, "argument 'state_cache' implies coff = ", p.coff, "; expected 1 or 2");
  p.gather_slots = index_view({op, "gather_slots"}, gather_slots, 2);
  p.window = p.coff * ratio;
  DSV4_CHECK(p.window <= kMaxCompressWindow, op, "argument 'compress_ratio' ", ratio, " gives coff * compress_ratio = ",
             p.window, " window rows, more than the supported ", kMaxCompressWindow);
  check_size({op, "gather_slots"}, gather_slots, 1, p.window);
  const int64_t n = gather_slots.size(0);
  p.positions = index_view({op, "positions"}, positions, 1);
  check_size({op, "positions"}, positions, 0, n);
  p.kv_slots = index_view({op, "kv_slot_mapping"}, kv_slot_mapping, 1);
  check_size({op, "kv_slot_mapping"}, kv_slot_mapping, 0, n);
  check_dtype({op, "rms_norm_weight"}, norm_weight, {ScalarType::Float});
  check_dim({op, "rms_norm_weight"}, norm_weight, 1);
  check_size({op, "rms_norm_weight"}, norm_weight, 0, head_dim);
  check_contiguous({op, "rms_norm_weight"}, norm_weight);
  p.rope = rope_table({op, "cos_sin_cache"}, cos_sin_cache, kRopeDim);
  p.layout = layout;
  p.cache = head_dim == kIndexerHeadDim ? paged_cache({op, "kv_cache"}, kv_cache, block_size, kIndexerBytesPerEntry)
                                        : record_cache({op, "kv_cache"}, kv_cache, block_size, layout, per_token);
  check_positive({op, "eps"}, double(float(eps)));  // the kernels compute in fp32
  // Not checked against state_cache: engines give every KV-cache group views of one shared allocation, so the two
  // caches may span the same bytes, their blocks being distinct.
  check_no_overlap(op, "kv_cache", kv_cache, {{"gather_slots", &gather_slots},
                                              {"positions", &positions}, {"kv_slot_mapping", &kv_slot_mapping},
                                              {"rms_norm_weight", &norm_weight}, {"cos_sin_cache", &cos_sin_cache}});
  p.norm_weight = static_cast<const float*>(norm_weight.const_data_ptr());
  p.eps = float(eps);
  p.ratio = ratio, p.head_dim = head_dim, p.num_tokens = n;
  check_values_in_range({op, "positions"}, p.positions, n, INT64_MAX);
  for (int64_t t = 0; kHostReadsValues && t < n; ++t) {  // rotation position of a compressed entry is (p // R) * R
    const int64_t pos = index_at(p.positions, t);
    DSV4_CHECK((pos / ratio) * ratio < p.rope.rows, op, "argument 'positions' entry ", t, " is ", pos,
               ", beyond the ", p.rope.rows, " rows of cos_sin_cache");
  }
  check_write_slots({op, "kv_slot_mapping"}, p.kv_slots, n, p.cache.num_blocks * block_size);
  if (latent_out) {
    const Tensor& latent = *latent_out;
    check_same_device(op, state, {{"latent_out", &latent}});
    check_dtype({op, "latent_out"}, latent, {ScalarType::BFloat16});
    check_dim({op, "latent_out"}, latent, 2);
    check_size({op, "latent_out"}, latent, 0, n);
    check_size({op, "latent_out"}, latent, 1, head_dim);
    DSV4_CHECK(latent.stride(1) == 1, op, "argument 'latent_out' must have a contiguous last dim, got stride ",
               latent.stride(1));
    check_no_overlap(op, "latent_out", latent, {{"kv_cache", &kv_cache}, {"state_cache", &state},
                                                {"gather_slots", &gather_slots}, {"positions", &positions},
                                                {"kv_slot_mapping", &kv_slot_mapping}});
    p.latent = static_cast<uint16_t*>(latent.data_ptr());
    p.latent_stride = latent.stride(0);
  }
  backend_kernels().compress_norm_rope_store(p);
}

void compress_norm_rope_store_layout(Tensor state, Tensor gather_slots, Tensor positions, Tensor kv_slot_mapping,
                                     Tensor norm_weight, double eps, Tensor cos_sin_cache, Tensor kv_cache,
                                     int64_t block_size, int64_t ratio, std::string layout, std::string placement,
                                     std::optional<Tensor> latent_out) {
  const char* op = "compress_norm_rope_store";
  const KvLayout l = parse_layout({op, "layout"}, layout);
  DSV4_CHECK(l != KvLayout::v32, op, "argument 'layout' must be a 512-dim record (model1, v41_fp8, v41_fp4), got v32");
  compress_common(op, kModel1HeadDim, l, parse_placement({op, "placement"}, placement, l), state, gather_slots,
                  positions, kv_slot_mapping, norm_weight, eps, cos_sin_cache, kv_cache, block_size, ratio, latent_out);
}

void compress_norm_rope_store(Tensor state, Tensor gather_slots, Tensor positions, Tensor kv_slot_mapping,
                              Tensor norm_weight, double eps, Tensor cos_sin_cache, Tensor kv_cache, int64_t block_size,
                              int64_t ratio) {
  compress_norm_rope_store_layout(state, gather_slots, positions, kv_slot_mapping, norm_weight, eps, cos_sin_cache,
                                  kv_cache, block_size, ratio, "model1", "page_split", std::nullopt);
}

void compress_norm_rope_store_indexer(Tensor state, Tensor gather_slots, Tensor positions, Tensor kv_slot_mapping,
                                      Tensor norm_weight, double eps, Tensor cos_sin_cache, Tensor kv_cache,
                                      int64_t block_size, int64_t ratio) {
  compress_common("compress_norm_rope_store_indexer", kIndexerHeadDim, KvLayout::model1, false, state, gather_slots,
                  positions, kv_slot_mapping, norm_weight, eps, cos_sin_cache, kv_cache, block_size, ratio);
}

}  // namespace

DSV4_BACKEND_IMPL(m) {
  m.impl("save_partial_states", TORCH_BOX(&save_partial_states));
  m.impl("compress_norm_rope_store", TORCH_BOX(&compress_norm_rope_store));
  m.impl("compress_norm_rope_store.layout", TORCH_BOX(&compress_norm_rope_store_layout));
  m.impl("compress_norm_rope_store_indexer", TORCH_BOX(&compress_norm_rope_store_indexer));
}

}  // namespace dsv4::api
