// Per-sample loads and what the engine reads from them: the loads themselves, a set of sample ids, the two
// capacities of a pack, the per-sample costs, and one pass of load statistics.
//
// Every sample has a ViT load (image tiles or patches) and an LLM load (tokens), both in [0, kMaxLoad]: the
// grouping keeps them as int32 next to each sample's id (see item_of in grouping.cpp, which checks).
#pragma once

#include <cstdint>
#include <limits>

#include "index.hpp"

namespace omnibal {

constexpr Index kMaxLoad = std::numeric_limits<int32_t>::max();

// Per-sample loads, indexed by sample id.
struct Loads {
  const int64_t* vit;
  const int64_t* llm;
};

// The samples to group: ids[0:count], or 0 .. count - 1 when ids is null (a whole dataset, no index array).
struct ItemSet {
  const Index* ids;
  Index count;

  Index id(Index k) const { return ids != nullptr ? ids[k] : k; }
};

struct Capacity {
  int64_t vit;
  int64_t llm;
};

// Training cost of every sample, indexed by sample id (finite, >= 0; computed by the caller from its cost
// model), and the cost of a pack beyond its samples'.
struct SampleCosts {
  const double* cost;
  double per_pack = 0.0;
};

// Totals and maxima of per-sample loads in one pass, and the LLM total with every sample rounded up to
// `llm_bin` tokens (the capacity search's grid step).
struct LoadStats {
  int64_t vit_sum = 0, llm_sum = 0, vit_max = 0, llm_max = 0, llm_sum_binned = 0;
};
LoadStats load_stats(const int64_t* vit, const int64_t* llm, Index n, int64_t llm_bin);

}  // namespace omnibal
