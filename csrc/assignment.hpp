// Step assignment: packs to (step, rank) slots, in random order or balanced so that the ranks of a step wait
// on each other as little as possible.
#pragma once

#include <cstdint>
#include <vector>

#include "buffers.hpp"
#include "grouping.hpp"
#include "index.hpp"
#include "loads.hpp"

namespace omnibal {

// Where every (step, rank) slot's pack comes from.
struct Assignment {
  LargeVector<Index> step_packs;  // num_steps * world_size pack ids, step-major
  Index num_steps = 0;
  Index duplicated_slots = 0;        // slots of the ragged last step filled by reusing packs
  std::vector<Index> dropped_packs;  // packs left out by drop_last
};

// Packs to slots in random order (what a random sampler over packs does). world_size >= 1.
Assignment assign_random(Index num_packs, Index world_size, bool drop_last, uint64_t seed);

// Packs to slots so that the packs of one step carry near-equal ViT load, LLM load and cost: layered_order
// (step_balance.hpp) makes consecutive runs of world_size packs similar, the runs form the steps, and
// refine_steps swaps samples between the packs of each step, within the capacities, until every pack is
// close to the step's mean in all three (`packs` and `totals` change, pack sizes do not). Steps are laid out
// over the epoch in a stratified random order (no load trend) and ranks are shuffled within a step.
// `totals` holds every pack's loads and cost (best_fit_packs fills it). world_size >= 1.
Assignment assign_balanced(Packs& packs, PackLoads& totals, const Loads& loads, const CostModel& cost, Capacity cap,
                           Index world_size, bool drop_last, uint64_t seed);

}  // namespace omnibal
