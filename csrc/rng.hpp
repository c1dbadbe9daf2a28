// Deterministic random numbers for planning: the same 64-bit seed gives the same stream on every platform,
// compiler and rank. Integer-only (no floating point, no std::uniform_int_distribution, whose output is
// implementation-defined), so plans are bit-identical everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#if defined(_MSC_VER)
#include <intrin.h>
#endif

namespace omnibal {

// Stream ids for derive_seed, so that no two uses of one seed share a random stream. The Python side reads
// them from the extension (omnibal_kernels._C.STREAMS): references and the sampler use these, never copies.
enum Stream : uint64_t {
  kStreamIsfRound = 1,     // ISF: the shuffle of round r is derive_seed(seed, kStreamIsfRound, r)
  kStreamNextFit = 2,      // random next-fit: its one shuffle
  kStreamBestFit = 3,      // balanced: the shuffle of best-fit round r
  kStreamAssign = 4,       // pack -> (step, rank) order
  kStreamRagged = 5,       // packs reused to fill a ragged last step
  kStreamGroupSteps = 16,  // the sampler's interleaving of several groups' steps
};

// Index of the lowest set bit of a non-zero word (portable: GCC/Clang builtin or MSVC intrinsic).
inline int count_trailing_zeros(uint64_t word) {
#if defined(_MSC_VER)
  unsigned long index;
  _BitScanForward64(&index, word);
  return static_cast<int>(index);
#else
  return __builtin_ctzll(word);
#endif
}

// SplitMix64 step: used to expand seeds (Steele, Lea and Flood 2014).
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Mixes a seed with stream identifiers (epoch, round, purpose) into one well-spread 64-bit seed.
inline uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b = 0) {
  uint64_t s = seed;
  uint64_t x = splitmix64(s);
  s = x ^ (a * 0xD1B54A32D192ED03ULL);
  x = splitmix64(s);
  s = x ^ (b * 0x8CB92BA72F3D8DD7ULL);
  return splitmix64(s);
}

// xoshiro256** (Blackman and Vigna 2018): fast, 256-bit state, good statistical quality.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t s = seed;
    for (auto& w : state_) w = splitmix64(s);
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform integer in [0, bound) for bound < 2**32 from 32 random bits, the two halves of one 64-bit
  // draw in turn (Lemire's method on 32 bits): half the draws of below, for Fisher-Yates shuffles.
  uint32_t below32(uint32_t bound) {
    if (!have_half_) {
      half_word_ = next();
      have_half_ = true;
    } else {
      half_word_ >>= 32;
      have_half_ = false;
    }
    uint64_t m = (half_word_ & 0xFFFFFFFFULL) * bound;
    if (static_cast<uint32_t>(m) < bound) {
      const uint32_t threshold = static_cast<uint32_t>(-bound) % bound;
      while (static_cast<uint32_t>(m) < threshold) m = (next() & 0xFFFFFFFFULL) * bound;
    }
    return static_cast<uint32_t>(m >> 32);
  }

  // Uniform integer in [0, bound) by Lemire's multiply-and-reject method (unbiased).
  uint64_t below(uint64_t bound) {
    uint64_t x = next();
    uint64_t hi, lo;
    mul128(x, bound, hi, lo);
    if (lo < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (lo < threshold) {
        x = next();
        mul128(x, bound, hi, lo);
      }
    }
    return hi;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  static void mul128(uint64_t a, uint64_t b, uint64_t& hi, uint64_t& lo) {
#if defined(__SIZEOF_INT128__)
    const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
    hi = static_cast<uint64_t>(p >> 64);
    lo = static_cast<uint64_t>(p);
#else
    const uint64_t a_lo = a & 0xFFFFFFFFULL, a_hi = a >> 32;
    const uint64_t b_lo = b & 0xFFFFFFFFULL, b_hi = b >> 32;
    const uint64_t p0 = a_lo * b_lo, p1 = a_lo * b_hi, p2 = a_hi * b_lo, p3 = a_hi * b_hi;
    const uint64_t mid = (p0 >> 32) + (p1 & 0xFFFFFFFFULL) + (p2 & 0xFFFFFFFFULL);
    lo = (p0 & 0xFFFFFFFFULL) | (mid << 32);
    hi = p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
#endif
  }

  uint64_t state_[4];
  uint64_t half_word_ = 0;
  bool have_half_ = false;
};

// Fisher-Yates shuffle of a[0:n).
template <typename T>
void fisher_yates(T* a, size_t n, Rng& rng) {
  // A local copy of the generator stays in registers: the swaps' stores could otherwise alias it.
  Rng local = rng;
  if (n < (size_t{1} << 32)) {
    for (size_t i = n; i > 1; --i) std::swap(a[i - 1], a[local.below32(static_cast<uint32_t>(i))]);
  } else {
    for (size_t i = n; i > 1; --i) {
      const size_t j = static_cast<size_t>(local.below(i));
      std::swap(a[i - 1], a[j]);
    }
  }
  rng = local;
}

// Writes a uniform random permutation of source(0), ..., source(n - 1) into `out`. Large inputs use Rao's
// two-pass method: every element goes to a uniformly random bin (a sequential scatter), then each bin,
// small enough to stay in cache, gets a Fisher-Yates shuffle. The result is uniform like a plain
// Fisher-Yates, and faster on large inputs, where a plain shuffle misses the cache on almost every swap.
template <typename Vector, typename Source>
void shuffle_from(size_t n, Source source, Rng& rng, Vector& out) {
  out.resize(n);
  constexpr size_t kBinElements = 4096;  // elements per bin on average: fits L1/L2 while shuffled
  if (n <= 8 * kBinElements) {
    for (size_t i = 0; i < n; ++i) out[i] = source(i);
    fisher_yates(out.data(), n, rng);
    return;
  }
  int bits = 1;
  while ((size_t{1} << bits) * kBinElements < n && bits < 16) ++bits;
  const size_t num_bins = size_t{1} << bits;
  // Bins come 4 to a 64-bit draw; the scatter pass replays the counting pass's stream from a copy.
  auto for_each_bin = [&](Rng& stream, auto&& f) {
    Rng r = stream;  // in registers, as in fisher_yates
    uint64_t word = 0;
    for (size_t i = 0; i < n; ++i) {
      if ((i & 3) == 0) word = r.next();
      f(i, static_cast<size_t>((word >> (16 * (i & 3))) & 0xFFFF) >> (16 - bits));
    }
    stream = r;
  };
  const Rng replay = rng;
  std::vector<size_t> start(num_bins + 1, 0);
  for_each_bin(rng, [&](size_t, size_t b) { ++start[b + 1]; });
  for (size_t b = 0; b < num_bins; ++b) start[b + 1] += start[b];
  std::vector<size_t> fill(start.begin(), start.end() - 1);
  Rng again = replay;
  for_each_bin(again, [&](size_t i, size_t b) { out[fill[b]++] = source(i); });
  for (size_t b = 0; b < num_bins; ++b) fisher_yates(out.data() + start[b], start[b + 1] - start[b], rng);
}

// Shuffles v in place (uniformly); `scratch` is reused memory.
template <typename Vector>
void shuffle(Vector& v, Rng& rng, Vector& scratch) {
  shuffle_from(v.size(), [&](size_t i) { return v[i]; }, rng, scratch);
  v.swap(scratch);
}

template <typename Vector>
void shuffle(Vector& v, Rng& rng) {
  Vector scratch;
  shuffle(v, rng, scratch);
}

}  // namespace omnibal
