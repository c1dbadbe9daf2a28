// Step assignment (assignment.hpp): whole steps out of a ragged pack count, the epoch's stratified order of
// steps with its load-trend check, the layout of steps and ranks, and the random and balanced assignments.
#include "assignment.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "rng.hpp"
#include "step_balance.hpp"

namespace omnibal {
namespace {

// assign_balanced draws up to kMaxLayoutDraws step layouts, kLayoutWork / steps of them, keeping the one with
// the least load trend (each draw costs a pass over the steps).
constexpr Index kLayoutWork = Index{1} << 16;
constexpr Index kMaxLayoutDraws = 64;

// Segments of the epoch that each get one step of every run of this many similar-load steps (stratified_order).
constexpr Index kEpochSegments = 16;

// step_trend leaves out loads whose step totals vary less than this (coefficient of variation).
constexpr double kMinTrendVariation = 0.01;

// Makes the length of `order` a multiple of world_size: drops randomly chosen packs (drop_last) or repeats
// randomly chosen packs, each repeat right after its original, so a sorted order stays sorted.
void make_whole_steps(LargeVector<Index>& order, Index world_size, bool drop_last, Rng& rng, Index& duplicated,
                      std::vector<Index>& dropped) {
  const Index n = static_cast<Index>(order.size());
  const Index tail = n % world_size;
  duplicated = 0;
  if (tail == 0 || n == 0) return;
  const Index count = drop_last ? tail : world_size - tail;
  // `count` positions, distinct while there are enough packs (then round-robin over all of them).
  LargeVector<Index> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  for (Index i = 0; i < std::min(count, n); ++i) {
    const Index j = i + static_cast<Index>(rng.below(static_cast<uint64_t>(n - i)));
    std::swap(pos[static_cast<size_t>(i)], pos[static_cast<size_t>(j)]);
  }
  LargeVector<Index> times(static_cast<size_t>(n), 0);
  for (Index i = 0; i < count; ++i) ++times[static_cast<size_t>(pos[static_cast<size_t>(i % n)])];
  LargeVector<Index> out;
  out.reserve(static_cast<size_t>(drop_last ? n - count : n + count));
  for (Index i = 0; i < n; ++i) {
    const Index p = order[static_cast<size_t>(i)];
    if (drop_last) {
      if (times[static_cast<size_t>(i)] > 0) dropped.push_back(p);
      else out.push_back(p);
    } else {
      out.insert(out.end(), static_cast<size_t>(1 + times[static_cast<size_t>(i)]), p);
    }
  }
  if (!drop_last) duplicated = count;
  order.swap(out);
}

// A random order of steps 0 .. num_steps - 1 given sorted by load, with no trend of load over the epoch:
// the epoch is cut into kEpochSegments segments, each takes one step of every run of kEpochSegments
// consecutive (similar-load) steps, at random, and each segment is then shuffled. A plain shuffle leaves a
// random trend of about 1/sqrt(num_steps) in correlation; this leaves about 1/kEpochSegments of it.
LargeVector<Index> stratified_order(Index num_steps, Rng& rng) {
  const Index segments = std::min<Index>(kEpochSegments, std::max<Index>(num_steps, 1));
  std::vector<std::vector<Index>> segment(static_cast<size_t>(segments));
  std::vector<Index> slots(static_cast<size_t>(segments));
  for (Index run = 0; run < num_steps; run += segments) {
    std::iota(slots.begin(), slots.end(), 0);
    fisher_yates(slots.data(), slots.size(), rng);
    for (Index k = run; k < std::min(run + segments, num_steps); ++k) {
      segment[static_cast<size_t>(slots[static_cast<size_t>(k - run)])].push_back(k);
    }
  }
  LargeVector<Index> order;
  order.reserve(static_cast<size_t>(num_steps));
  for (auto& seg : segment) {
    fisher_yates(seg.data(), seg.size(), rng);
    order.insert(order.end(), seg.begin(), seg.end());
  }
  return order;
}

// Step totals of ViT load, LLM load and cost, for the runs of world_size packs of `order`.
struct StepTotals {
  std::vector<double> load[3];
};

StepTotals step_totals(const LargeVector<Index>& order, const PackLoads& totals, Index world_size) {
  StepTotals out;
  const Index steps = static_cast<Index>(order.size()) / world_size;
  for (auto& load : out.load) load.assign(static_cast<size_t>(steps), 0.0);
  for (Index s = 0; s < steps; ++s) {
    for (Index k = s * world_size; k < (s + 1) * world_size; ++k) {
      const size_t p = static_cast<size_t>(order[static_cast<size_t>(k)]);
      out.load[0][static_cast<size_t>(s)] += static_cast<double>(totals.vit[p]);
      out.load[1][static_cast<size_t>(s)] += static_cast<double>(totals.llm[p]);
      out.load[2][static_cast<size_t>(s)] += totals.cost_sum(static_cast<Index>(p));
    }
  }
  return out;
}

// Trend of the load over an epoch whose position k trains step step_order[k]: the largest |corr(k, total)|
// over the loads whose step totals vary by more than 1% (coefficient of variation; packs at a binding
// capacity give every step the same load, and its correlation is then only where the ragged steps fall).
double step_trend(const LargeVector<Index>& step_order, const StepTotals& totals) {
  const size_t n = step_order.size();
  if (n < 3) return 0.0;
  const double mean_pos = 0.5 * static_cast<double>(n - 1);
  double var_pos = 0.0;
  for (size_t k = 0; k < n; ++k) var_pos += (static_cast<double>(k) - mean_pos) * (static_cast<double>(k) - mean_pos);
  double worst = 0.0;
  for (const std::vector<double>& load : totals.load) {
    const double mean = std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(n);
    double var = 0.0, cov = 0.0;
    for (size_t k = 0; k < n; ++k) {
      const double x = load[static_cast<size_t>(step_order[k])] - mean;
      var += x * x;
      cov += x * (static_cast<double>(k) - mean_pos);
    }
    if (!(mean > 0.0) || var <= kMinTrendVariation * kMinTrendVariation * mean * mean * static_cast<double>(n))
      continue;
    worst = std::max(worst, std::fabs(cov) / std::sqrt(var * var_pos));
  }
  return worst;
}

// Lays `order` (a multiple of world_size long) out as steps in `step_order`, shuffling the ranks of every step.
Assignment lay_out(const LargeVector<Index>& order, Index world_size, const LargeVector<Index>& step_order, Rng& rng) {
  Assignment a;
  a.num_steps = static_cast<Index>(order.size()) / world_size;
  a.step_packs.resize(order.size());
  for (Index s = 0; s < a.num_steps; ++s) {
    const auto src = order.begin() + step_order[static_cast<size_t>(s)] * world_size;
    Index* dst = a.step_packs.data() + s * world_size;
    std::copy(src, src + world_size, dst);
    fisher_yates(dst, static_cast<size_t>(world_size), rng);
  }
  return a;
}

}  // namespace

Assignment assign_random(Index num_packs, Index world_size, bool drop_last, uint64_t seed) {
  Rng rng(derive_seed(seed, kStreamAssign));
  LargeVector<Index> order(static_cast<size_t>(num_packs));
  std::iota(order.begin(), order.end(), 0);
  shuffle(order, rng);
  Rng ragged(derive_seed(seed, kStreamRagged));
  Index duplicated = 0;
  std::vector<Index> dropped;
  make_whole_steps(order, world_size, drop_last, ragged, duplicated, dropped);
  // The packs are in random order already: steps in that order.
  LargeVector<Index> step_order(order.size() / static_cast<size_t>(world_size));
  std::iota(step_order.begin(), step_order.end(), 0);
  Assignment a = lay_out(order, world_size, step_order, rng);
  a.duplicated_slots = duplicated;
  a.dropped_packs = std::move(dropped);
  return a;
}

Assignment assign_balanced(const PackMaker& make_packs, Packs& packs, PackLoads& totals, const Loads& loads,
                           const SampleCosts& costs, Capacity cap, Index world_size, bool drop_last, uint64_t seed,
                           int64_t work_per_sample) {
  Index duplicated = 0;
  std::vector<Index> dropped;
  // Each pack's costliest sample, for the packs as made (the exchanges below do not keep it).
  LargeVector<double> costliest;
  // The packs as made, split to whole steps where they can be, sorted by cost and cut into steps.
  auto sorted_steps = [&]() {
    make_packs(packs, totals);
    fill_pack_costs(packs, costs, totals, &costliest);
    split_to_whole_steps(packs, totals, costliest, loads, costs, world_size);
    LargeVector<Index> order = cost_order(totals, world_size);
    Rng ragged(derive_seed(seed, kStreamRagged));
    duplicated = 0;
    dropped.clear();
    make_whole_steps(order, world_size, drop_last, ragged, duplicated, dropped);
    return order;
  };
  LargeVector<Index> order = sorted_steps();
  // The packs sorted by cost and cut into steps are kept where the passes below, which move packs between
  // steps before their exchanges, end up costing more over the epoch.
  const bool one_part = totals.cost_dims == 1 && work_per_sample > 0;
  const double sorted_epoch = one_part ? epoch_of(order, totals, world_size) : 0.0;
  if (work_per_sample > 0) lift_stuck_packs(order, totals, costliest, costs, world_size);
  refine_steps(packs, totals, loads, costs, cap, order, world_size, work_per_sample);
  // The spill and raise passes lower steps left above their mean; once the epoch is within kRefineTolerance of
  // its ideal (the total cost over world_size, which the passes keep), they could gain less than the share
  // each step is held to, and are skipped.
  const bool settled =
      epoch_of(order, totals, world_size) <= (1.0 + kRefineTolerance) * ideal_of(order, totals, world_size);
  if (work_per_sample > 0 && !settled) spill_to_room(packs, totals, loads, costs, cap, order, world_size);
  // The raise pass raises no step's costliest pack, yet settle_steps, a greedy trade, may end a little higher from
  // the packs it leaves: the plan as it was before the raise is settled too, and the cheaper of the two kept.
  Packs unraised_packs;
  PackLoads unraised_totals;
  LargeVector<Index> unraised_order;
  bool raised = false;
  if (one_part && !settled) {
    unraised_packs = packs, unraised_totals = totals, unraised_order = order;
    std::vector<char> gave;
    raised = raise_stuck_steps(packs, totals, loads, costs, cap, order, world_size, gave) > 0;
    // the steps that gave cost are balanced again about their lower mean
    if (raised) refine_steps(packs, totals, loads, costs, cap, order, world_size, work_per_sample, &gave);
  }
  settle_steps(order, totals, world_size);
  if (raised) {
    settle_steps(unraised_order, unraised_totals, world_size);
    if (epoch_of(unraised_order, unraised_totals, world_size) < epoch_of(order, totals, world_size)) {
      packs = std::move(unraised_packs), totals = std::move(unraised_totals), order = std::move(unraised_order);
    }
  }
  // They are made again rather than copied before the passes: the passes rarely end up above them.
  if (one_part && epoch_of(order, totals, world_size) > sorted_epoch) order = sorted_steps();
  Rng rng(derive_seed(seed, kStreamAssign));
  const Index num_steps = static_cast<Index>(order.size()) / world_size;
  LargeVector<Index> step_order = stratified_order(num_steps, rng);
  // A layout's random trend grows as the steps get fewer, and with few steps one stratified layout can still
  // show one: more layouts are drawn, kLayoutWork / num_steps of them (at most kMaxLayoutDraws), and the one
  // with the least trend is kept. Many steps leave almost none, and get one draw.
  const Index draws = std::min(kMaxLayoutDraws, kLayoutWork / std::max<Index>(num_steps, 1));
  if (draws > 1) {
    const StepTotals step_loads = step_totals(order, totals, world_size);
    double best = step_trend(step_order, step_loads);
    for (Index d = 1; d < draws; ++d) {
      LargeVector<Index> candidate = stratified_order(num_steps, rng);
      const double trend = step_trend(candidate, step_loads);
      if (trend < best) best = trend, step_order.swap(candidate);
    }
  }
  Assignment a = lay_out(order, world_size, step_order, rng);
  a.duplicated_slots = duplicated;
  a.dropped_packs = std::move(dropped);
  return a;
}

}  // namespace omnibal
