// Torch-free harness for the CUDA sparse MLA decode kernels on DeepSeek-V4 shapes: builds random MODEL1 caches
// (compressed set + sliding window, 64-entry pages), plans once, checks the Hopper tier against the portable kernel
// (rows off by more than 5% of 1 + |out| are listed: with these wide-range caches a few near-tied softmax rows
// legitimately differ between bf16 and fp32 P) and times each tier (median of cold-L2 runs, CUDA events). Built and
// run by tools/perf/decode_bench.sh; a quick loop for kernel work that needs no torch build.
//   decode_bench [batch heads compressed window reps]...   (defaults: the V4-Flash and V4-Pro C4A grid)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/decode_schedule.h"
#include "cuda/launchers.h"

namespace {

using dsv4::SparseMlaDecodeParams;

constexpr int kDim = 512, kPage = 64, kEntryBytes = 584, kDataBytes = 576, kSms = 132;
constexpr size_t kFlushBytes = size_t(256) << 20;

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, v.size() * sizeof(T) + 16));
  CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// A MODEL1 paged cache of `entries` entries with random finite e4m3 codes, scales near 2^0 and bf16 RoPE parts.
dsv4::PagedCache random_cache(int64_t entries, std::mt19937& rng) {
  const int64_t pages = (entries + kPage - 1) / kPage;
  std::vector<uint8_t> bytes(size_t(pages) * kPage * kEntryBytes);
  std::uniform_int_distribution<int> byte(0, 255), scale(122, 130);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t pg = 0; pg < pages; ++pg) {
    uint8_t* page = bytes.data() + pg * kPage * kEntryBytes;
    for (int e = 0; e < kPage; ++e) {
      uint8_t* data = page + e * kDataBytes;
      for (int i = 0; i < 448; ++i) {
        int b = byte(rng);
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes in a quantized cache
        data[i] = uint8_t(b);
      }
      for (int i = 0; i < 64; ++i) {
        const uint16_t v = to_bf16(normal(rng));
        std::memcpy(data + 448 + 2 * i, &v, 2);
      }
      uint8_t* sc = page + kPage * kDataBytes + e * 8;
      for (int i = 0; i < 7; ++i) sc[i] = uint8_t(scale(rng));
      sc[7] = 0;
    }
  }
  dsv4::PagedCache c;
  c.base = upload(bytes);
  c.num_blocks = pages;
  c.block_stride = kPage * kEntryBytes;
  c.block_size = kPage;
  return c;
}

// [batch, 1, per] distinct random slots of a pool of batch * per entries.
int32_t* random_slots(int64_t batch, int64_t per, std::mt19937& rng) {
  std::vector<int32_t> pool(size_t(batch * per)), out;
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = int32_t(i);
  out.reserve(size_t(batch * per));
  for (int64_t r = 0; r < batch; ++r) {
    std::shuffle(pool.begin(), pool.end(), rng);
    out.insert(out.end(), pool.begin(), pool.begin() + per);
  }
  return upload(out);
}

using Launcher = cudaError_t (*)(const SparseMlaDecodeParams&, cudaStream_t);

struct Tier {
  const char* name;
  Launcher launch;
};

void run_case(int64_t batch, int64_t heads, int64_t compressed, int64_t window, int reps, const std::vector<Tier>& tiers,
              uint8_t* flush) {
  std::mt19937 rng(1234 + unsigned(batch * 7 + heads));
  SparseMlaDecodeParams p;
  p.b = batch, p.s_q = 1, p.h_q = heads, p.d_qk = kDim, p.d_v = kDim;
  p.q_stride_h = kDim, p.q_stride_s = heads * kDim, p.q_stride_b = heads * kDim;
  std::vector<uint16_t> q(size_t(batch * heads * kDim));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : q) v = to_bf16(normal(rng));
  p.q = upload(q);
  std::vector<float> sink(static_cast<size_t>(heads));
  for (auto& v : sink) v = normal(rng);
  p.attn_sink = upload(sink);
  p.sm_scale = 1.0f / std::sqrt(float(kDim));
  p.main.indices = random_slots(batch, compressed, rng);
  p.main.stride_b = compressed, p.main.stride_s = compressed, p.main.topk = compressed;
  p.main.cache = random_cache(batch * compressed, rng);
  if (window > 0) {
    p.extra.indices = random_slots(batch, window, rng);
    p.extra.stride_b = window, p.extra.stride_s = window, p.extra.topk = window;
    p.extra.cache = random_cache(batch * window, rng);
  }
  p.sched.num_parts = dsv4::decode_partitions(kSms, 1, heads);
  CHECK(cudaMalloc(&p.sched.sched_meta, p.sched.num_parts * dsv4::kDecodeSchedWords * 4));
  CHECK(cudaMalloc(&p.sched.num_splits, (batch + 1) * 4));
  CHECK(cudaMalloc(&p.sched.o_accum, (batch + p.sched.num_parts) * heads * kDim * 4));
  CHECK(cudaMalloc(&p.sched.lse_accum, (batch + p.sched.num_parts) * heads * 4));
  CHECK(cudaMalloc(&p.out, batch * heads * kDim * 2));
  CHECK(cudaMalloc(&p.lse, batch * heads * 4));
  CHECK(dsv4::cuda::launch_sparse_mla_decode_schedule(p, nullptr));
  std::vector<int32_t> splits(size_t(batch + 1));
  CHECK(cudaMemcpy(splits.data(), p.sched.num_splits, splits.size() * 4, cudaMemcpyDeviceToHost));

  const size_t n_out = size_t(batch * heads * kDim);
  std::vector<uint16_t> ref(n_out), got(n_out);
  std::vector<float> ref_lse(size_t(batch * heads)), got_lse(ref_lse.size());
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const double flops = 4.0 * batch * heads * kDim * double(compressed + window);
  const double bytes = batch * (double(compressed + window) * (kEntryBytes + 4) + 4.0 * heads * kDim);
  std::printf("B=%lld H=%lld %lld+%lld parts=%lld pieces=%d\n", (long long)batch, (long long)heads,
              (long long)window, (long long)compressed, (long long)p.sched.num_parts, splits.back());
  for (size_t t = 0; t < tiers.size(); ++t) {
    CHECK(cudaMemset(p.out, 0xff, n_out * 2));  // NaN poison: unwritten outputs show
    CHECK(cudaMemset(p.lse, 0xff, ref_lse.size() * 4));
    CHECK(tiers[t].launch(p, nullptr));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(t == 0 ? ref.data() : got.data(), p.out, n_out * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(t == 0 ? ref_lse.data() : got_lse.data(), p.lse, ref_lse.size() * 4, cudaMemcpyDeviceToHost));
    double max_diff = 0, max_lse = 0;
    if (t > 0) {
      for (size_t i = 0; i < n_out; ++i) {  // relative to the reference value (bf16 outputs)
        const double want = double(from_bf16(ref[i]));
        const double d = std::fabs(want - double(from_bf16(got[i]))) / (1.0 + std::fabs(want));
        max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
      }
      int bad_rows = 0;
      for (int64_t row = 0; row < batch * heads; ++row) {  // (request, head) rows off by more than bf16 noise
        double worst = 0;
        for (int d = 0; d < kDim; ++d) {
          const double want = double(from_bf16(ref[row * kDim + d]));
          worst = std::max(worst, std::fabs(want - double(from_bf16(got[row * kDim + d]))) / (1.0 + std::fabs(want)));
        }
        if (!(worst < 0.05) && bad_rows++ < 4)
          std::printf("    bad row: request %lld head %lld (%.3g)\n", (long long)(row / heads), (long long)(row % heads),
                      worst);
      }
      if (bad_rows > 0) std::printf("    %d bad rows of %lld\n", bad_rows, (long long)(batch * heads));
      for (size_t i = 0; i < ref_lse.size(); ++i) {
        const double d = std::fabs(double(ref_lse[i]) - double(got_lse[i]));
        max_lse = std::isnan(d) ? INFINITY : std::max(max_lse, d);
      }
    }
    std::vector<float> times;
    for (int i = 0; i < reps; ++i) {
      CHECK(cudaMemsetAsync(flush, i & 0xff, kFlushBytes));
      CHECK(cudaEventRecord(start));
      CHECK(tiers[t].launch(p, nullptr));
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms * 1000.0f);
    }
    std::sort(times.begin(), times.end());
    const double us = times[times.size() / 2];
    std::printf("  %-10s %9.1f us  %8.0f ns/token  %6.1f TFLOP/s  %5.2f TB/s  max|dout|/(1+|out|) %.3g  max|dlse| %.3g%s\n",
                tiers[t].name, us, us * 1000.0 / batch, flops / us * 1e-6, bytes / us * 1e-6, max_diff, max_lse,
                t > 0 && !(max_lse <= 1e-2) ? "  LSE MISMATCH" : "");
  }
  CHECK(cudaFree(const_cast<uint16_t*>(p.q)));
  CHECK(cudaFree(const_cast<float*>(p.attn_sink)));
  CHECK(cudaFree(const_cast<void*>(p.main.indices)));
  CHECK(cudaFree(p.main.cache.base));
  if (window > 0) {
    CHECK(cudaFree(const_cast<void*>(p.extra.indices)));
    CHECK(cudaFree(p.extra.cache.base));
  }
  CHECK(cudaFree(p.sched.sched_meta));
  CHECK(cudaFree(p.sched.num_splits));
  CHECK(cudaFree(p.sched.o_accum));
  CHECK(cudaFree(p.sched.lse_accum));
  CHECK(cudaFree(p.out));
  CHECK(cudaFree(p.lse));
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  uint8_t* flush = nullptr;
  CHECK(cudaMalloc(&flush, kFlushBytes));
  const std::vector<Tier> tiers = {{"portable", dsv4::cuda::launch_sparse_mla_decode},
                                   {"sm90", dsv4::cuda::launch_sparse_mla_decode_sm90}};
  std::vector<std::vector<int64_t>> cases;
  for (int i = 1; i + 4 < argc; i += 5)
    cases.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), std::atoll(argv[i + 3]),
                     std::atoll(argv[i + 4])});
  if (cases.empty())
    for (int64_t b : {1, 32, 128, 256}) cases.push_back({b, 64, 512, 128, 20});
  if (argc <= 1)
    for (int64_t b : {1, 128}) cases.push_back({b, 128, 1024, 128, 20});
  for (const auto& c : cases) run_case(c[0], c[1], c[2], c[3], int(c[4]), tiers, flush);
  return 0;
}
