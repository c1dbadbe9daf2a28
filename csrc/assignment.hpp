// Step assignment: packs to (step, rank) slots, in random order or balanced so that the ranks of a step wait
// on each other as little as possible.
#pragma once

#include <cstdint>
#include <functional>
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

// Packs to slots so that every step waits as little as possible for its costliest pack: split_to_whole_steps
// raises the pack count to a multiple of world_size where it can (else make_whole_steps repeats or drops
// packs, as drop_last says), packs sorted by cost are cut into runs of world_size, the steps, lift_stuck_packs
// moves packs that would stick out of their step up one step, refine_steps exchanges samples between the packs
// of each step and its neighbours, within the capacities (`packs` and `totals` change), spill_to_room and
// raise_stuck_steps move cost out of and into the steps left above their mean (the steps that gave refined
// again), and settle_steps trades packs between steps; where all that costs more over the epoch than the packs sorted
// by cost at the start, those are kept. Steps are laid out over the epoch in a stratified random order (no load trend)
// and ranks are shuffled within a step. `totals` holds every pack's loads and cost. world_size >= 1; work_per_sample
// bounds refine_steps (0: no exchange, no pack moved up).
// make_packs(packs, totals) makes the packs and their loads (totals.vit, totals.llm; their costs are summed here), the
// same every time it is called (again where the packs sorted by cost are kept).
using PackMaker = std::function<void(Packs&, PackLoads&)>;
Assignment assign_balanced(const PackMaker& make_packs, Packs& packs, PackLoads& totals, const Loads& loads,
                           const SampleCosts& costs, Capacity cap, Index world_size, bool drop_last, uint64_t seed,
                           int64_t work_per_sample);

}  // namespace omnibal
