// Step balance, the passes of the balanced assignment that decide which packs train side by side in one step:
// split_to_whole_steps, cost_order and lift_stuck_packs (step_order.cpp) make the steps, refine_steps
// (step_refine.cpp, on the pools of step_pool.hpp) then exchanges samples between the packs of a step, and
// with its neighbouring steps, within the capacities, so that its costliest pack costs little more than the
// step's mean; settle_steps trades packs between steps after that.
//
// A data-parallel step waits for its slowest rank: the epoch costs the sum over steps of the step's costliest
// pack, at least the total cost over world_size. Cutting packs sorted by cost into runs of world_size puts
// packs of similar cost side by side; the exchanges then lower what is left of each step's costliest pack.
#pragma once

#include <cstdint>
#include <vector>

#include "buffers.hpp"
#include "grouping.hpp"
#include "index.hpp"
#include "loads.hpp"

namespace omnibal {

// A step is balanced enough once its costliest pack is within this share of the step's mean cost: the
// step then takes at most 0.1% longer than its ideal, five times inside the target on the epoch cost at 64
// ranks and more (0.5% over the epoch bound), half the one at 8 ranks (0.2%). Below that, more exchanges cost
// planning time for no visible gain.
constexpr double kRefineTolerance = 1e-3;

// Every pack's cost parts: the costs of its samples, summed in pack order, plus costs.per_pack in the last;
// `costliest`, where given, receives each pack's costliest sample (SampleCosts::total, at least 0), read in the
// same pass over the samples.
void fill_pack_costs(const Packs& packs, const SampleCosts& costs, PackLoads& totals,
                     LargeVector<double>* costliest = nullptr);
// The same for pack p alone (totals.cost already sized for it; `costliest`, where given, is set to its costliest
// sample).
void fill_pack_cost(const Packs& packs, const SampleCosts& costs, Index p, PackLoads& totals,
                    double* costliest = nullptr);

// Raises the number of packs to a multiple of world_size, so that no slot repeats a pack and none is dropped:
// the packs of two or more samples whose smaller half can cost the most (at most half the pack, at most the pack
// less its costliest sample; ties by pack id) are each split in two halves of near-equal cost (samples by decreasing
// cost, ties by sample id, each to the half with the lower cost so far, on a tie the one with fewer samples). Does
// nothing when there are fewer such packs than needed (make_whole_steps then repeats or drops packs). New packs are
// appended after the others; `totals` and `costliest` (each pack's costliest sample, fill_pack_costs) are kept in
// step. Returns the number of packs split.
Index split_to_whole_steps(Packs& packs, PackLoads& totals, LargeVector<double>& costliest, const Loads& loads,
                           const SampleCosts& costs, Index world_size);

// Pack ids by decreasing cost, ties by id (the same order on every platform). With two cost parts: by the
// part of wider spread, blocks of steps re-sorted by the other, the block size chosen from the two spreads
// so that a step spans as small a share of each (step_order.cpp).
LargeVector<Index> cost_order(const PackLoads& totals, Index world_size);

// The epoch cost of `order` cut into steps of world_size packs: the sum over steps of the costliest pack.
double epoch_of(const LargeVector<Index>& order, const PackLoads& totals, Index world_size);

// The ideal epoch cost of `order`: its packs' total cost over world_size, which no step layout of them beats.
double ideal_of(const LargeVector<Index>& order, const PackLoads& totals, Index world_size);

// Moves the packs that would stick out of their step up one step: a pack whose costliest sample (its floor,
// which exchanges of its other samples cannot take out) costs more than its step's mean within kRefineTolerance
// trades places with the cheapest pack of the step above that does not stick out of this one. Such a pack costs
// no more than any pack of the step above, so there it stays below that step's mean. Steps are taken from the
// costliest down; packs that appear more than once in `order` stay where they are. One cost part only (two:
// nothing moves). `costliest` holds each pack's costliest sample (fill_pack_costs). Returns the number of packs moved.
Index lift_stuck_packs(LargeVector<Index>& order, const PackLoads& totals, const LargeVector<double>& costliest,
                       const SampleCosts& costs, Index world_size);

// After the exchanges: each step left above its mean (the steps with the most excess first) lowers its costliest
// packs by moving samples (never a pack's costliest, never its last) to packs with room in other steps, each
// receiver kept within its own step's costliest pack, so no step rises; the moves of a step are kept only where its
// costliest pack comes down. Where a capacity binds every pack of a step, exchanges inside it cannot move cost, but
// packs made by splits have room. At most one move per sample of a step, each trying a bounded number of samples
// and receivers (O(log packs) each). One cost part only (two: nothing moves). Packs that appear more than once in
// `order` or are over a capacity stay as they are. `packs` is rebuilt and the changed packs' costs summed afresh.
// Returns the samples moved.
int64_t spill_to_room(Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
                      const LargeVector<Index>& order, Index world_size);

// After the exchanges: walking down from the costliest step, a step's costliest packs trade places with the
// cheapest packs of the step above while they cost more than those and no more than that step's costliest
// pack (each trade lowers or keeps both steps' costliest packs); then, where the same packs sorted by cost and
// cut into steps cost less over the epoch, `order` becomes that. Packs that appear more than once in `order`
// stay where they are. One cost part only (two: nothing changes). Returns the number of trades.
Index settle_steps(LargeVector<Index>& order, const PackLoads& totals, Index world_size);

// For every step (the packs order[s * world_size : (s + 1) * world_size]), repeatedly lowers the cost of the
// step's costliest pack by exchanging samples with a lighter pack of the step: a move of one sample or a
// one-for-one swap, moving a cost as close as can be found to what brings the heavy pack down to the step's
// mean without raising the light one above it (both packs stay within both capacities; every sample stays in
// exactly one pack). Candidates come from binary searches in each pack's samples sorted by cost, a bounded
// number per exchange (a search that finds none is repeated once with a fixed multiple of them), so an exchange's
// work does not grow with the square of a pack's size. A step stops when its costliest pack is within
// kRefineTolerance of the mean, when no exchange lowers it, or when it has spent work_per_sample units of work per
// sample of the step (0: no exchange). A step left above its mean then also exchanges with the packs of the steps
// before and after it, and the step before gives cost to its packs up to its costliest one; after every step, a
// step still above its mean exchanges with the packs of the step left with the most room below its own costliest
// pack (another step above its mean, one whose costliest pack no exchange lowered), each kept within that pack
// (one cost part only). Packs that appear more than once in `order` (reused packs of a ragged step) and packs over a
// capacity (oversize singles) are left as they are. Pack sizes may change; `packs` is rebuilt when anything moved.
// Deterministic: no randomness, a fixed scan order. `only` (null: every step) names the steps refined, only[s]
// nonzero for step s. Returns the number of exchanges made.
int64_t refine_steps(Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
                     const LargeVector<Index>& order, Index world_size, int64_t work_per_sample,
                     const std::vector<char>* only = nullptr);

// After the exchanges: the packs of each step left above its mean (the steps with the most excess first) are
// raised toward the step's costliest pack, which they never pass, by swaps with the packs of the cheapest balanced
// steps (those within kRefineTolerance of their mean): none, one or more of the raised pack's cheapest samples
// (never its costliest) for one costlier sample (a giving pack keeps a sample), the swap that raises it most among
// those tried, both packs within both capacities; partners are found by binary search in the donors sorted by
// LLM load, by ViT load and by cost, a bounded number tried from the most that fits down. The giving packs only
// come down; a step whose costliest pack is pinned by its samples then waits no longer, and the steps that gave
// (gave[s] set) are refined again to bring their costliest packs down to their lower mean. Each swap takes its
// donor sample for good, so the swaps number fewer than the donors. One cost part only (two: nothing moves).
// Packs that appear more than once in `order` or are over a capacity stay as they are. `packs` is rebuilt and
// the changed packs' costs summed afresh. Returns the swaps made.
int64_t raise_stuck_steps(Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
                          const LargeVector<Index>& order, Index world_size, std::vector<char>& gave);

}  // namespace omnibal
