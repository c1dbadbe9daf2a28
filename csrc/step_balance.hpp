// Step assignment: which packs train side by side in one step. layered_order makes the packs of a step
// similar in ViT load, LLM load and cost; refine_steps then exchanges samples between the packs of a step,
// within the capacities, until they carry near-equal loads and cost.
//
// A data-parallel step waits for the rank with the most cost; when the ViT and the LLM sit on different
// pipeline stages, each stage waits for the rank with the most of its own load. Sorting packs and cutting
// consecutive runs into steps makes the packs of a step similar in the sort key only; the exchanges here
// bring down the largest pack of the step in every load at once.
#pragma once

#include <cstdint>
#include <vector>

#include "buffers.hpp"
#include "grouping.hpp"

namespace omnibal {

// Per-pack totals, kept in step with the packs' contents.
struct PackLoads {
  LargeVector<int64_t> vit, llm;
  LargeVector<double> cost;
};

// The packs in an order whose consecutive runs of world_size packs form the steps. The loads that vary across
// packs (ViT, LLM, cost; relative spread between the 5th and 95th percentile above kRefineTolerance) are
// taken in order of decreasing spread: all packs are sorted by the first, blocks of consecutive packs are
// re-sorted by the second, smaller blocks by the third. A step then spans 1/K of each level's block in that
// level's load; the block sizes are chosen from the measured spreads r_1..r_d and the number of steps S so
// that every load gets the same share, (r_1 * ... * r_d / S)^(1/d), of its spread: nothing tuned on a data set.
// Sorts are decreasing, ties by pack id (packs are numbered in random order), so the order is the same on
// every platform.
LargeVector<int64_t> layered_order(const PackLoads& totals, int64_t world_size);

// For every step (the packs order[s * world_size : (s + 1) * world_size]), repeatedly takes the pack with the
// largest load relative to the step's mean (ViT, LLM or cost, whichever is largest) and swaps one of its
// samples with one of another pack of the step, choosing the swap that lowers the larger of the two packs'
// relative loads the most, as long as it lowers it below the first pack's, both packs stay within the
// capacities and no load of either ends above the step's largest of its kind (evening out one load must not
// make the step wait longer on another). Loads are taken relative to the mean (cost) or the mean rounded up
// (integer loads: the least largest pack a step can have). A step stops when all its packs are within
// kRefineTolerance of that, when no swap helps, or after a bounded number of swaps. Packs that appear more than once in `order` (reused packs of a ragged
// step) and packs over a capacity (oversize singles) are left as they are. Pack sizes never change; every
// sample stays in exactly one pack. Deterministic: no randomness, a fixed scan order.
// Returns the number of swaps made.
int64_t refine_steps(Packs& packs, PackLoads& totals, const Loads& loads, const CostModel& cost, Capacity cap,
                     const LargeVector<int64_t>& order, int64_t world_size);

// Step totals of ViT load, LLM load and cost, for the runs of world_size packs of `order`.
struct StepTotals {
  std::vector<double> load[3];
};
StepTotals step_totals(const LargeVector<int64_t>& order, const PackLoads& totals, int64_t world_size);

// Trend of the load over an epoch whose position k trains step step_order[k]: the largest |corr(k, total)|
// over the loads whose step totals vary by more than 1% (coefficient of variation; packs at a binding
// capacity give every step the same load, and its correlation is then only where the ragged steps fall).
double step_trend(const LargeVector<int64_t>& step_order, const StepTotals& totals);

}  // namespace omnibal
