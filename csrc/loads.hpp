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

// Training cost of every sample (finite, >= 0; computed by the caller from its cost model) in `dims` parts,
// cost[id * dims + d]: one (the step's time) or two (the ViT's and the LLM's, on different pipeline stages);
// a pack costs the sum of its samples' in each part, plus per_pack in the last.
struct SampleCosts {
  const double* cost;
  int dims = 1;
  double per_pack = 0.0;

  double total(Index id) const {
    double c = 0.0;
    for (int d = 0; d < dims; ++d) c += cost[id * dims + d];
    return c;
  }
};

// Totals and maxima of per-sample loads in one pass, and the LLM total with every sample rounded up to
// `llm_bin` tokens (the capacity search's grid step).
struct LoadStats {
  int64_t vit_sum = 0, llm_sum = 0, vit_max = 0, llm_max = 0, llm_sum_binned = 0;
};
LoadStats load_stats(const int64_t* vit, const int64_t* llm, Index n, int64_t llm_bin);

// out[i] = the sum of values[offsets[i] : offsets[i + 1]] squared, each value taken as a double and the squares
// added in row order (a sample's sum_j s_j**2 over its ViT sequences). `offsets` has rows + 1 entries, from
// 0, non-decreasing, ending at the number of values (checked by the caller).
void row_square_sums(const int64_t* offsets, Index rows, const int64_t* values, double* out);

// The terms of a cost model (CostModel on the Python side, per_pack aside), in its order.
struct CostTerms {
  double vit_linear = 0.0, vit_quadratic = 0.0, llm_linear = 0.0, llm_quadratic = 0.0, per_sample = 0.0;
};

// out[i] = vit_linear * v + vit_quadratic * sum_j s_j**2 + llm_linear * t + llm_quadratic * t**2 + per_sample
// for sample i, each load taken as a double and the terms added in this order, a zero term skipped (what
// CostModel.sample_costs computes one array at a time, to the bit). sum_j s_j**2 is square_sums[i]
// (row_square_sums over the sample's ViT sequences), or v * v, the whole ViT load as one sequence, when
// square_sums is null.
void sample_costs(const int64_t* vit, const int64_t* llm, Index n, const double* square_sums, const CostTerms& terms,
                  double* out);

}  // namespace omnibal
