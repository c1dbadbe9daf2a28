// Step balance, the two passes of the balanced assignment that decide which packs train side by side in one
// step: layered_order (step_order.cpp) makes the packs of a step similar in ViT load, LLM load and cost;
// refine_steps (step_refine.cpp) then exchanges samples between the packs of a step, within the
// capacities, until they carry near-equal loads and cost.
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
#include "index.hpp"
#include "loads.hpp"

namespace omnibal {

// A step is balanced enough once every pack is within this share of the step's mean in every load and in
// cost: its dist ratios and step efficiency are then within 0.001 of perfect, five times inside the tightest
// target of the targets table (benchmarks/bench_balance.py). Below that, more swaps cost planning time for
// no visible gain.
constexpr double kRefineTolerance = 1e-3;

// The packs in an order whose consecutive runs of world_size packs form the steps. The loads that vary across
// packs (ViT, LLM, cost; relative spread between the 5th and 95th percentile above kRefineTolerance) are
// taken in order of decreasing spread: all packs are sorted by the first, blocks of consecutive packs are
// re-sorted by the second, smaller blocks by the third. A step then spans 1/K of each level's block in that
// level's load; the block sizes are chosen from the measured spreads r_1..r_d and the number of steps S so
// that every load gets the same share, (r_1 * ... * r_d / S)^(1/d), of its spread: nothing tuned on a data set.
// Sorts are decreasing, ties by pack id (packs are numbered in random order), so the order is the same on
// every platform.
LargeVector<Index> layered_order(const PackLoads& totals, Index world_size);

// For every step (the packs order[s * world_size : (s + 1) * world_size]), repeatedly takes the pack with the
// largest load relative to the step's mean (ViT, LLM or cost, whichever is largest) and swaps one of its
// samples with one of another pack of the step, choosing the swap that lowers the larger of the two packs'
// relative loads the most, as long as it lowers it below the first pack's, both packs stay within the
// capacities and no load of either ends above the step's largest of its kind (evening out one load must not
// make the step wait longer on another). Loads are taken relative to the mean (cost) or the mean rounded up
// (integer loads: the least largest pack a step can have). A step stops when all its packs are within
// kRefineTolerance of that, when no swap helps, or after a bounded number of swaps. Packs that appear more
// than once in `order` (reused packs of a ragged step) and packs over a capacity (oversize singles) are left
// as they are. Pack sizes never change; every sample stays in exactly one pack. Deterministic: no
// randomness, a fixed scan order.
// Returns the number of swaps made.
int64_t refine_steps(Packs& packs, PackLoads& totals, const Loads& loads, const CostModel& cost, Capacity cap,
                     const LargeVector<Index>& order, Index world_size);

}  // namespace omnibal
