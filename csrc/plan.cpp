// plan_balanced (plan.hpp): the balanced method's three stages over one set of per-pack totals.
#include "plan.hpp"

namespace omnibal {

BalancedPlan plan_balanced(const Loads& loads, ItemSet items, ItemSet singles, Capacity cap, const CostModel& cost,
                           int rounds, Index world_size, bool drop_last, uint64_t seed) {
  BalancedPlan plan;
  PackLoads totals;
  plan.packs = best_fit_packs(loads, items, cap, rounds, seed, cost, totals);
  // Samples over a capacity, each alone in a pack of its own (oversize="single").
  for (Index k = 0; k < singles.count; ++k) {
    const Index id = singles.id(k);
    plan.packs.samples.push_back(id);
    plan.packs.close_pack();
    totals.vit.push_back(loads.vit[id]);
    totals.llm.push_back(loads.llm[id]);
    totals.cost.push_back(cost.sample_cost(loads.vit[id], loads.llm[id]));
  }
  plan.assignment = assign_balanced(plan.packs, totals, loads, cost, cap, world_size, drop_last, seed);
  return plan;
}

}  // namespace omnibal
