// CTA-wide top-k of one row of fp32 scores, shared by topk_transform and the fused fp8_paged_mqa_topk.
//
// Order (as the CPU tiers): every float maps to a uint32 order key that grows with rank (numbers ascending,
// -0 == +0, NaN below -inf); the k best are the k largest keys, ties by lower index. A radix select (four 8-bit
// digits, most significant first, shared-memory histograms) finds the k-th key; when only some entries equal to
// it belong to the top k, a second radix select on the inverted index of those entries picks the lowest ones.
// The winners are gathered (in any order) and a bitonic sort on (key, inverted index) orders them: the result is
// deterministic although the gather order is not.
#pragma once
#include "cuda/portable/common.cuh"

namespace dsv4::cuda {

constexpr int kTopkMaxK = 2048;
constexpr int kTopkRadixBits = 8;
constexpr int kTopkBins = 1 << kTopkRadixBits;
constexpr int kTopkMinThreads = 128;  // a CTA running the select has at least this many threads
constexpr int kTopkBinsPerThread = kTopkBins / kTopkMinThreads;
constexpr uint32_t kTopkNanKey = 0;  // below the key of -inf: NaN ranks after every number

struct TopkShared {
  uint64_t pairs[kTopkMaxK];  // (key << 32) | ~index of the winners; sorted descending
  uint32_t hist[kTopkBins];
  uint32_t suffix[kTopkBins];  // suffix[d] = sum of hist[d ..]
  uint32_t digit, need, in_digit;  // the chosen digit of a radix pass, the rank left inside it, and its count
  uint32_t count;  // winners gathered so far
};

// Order key of one score.
DSV4_DEVICE uint32_t topk_order_key(float x) {
  uint32_t u = __float_as_uint(x);
  u = u == 0x80000000u ? 0u : u;  // -0 ranks as +0
  return isnan(x) ? kTopkNanKey : u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
}

// The winner at position j of the sorted pairs: its row-relative index.
DSV4_DEVICE uint32_t topk_pair_index(uint64_t pair) { return ~uint32_t(pair); }

// s.suffix[d] = sum of s.hist[d ..] (Hillis-Steele over the 256 bins; every thread calls it).
DSV4_DEVICE void topk_suffix_sums(TopkShared& s) {
  for (int d = threadIdx.x; d < kTopkBins; d += blockDim.x) s.suffix[d] = s.hist[d];
  __syncthreads();
  for (int offset = 1; offset < kTopkBins; offset <<= 1) {
    uint32_t add[kTopkBinsPerThread];
#pragma unroll
    for (int i = 0; i < kTopkBinsPerThread; ++i) {
      const int d = threadIdx.x + i * blockDim.x;
      add[i] = d < kTopkBins && d + offset < kTopkBins ? s.suffix[d + offset] : 0u;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTopkBinsPerThread; ++i) {
      const int d = threadIdx.x + i * blockDim.x;
      if (d < kTopkBins) s.suffix[d] += add[i];
    }
    __syncthreads();
  }
}

// Visits this thread's entries i = threadIdx.x + j * blockDim.x < n with use(i, key(x[i])), kTopkBatch at a time:
// the loads of a batch are all issued before any of them is used (a loop that used each load before the next
// one paid a full memory latency per entry, behind the shared-memory atomics).
constexpr int kTopkBatch = 8;
template <class Use>
DSV4_DEVICE void topk_for_keys(const float* x, int64_t n, Use use) {
  for (int64_t base = threadIdx.x; base < n; base += int64_t(kTopkBatch) * blockDim.x) {
    float v[kTopkBatch];
#pragma unroll
    for (int u = 0; u < kTopkBatch; ++u) {
      const int64_t i = base + int64_t(u) * blockDim.x;
      v[u] = i < n ? x[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kTopkBatch; ++u) {
      const int64_t i = base + int64_t(u) * blockDim.x;
      if (i < n) use(i, topk_order_key(v[u]));
    }
  }
}

// Radix select over the values value(i, key, v) of the entries i < n of x that take part (value returns true;
// key is the entry's order key): the rank-th largest value (rank >= 1, at most the number taking part), and in
// ties how many entries equal to it belong to the top rank. Every thread calls it and gets the same answer.
template <class Value>
DSV4_DEVICE uint32_t topk_radix_select(TopkShared& s, const float* x, int64_t n, uint32_t rank, Value value,
                                       uint32_t& ties) {
  uint32_t prefix = 0, mask = 0, need = rank;
  for (int shift = 32 - kTopkRadixBits; shift >= 0; shift -= kTopkRadixBits) {
    for (int d = threadIdx.x; d < kTopkBins; d += blockDim.x) s.hist[d] = 0;
    __syncthreads();
    topk_for_keys(x, n, [&](int64_t i, uint32_t key) {
      uint32_t v;
      if (value(i, key, v) && (v & mask) == prefix) atomicAdd(&s.hist[(v >> shift) & (kTopkBins - 1)], 1u);
    });
    __syncthreads();
    topk_suffix_sums(s);
    for (int d = threadIdx.x; d < kTopkBins; d += blockDim.x) {
      const uint32_t above = d + 1 < kTopkBins ? s.suffix[d + 1] : 0u;
      if (s.suffix[d] >= need && above < need) s.digit = d, s.need = need - above, s.in_digit = s.hist[d];
    }
    __syncthreads();
    prefix |= s.digit << shift;
    mask |= uint32_t(kTopkBins - 1) << shift;
    need = s.need;
  }
  ties = need;
  return prefix;
}

// The k best of x[0, n) (n > k, k a power of two up to kTopkMaxK), sorted, in s.pairs[0, k). Every thread calls
// it; on return the pairs are visible to the whole CTA.
DSV4_DEVICE void topk_select_sorted(TopkShared& s, const float* x, int64_t n, int k) {
  uint32_t ties = 0;
  const uint32_t kth = topk_radix_select(
      s, x, n, uint32_t(k),
      [](int64_t, uint32_t key, uint32_t& v) {
        v = key;
        return true;
      },
      ties);
  const uint32_t equal = s.in_digit;  // entries whose key is the k-th key
  // Inverted index of the last entry equal to the k-th key that still wins (all of them win when ties == equal).
  uint32_t last_tie = 0, unused = 0;
  if (ties < equal) {
    __syncthreads();  // every thread has read s.in_digit
    last_tie = topk_radix_select(
        s, x, n, ties,
        [kth](int64_t i, uint32_t key, uint32_t& v) {
          v = ~uint32_t(i);
          return key == kth;
        },
        unused);
  }
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  topk_for_keys(x, n, [&](int64_t i, uint32_t key) {
    const uint32_t inverted = ~uint32_t(i);
    if (key > kth || (key == kth && inverted >= last_tie)) {
      const uint32_t at = atomicAdd(&s.count, 1u);
      if (at < uint32_t(k)) s.pairs[at] = (uint64_t(key) << 32) | inverted;
    }
  });
  __syncthreads();
  // Bitonic sort, descending: (key, ~index) larger first is score descending, then index ascending.
  for (int size = 2; size <= k; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < k / 2; i += blockDim.x) {
        const int lo = 2 * stride * (i / stride) + (i % stride), hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const uint64_t a = s.pairs[lo], b = s.pairs[hi];
        if ((a < b) == descending) s.pairs[lo] = b, s.pairs[hi] = a;
      }
      __syncthreads();
    }
  }
}

}  // namespace dsv4::cuda
