// plan_balanced (plan.hpp): the balanced method's stages over one set of per-pack totals.
#include "plan.hpp"

#include "step_balance.hpp"

namespace omnibal {

BalancedPlan plan_balanced(const Loads& loads, ItemSet items, ItemSet singles, Capacity cap, const SampleCosts& costs,
                           int rounds, Index world_size, bool drop_last, uint64_t seed, int64_t work_per_sample) {
  BalancedPlan plan;
  PackLoads totals;
  auto make_packs = [&](Packs& packs, PackLoads& pack_totals) {
    pack_totals = PackLoads{};
    packs = best_fit_packs(loads, items, cap, rounds, seed, pack_totals);
    // Samples over a capacity, each alone in a pack of its own (oversize="single").
    for (Index k = 0; k < singles.count; ++k) {
      const Index id = singles.id(k);
      packs.samples.push_back(id);
      packs.close_pack();
      pack_totals.vit.push_back(loads.vit[id]);
      pack_totals.llm.push_back(loads.llm[id]);
    }
  };
  plan.assignment =
      assign_balanced(make_packs, plan.packs, totals, loads, costs, cap, world_size, drop_last, seed, work_per_sample);
  return plan;
}

}  // namespace omnibal
