// The balanced method end to end: best-fit packs, one pack per oversize single, and the balanced assignment.
#pragma once

#include <cstdint>

#include "assignment.hpp"
#include "grouping.hpp"
#include "index.hpp"
#include "loads.hpp"

namespace omnibal {

struct BalancedPlan {
  Packs packs;
  Assignment assignment;
};

// best_fit_packs of `items`, then one pack per sample of `singles` (samples over a capacity,
// oversize="single"), then assign_balanced; the packs' loads are summed where the packs are formed.
BalancedPlan plan_balanced(const Loads& loads, ItemSet items, ItemSet singles, Capacity cap, const SampleCosts& costs,
                           int rounds, Index world_size, bool drop_last, uint64_t seed, int64_t work_per_sample);

}  // namespace omnibal
