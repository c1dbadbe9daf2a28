// Grouping of samples into packs under two capacities, and assignment of packs to (step, rank) slots.
//
// Every sample has a ViT load (image tiles or patches) and an LLM load (tokens). A pack is a set of samples
// whose ViT sum is at most the ViT capacity and whose LLM sum is at most the LLM capacity. Everything here
// is pure: deterministic from a 64-bit seed (rng.hpp), no global state, no printing, no Python. Items
// passed in must each fit alone (the caller handles oversize samples) and have loads below 2**31.
#pragma once

#include <cstdint>
#include <vector>

#include "buffers.hpp"

namespace omnibal {

// Per-sample loads, indexed by sample id.
struct Loads {
  const int64_t* vit;
  const int64_t* llm;
};

// The samples to group: ids[0:count], or 0 .. count - 1 when ids is null (a whole dataset, no index array).
struct ItemSet {
  const int64_t* ids;
  int64_t count;

  int64_t id(int64_t k) const { return ids != nullptr ? ids[k] : k; }
};

struct Capacity {
  int64_t vit;
  int64_t llm;
};

// Training cost of one sample: linear and quadratic terms of its ViT and LLM loads.
struct CostModel {
  double vit_linear = 0.0;
  double vit_quadratic = 0.0;
  double llm_linear = 1.0;
  double llm_quadratic = 0.0;

  double sample_cost(int64_t vit, int64_t llm) const {
    const double v = static_cast<double>(vit), t = static_cast<double>(llm);
    return vit_linear * v + vit_quadratic * v * v + llm_linear * t + llm_quadratic * t * t;
  }
};

// Packs in CSR form: the samples of pack p are samples[offsets[p] : offsets[p + 1]].
struct Packs {
  LargeVector<int64_t> offsets{0};
  LargeVector<int64_t> samples;

  int64_t size() const { return static_cast<int64_t>(offsets.size()) - 1; }
  void close_pack() { offsets.push_back(static_cast<int64_t>(samples.size())); }
};

// Where every (step, rank) slot's pack comes from.
struct Assignment {
  LargeVector<int64_t> step_packs;     // num_steps * world_size pack ids, step-major
  int64_t num_steps = 0;
  int64_t duplicated_slots = 0;        // slots of the ragged last step filled by reusing packs
  std::vector<int64_t> dropped_packs;  // packs left out by drop_last
};

// Plain random next-fit: shuffle, then close the open pack whenever the next sample does not fit.
Packs random_next_fit(const Loads& loads, ItemSet items, Capacity cap, uint64_t seed);

// The OmniBal paper's Iterative Sampling and Filtering. Round 0 packs all items by random next-fit; each of
// the following rounds keeps the packs whose ViT sum reaches vit_threshold or whose LLM sum reaches
// llm_threshold, pools the samples of the others and packs the pool again by random next-fit with a fresh
// seed; after `iterations` rounds in all, the last packing of the pool is kept whole.
Packs isf(const Loads& loads, ItemSet items, Capacity cap, int64_t vit_threshold,
          int64_t llm_threshold, int iterations, uint64_t seed);

// Randomized two-dimensional best fit, in rounds: each round places the pooled samples in a fresh random
// order, each into the open pack with the least room left in the binding dimension (the one whose total
// over capacity is larger) that still fits it in both; packs with no room left for any sample are final,
// the samples of the others are pooled for the next round; the last round keeps all its packs. A round's
// shuffled pool is packed in chunks of 16k samples (random subsets that stay in cache); packs still open at
// the end (from the last round, or from a chunk where none filled up) are merged across chunks.
Packs best_fit_packs(const Loads& loads, ItemSet items, Capacity cap, int rounds,
                     uint64_t seed);

// Packs to slots in random order (what a random sampler over packs does).
Assignment assign_random(int64_t num_packs, int64_t world_size, bool drop_last, uint64_t seed);

// Packs to slots so that the packs of one step carry near-equal ViT load, LLM load and cost. Packs are
// sorted by cost and consecutive runs of world_size packs form the steps; samples are then swapped between
// the packs of each step, within the capacities, until every pack is close to the step's mean in all three
// (refine_steps in step_balance.hpp; `packs` changes, pack sizes do not). Steps are laid out over the epoch
// in a stratified random order (no load trend) and ranks are shuffled within a step.
Assignment assign_balanced(Packs& packs, const Loads& loads, const CostModel& cost, Capacity cap,
                           int64_t world_size, bool drop_last, uint64_t seed);

// best_fit_packs, then one pack per sample of `singles` (samples over a capacity, oversize="single"), then
// assign_balanced, sharing the work between them.
struct BalancedPlan {
  Packs packs;
  Assignment assignment;
};
BalancedPlan plan_balanced(const Loads& loads, ItemSet items, ItemSet singles, Capacity cap,
                           const CostModel& cost, int rounds, int64_t world_size, bool drop_last,
                           uint64_t seed);

}  // namespace omnibal
