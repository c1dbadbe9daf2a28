// Grouping of samples into packs under two capacities: random next-fit, the OmniBal paper's ISF, and the
// randomized two-dimensional best fit of the balanced method.
//
// A pack is a set of samples whose ViT sum is at most the ViT capacity and whose LLM sum is at most the LLM
// capacity. Everything here is pure: deterministic from a 64-bit seed (rng.hpp), no global state, no printing,
// no Python. Capacities are in [0, kMaxCapacity]. Items passed in must each fit alone (the caller handles
// oversize samples) and have loads in [0, kMaxLoad]; a load outside that range is refused with
// std::invalid_argument.
#pragma once

#include <cstddef>
#include <cstdint>

#include "buffers.hpp"
#include "index.hpp"
#include "loads.hpp"

namespace omnibal {

// The largest capacity the grouping handles exactly: best fit buckets open packs by room * buckets /
// (capacity + 1) in float64, and up to 2**48 every term is exact and the quotient stays below the bucket
// count; a pack's int64 sums stay far from overflow. Far above any real pack.
constexpr int64_t kMaxCapacity = int64_t{1} << 48;

// best_fit_packs packs a round's shuffled pool in chunks of this many samples: 16k items = 256 KiB, which
// stay in L2 while they are packed and grouped; larger chunks give the same ViT fill. Python reads it as
// omnibal_kernels._C.BEST_FIT_CHUNK.
constexpr size_t kBestFitChunk = size_t{1} << 14;

// Packs in CSR form: the samples of pack p are samples[offsets[p] : offsets[p + 1]].
struct Packs {
  LargeVector<Index> offsets{0};
  LargeVector<Index> samples;

  Index size() const { return static_cast<Index>(offsets.size()) - 1; }
  void close_pack() { offsets.push_back(static_cast<Index>(samples.size())); }
};

// Per-pack totals, kept in step with the packs' contents; cost[p * cost_dims + d] is part d of pack p's cost
// (SampleCosts).
struct PackLoads {
  LargeVector<int64_t> vit, llm;
  LargeVector<double> cost;
  int cost_dims = 1;

  double cost_sum(Index p) const {
    double c = 0.0;
    for (int d = 0; d < cost_dims; ++d) c += cost[static_cast<size_t>(p * cost_dims + d)];
    return c;
  }
};

// Plain random next-fit: shuffle, then close the open pack whenever the next sample does not fit.
Packs random_next_fit(const Loads& loads, ItemSet items, Capacity cap, uint64_t seed);

// The OmniBal paper's Iterative Sampling and Filtering. Round 0 packs all items by random next-fit; each of
// the following rounds keeps the packs whose ViT sum reaches vit_threshold or whose LLM sum reaches
// llm_threshold, pools the samples of the others and packs the pool again by random next-fit with a fresh
// seed; after `iterations` rounds in all, the last packing of the pool is kept whole.
Packs isf(const Loads& loads, ItemSet items, Capacity cap, int64_t vit_threshold, int64_t llm_threshold, int iterations,
          uint64_t seed);

// Randomized two-dimensional best fit, in rounds: each round places the pooled samples in a fresh random
// order, each into the open pack with the least room left in the binding dimension (the one whose total
// over capacity is larger) that still fits it in both; packs with no room left for any sample are final,
// the samples of the others are pooled for the next round; the last round keeps all its packs. A round's
// shuffled pool is packed in chunks of kBestFitChunk samples (random subsets that stay in cache); packs still open at
// the end (from the last round, from a chunk where under a quarter of the samples are in packs that filled up,
// or from a chunk whose open packs have room for under 1/512 of its packs' capacity) are merged across
// chunks, by best fit decreasing over the packs as parts. `totals`
// receives every pack's ViT load and LLM load (appended, in pack order; its cost is the caller's).
// rounds >= 1.
Packs best_fit_packs(const Loads& loads, ItemSet items, Capacity cap, int rounds, uint64_t seed, PackLoads& totals);

}  // namespace omnibal
