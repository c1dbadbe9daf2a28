// What the passes over a settled assignment share (spill_to_room in step_spill.cpp, raise_stuck_steps in
// step_raise.cpp): each step's costliest pack and mean, the packs that may change (each used once, within the
// capacities), every changed pack's samples kept beside the packs given, and the packs rebuilt from them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "grouping.hpp"
#include "index.hpp"
#include "loads.hpp"
#include "step_balance.hpp"
#include "step_pool.hpp"

namespace omnibal {

class StepPass {
 public:
  // The packs with every changed pack's samples in place of its original ones (costs summed afresh); false,
  // and `out` untouched, where none changed.
  bool rebuild(Packs& out) const {
    if (std::find(changed_.begin(), changed_.end(), 1) == changed_.end()) return false;
    PackContents contents(packs_);
    for (Index p = 0; p < packs_.size(); ++p) {
      if (changed_[static_cast<size_t>(p)]) contents.store(p, content_[static_cast<size_t>(p)]);
    }
    out = contents.rebuild();
    for (Index p = 0; p < out.size(); ++p) {
      if (changed_[static_cast<size_t>(p)]) fill_pack_cost(out, costs_, p, totals_);
    }
    return true;
  }

 protected:
  StepPass(const Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
           const LargeVector<Index>& order, Index world_size)
      : packs_(packs), totals_(totals), loads_(loads), costs_(costs), cap_(cap), order_(order), w_(world_size) {
    const size_t n = static_cast<size_t>(packs.size());
    std::vector<Index> uses(n, 0);
    for (const Index p : order) ++uses[static_cast<size_t>(p)];
    frozen_.assign(n, 1);
    step_of_.assign(n, -1);
    for (size_t p = 0; p < n; ++p) {
      frozen_[p] = uses[p] != 1 || totals.vit[p] > cap.vit || totals.llm[p] > cap.llm;
    }
    num_steps_ = static_cast<Index>(order.size()) / world_size;
    top_.assign(static_cast<size_t>(num_steps_), 0.0);
    mean_.assign(static_cast<size_t>(num_steps_), 0.0);
    for (Index s = 0; s < num_steps_; ++s) {
      double sum = 0.0, top = 0.0;
      for (Index k = s * w_; k < (s + 1) * w_; ++k) {
        const Index p = order[static_cast<size_t>(k)];
        step_of_[static_cast<size_t>(p)] = s;
        sum += cost(p);
        top = std::max(top, cost(p));
      }
      top_[static_cast<size_t>(s)] = top, mean_[static_cast<size_t>(s)] = sum / static_cast<double>(w_);
    }
    content_.resize(n);
    changed_.assign(n, 0);
  }

  double cost(Index p) const { return totals_.cost[static_cast<size_t>(p)]; }
  double sample_cost(Index i) const { return costs_.cost[static_cast<size_t>(i)]; }
  bool above(Index s) const {
    return top_[static_cast<size_t>(s)] > (1.0 + kRefineTolerance) * mean_[static_cast<size_t>(s)];
  }
  // The steps above their mean, the most excess over it first (ties by step).
  std::vector<Index> steps_above() const {
    std::vector<Index> steps;
    for (Index s = 0; s < num_steps_; ++s) {
      if (above(s)) steps.push_back(s);
    }
    std::sort(steps.begin(), steps.end(), [&](Index a, Index b) {
      const double ea = top_[static_cast<size_t>(a)] - mean_[static_cast<size_t>(a)];
      const double eb = top_[static_cast<size_t>(b)] - mean_[static_cast<size_t>(b)];
      return ea != eb ? ea > eb : a < b;
    });
    return steps;
  }
  // Pack p's samples as they are now: the first and how many.
  const Index* first(Index p) const {
    const size_t q = static_cast<size_t>(p);
    return changed_[q] ? content_[q].data() : packs_.samples.data() + packs_.offsets[q];
  }
  Index size_of(Index p) const {
    const size_t q = static_cast<size_t>(p);
    return changed_[q] ? static_cast<Index>(content_[q].size()) : packs_.offsets[q + 1] - packs_.offsets[q];
  }
  // Pack p's samples to change (copied from the packs given on first use).
  std::vector<Index>& samples(Index p) {
    const size_t q = static_cast<size_t>(p);
    if (!changed_[q]) {
      content_[q].assign(packs_.samples.begin() + packs_.offsets[q], packs_.samples.begin() + packs_.offsets[q + 1]);
      changed_[q] = 1;
    }
    return content_[q];
  }

  const Packs& packs_;
  PackLoads& totals_;
  const Loads& loads_;
  const SampleCosts& costs_;
  Capacity cap_;
  const LargeVector<Index>& order_;
  Index w_, num_steps_ = 0;
  std::vector<char> frozen_, changed_;
  std::vector<Index> step_of_;  // each pack's step (-1: in none)
  std::vector<double> top_, mean_;
  std::vector<std::vector<Index>> content_;  // a changed pack's samples
};

}  // namespace omnibal
