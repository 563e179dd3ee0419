// CTA-wide top-k of one row of fp32 scores, shared by topk_transform and the fused fp8_paged_mqa_topk.
//
// Order (as the CPU tiers): every float maps to a uint32 order key that grows with rank (numbers ascending,
// -0 == +0, NaN below -inf); the k best are the k largest keys, ties by lower index. Fast path: one histogram of
// the keys' top 11 bits finds the bin holding the k-th key; every entry at or above that bin is gathered as a
// (key, inverted index) pair and a bitonic sort orders them, the first k win. When that bin holds too many entries
// to gather (long runs of equal or close scores), an exact radix select (four 8-bit digits, most significant
// first, then the inverted index of the entries tied with the k-th key) picks exactly the k winners, which are
// sorted the same way. Either way the result is deterministic although the gather order is not.
#pragma once
#include "cuda/portable/common.cuh"

namespace dsv4::cuda {

constexpr int kTopkMaxK = 2048;
constexpr int kTopkRadixBits = 8;
constexpr int kTopkBins = 1 << kTopkRadixBits;
constexpr int kTopkMinThreads = 128;  // a CTA running the select has at least this many threads
constexpr int kTopkBinsPerThread = kTopkBins / kTopkMinThreads;
// The CTA sizes the select works with: a power of two from kTopkMinThreads to 1024 (whole warps, bins split evenly).
constexpr bool topk_threads_supported(int threads) {
  return threads >= kTopkMinThreads && threads <= 1024 && (threads & (threads - 1)) == 0;
}
constexpr uint32_t kTopkNanKey = 0;  // below the key of -inf: NaN ranks after every number
constexpr int kTopkCoarseBits = 11, kTopkCoarseShift = 32 - kTopkCoarseBits;
constexpr int kTopkCoarseBins = 1 << kTopkCoarseBits;
constexpr int kTopkPairs = 2 * kTopkMaxK;  // gathered pairs of the fast path: the winners and the k-th key's bin
constexpr int kTopkMaxWarps = 32;

struct TopkShared {
  uint64_t pairs[kTopkPairs];  // (key << 32) | ~index of the gathered entries; sorted descending
  uint32_t coarse[kTopkCoarseBins];  // histogram of the keys' top bits
  uint32_t hist[kTopkBins];
  uint32_t suffix[kTopkBins];  // suffix[d] = sum of hist[d ..]
  uint32_t warp_totals[kTopkMaxWarps];
  uint32_t digit, need, in_digit;  // the chosen digit (or coarse bin), the rank left inside it, and its count
  uint32_t count;  // pairs gathered so far
};
static_assert(sizeof(TopkShared) <= 48 * 1024, "static shared memory of one CTA");

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
// one paid a full memory latency per entry, behind the shared-memory atomics). topk_for_all_keys calls
// use(i, key, in_range) on every lane for the same number of steps (warp-wide operations inside are safe).
constexpr int kTopkBatch = 16;
template <class Use>
DSV4_DEVICE void topk_for_all_keys(const float* x, int64_t n, Use use) {
  for (int64_t start = 0; start < n; start += int64_t(kTopkBatch) * blockDim.x) {
    float v[kTopkBatch];
#pragma unroll
    for (int u = 0; u < kTopkBatch; ++u) {
      const int64_t i = start + threadIdx.x + int64_t(u) * blockDim.x;
      v[u] = i < n ? x[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kTopkBatch; ++u) {
      const int64_t i = start + threadIdx.x + int64_t(u) * blockDim.x;
      use(i, topk_order_key(v[u]), i < n);
    }
  }
}
template <class Use>
DSV4_DEVICE void topk_for_keys(const float* x, int64_t n, Use use) {
  topk_for_all_keys(x, n, [&](int64_t i, uint32_t key, bool in_range) {
    if (in_range) use(i, key);
  });
}

// Position of this lane's item among the warp's items appended to *counter (take: the lane appends one); one
// shared-memory atomic per warp instead of one per item on the same word. Every lane of the warp calls it.
DSV4_DEVICE uint32_t warp_append(uint32_t* counter, bool take) {
  const uint64_t mask = warp_ballot(take);
  const int lane = int(threadIdx.x) % kWarpSize;
  uint32_t base = 0;
  if (lane == 0 && mask != 0) base = atomicAdd(counter, uint32_t(__popcll(mask)));
  base = warp_broadcast(base, 0);
  return base + uint32_t(__popcll(mask & ((uint64_t(1) << lane) - 1)));
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

// One compare-exchange stage of a bitonic sort over a[0, size) in shared memory (descending runs where the lower
// position has bit `run` clear): thread i compares pair i.
DSV4_DEVICE void topk_sort_stage(uint64_t* a, int size, int run, int stride) {
  for (int i = threadIdx.x; i < size / 2; i += blockDim.x) {
    const int lo = ((i & ~(stride - 1)) << 1) | (i & (stride - 1)), hi = lo + stride;
    const bool descending = (lo & run) == 0;
    const uint64_t x = a[lo], y = a[hi];
    if ((x < y) == descending) a[lo] = y, a[hi] = x;
  }
}

// The element a compare-exchange leaves at position g of a bitonic stage: the larger of (mine, other) where g is
// the lower position of a descending pair or the upper of an ascending one.
DSV4_DEVICE uint64_t topk_exchange(uint64_t mine, uint64_t other, int g, int run, int stride) {
  const bool lower = (g & stride) == 0, descending = (g & run) == 0;
  return (lower == descending) == (mine > other) ? mine : other;
}

// Bitonic sort with the pairs in registers: thread t holds a[kE t, kE t + kE) (size == kE * blockDim.x); strides
// below kE stay in the thread, strides below kE * kWarpSize go through warp shuffles, longer ones through shared
// memory (the only stages that need the CTA barrier).
template <int kE>
DSV4_DEVICE void topk_sort_pairs_in_registers(uint64_t* a, int size) {
  uint64_t r[kE];
  const int first = kE * int(threadIdx.x);
#pragma unroll
  for (int e = 0; e < kE; ++e) r[e] = a[first + e];
  for (int run = 2; run <= size; run <<= 1) {
    int stride = run / 2;
    if (stride >= kE * kWarpSize) {
      __syncthreads();  // every thread has read the pairs it holds
#pragma unroll
      for (int e = 0; e < kE; ++e) a[first + e] = r[e];
      __syncthreads();
      for (; stride >= kE * kWarpSize; stride >>= 1) {
        topk_sort_stage(a, size, run, stride);
        __syncthreads();
      }
#pragma unroll
      for (int e = 0; e < kE; ++e) r[e] = a[first + e];
    }
    for (; stride >= kE; stride >>= 1) {
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        const int lanes = stride / kE;
        const uint32_t lo = warp_xor(uint32_t(r[e]), lanes), hi = warp_xor(uint32_t(r[e] >> 32), lanes);
        r[e] = topk_exchange(r[e], uint64_t(hi) << 32 | lo, first + e, run, stride);
      }
    }
#pragma unroll
    for (int step = kE / 2; step > 0; step >>= 1) {  // compile-time strides keep r in registers
      if (step > stride) continue;  // a run shorter than 2 kE starts below kE / 2
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        if ((e & step) != 0) continue;
        const uint64_t x = r[e], y = r[e + step];
        r[e] = topk_exchange(x, y, first + e, run, step);
        r[e + step] = topk_exchange(y, x, first + e + step, run, step);
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < kE; ++e) a[first + e] = r[e];
  __syncthreads();
}

// Sorts a[0, size) descending (size a power of two): (key, ~index) larger first is score descending, then index
// ascending. Every thread calls it; on return the pairs are visible to the whole CTA.
DSV4_DEVICE void topk_sort_pairs(uint64_t* a, int size) {
  const int per_thread = size / int(blockDim.x);
  if (per_thread * int(blockDim.x) == size) {
    if (per_thread == 1) return topk_sort_pairs_in_registers<1>(a, size);
    if (per_thread == 2) return topk_sort_pairs_in_registers<2>(a, size);
    if (per_thread == 4) return topk_sort_pairs_in_registers<4>(a, size);
    if (per_thread == 8) return topk_sort_pairs_in_registers<8>(a, size);
  }
  for (int run = 2; run <= size; run <<= 1) {
    for (int stride = run / 2; stride > 0; stride >>= 1) {
      topk_sort_stage(a, size, run, stride);
      __syncthreads();
    }
  }
}

// The exact path: the k best by radix select, gathered into s.pairs[0, k) and sorted.
DSV4_DEVICE void topk_select_exact(TopkShared& s, const float* x, int64_t n, int k) {
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
  topk_sort_pairs(s.pairs, k);
}

// The coarse bin holding the k-th largest key (entries above it fewer than k, at or above it at least k): sets
// s.digit, s.need (k minus the entries above) and s.in_digit (its count). Thread t owns a run of bins; a suffix
// scan over the threads gives each the entries above its run, and the thread whose run holds the k-th key walks it.
DSV4_DEVICE void topk_coarse_threshold(TopkShared& s, uint32_t k) {
  const int per = kTopkCoarseBins / int(blockDim.x), first = int(threadIdx.x) * per;
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  uint32_t mine = 0;
  for (int b = 0; b < per; ++b) mine += s.coarse[first + b];
  uint32_t suffix = mine;  // this lane's and the later lanes' entries
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const uint32_t later = warp_down(suffix, offset);
    if (lane + offset < kWarpSize) suffix += later;
  }
  if (lane == 0) s.warp_totals[warp] = suffix;
  __syncthreads();
  uint32_t above = suffix - mine;
  for (int w = warp + 1; w < int(blockDim.x) / kWarpSize; ++w) above += s.warp_totals[w];
  if (above < k && above + mine >= k) {
    for (int b = first + per - 1; b >= first; --b) {
      const uint32_t count = s.coarse[b];
      if (above + count >= k) {
        s.digit = uint32_t(b), s.need = k - above, s.in_digit = count;
        break;
      }
      above += count;
    }
  }
  __syncthreads();
}

// The keys of a row read from memory at every pass.
struct TopkMemoryKeys {
  const float* x;
  template <class Use>
  DSV4_DEVICE void for_all(int64_t n, Use use) const {
    topk_for_all_keys(x, n, use);
  }
};

// The scores of a row's first kTopkHeldKeys * blockDim.x entries held in registers (entry threadIdx.x + j
// blockDim.x in v[j]), loaded once: the select's second pass then reads no memory, and the loads can be issued
// before the row's length is known (load: entries below `available`, the row's room in memory).
constexpr int kTopkHeldKeys = 2 * kTopkBatch;
struct TopkHeldKeys {
  float v[kTopkHeldKeys];

  DSV4_DEVICE void load(const float* x, int64_t available) {
#pragma unroll
    for (int j = 0; j < kTopkHeldKeys; ++j) {
      const int64_t i = threadIdx.x + int64_t(j) * blockDim.x;
      v[j] = i < available ? x[i] : 0.0f;
    }
  }
  template <class Use>
  DSV4_DEVICE void for_all(int64_t n, Use use) const {  // n <= topk_held_capacity()
#pragma unroll
    for (int j = 0; j < kTopkHeldKeys; ++j) {
      const int64_t i = threadIdx.x + int64_t(j) * blockDim.x;
      use(i, topk_order_key(v[j]), i < n);
    }
  }
};
DSV4_DEVICE int64_t topk_held_capacity() { return int64_t(kTopkHeldKeys) * blockDim.x; }

// The k best of x[0, n) (n > k, k a power of two up to kTopkMaxK), sorted, in s.pairs[0, k), with the keys from
// `keys` (a TopkMemoryKeys or TopkHeldKeys of x). Every thread calls it (a CTA size topk_threads_supported takes);
// on return the pairs are visible to the whole CTA.
template <class Keys>
DSV4_DEVICE void topk_select_sorted(TopkShared& s, const Keys& keys, const float* x, int64_t n, int k) {
  for (int b = threadIdx.x; b < kTopkCoarseBins; b += blockDim.x) s.coarse[b] = 0;
  if (threadIdx.x == 0) s.count = 0, s.need = 0, s.in_digit = kTopkPairs + 1;  // no threshold: the exact path
  __syncthreads();
  keys.for_all(n, [&](int64_t, uint32_t key, bool in_range) {
    if (in_range) atomicAdd(&s.coarse[key >> kTopkCoarseShift], 1u);
  });
  __syncthreads();
  topk_coarse_threshold(s, uint32_t(k));
  const uint32_t gathered = uint32_t(k) - s.need + s.in_digit, bin = s.digit;
  if (gathered > uint32_t(kTopkPairs)) {  // uniform over the CTA
    __syncthreads();  // every thread has read the threshold
    return topk_select_exact(s, x, n, k);
  }
  keys.for_all(n, [&](int64_t i, uint32_t key, bool in_range) {
    const bool take = in_range && (key >> kTopkCoarseShift) >= bin;
    const uint32_t at = warp_append(&s.count, take);
    if (take && at < uint32_t(kTopkPairs)) s.pairs[at] = (uint64_t(key) << 32) | ~uint32_t(i);
  });
  int size = k;
  while (uint32_t(size) < gathered) size <<= 1;
  for (int j = int(gathered) + threadIdx.x; j < size; j += blockDim.x) s.pairs[j] = 0;  // below every real pair
  __syncthreads();
  topk_sort_pairs(s.pairs, size);
}

DSV4_DEVICE void topk_select_sorted(TopkShared& s, const float* x, int64_t n, int k) {
  topk_select_sorted(s, TopkMemoryKeys{x}, x, n, k);
}

}  // namespace dsv4::cuda
