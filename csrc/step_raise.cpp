// raise_stuck_steps (step_balance.hpp): the packs of a step left above its mean take cost from balanced steps,
// up to the step's costliest pack. A step whose costliest pack is pinned (one costly sample, or a pack full in a
// capacity, as long text at its capacity) waits for that pack whatever its other packs hold; the epoch then
// costs the sum of the steps' means plus their excess, and cost moved into such a step's cheaper packs lowers
// its excess, while the balanced steps it came from are balanced again by their refinement. Under a binding
// capacity cost moves by size: several small samples of a raised pack for one costlier sample of a pack in a
// balanced step (under a quadratic cost, one long sample costs more than shorter ones of the same length);
// where the raised pack has room, one sample for one, or one taken outright.
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "step_balance.hpp"
#include "step_pass.hpp"
#include "step_pool.hpp"

namespace omnibal {
namespace {

// A swap gives at most this many of a raised pack's cheapest samples (its costliest stays; none: a move) for one
// sample.
constexpr int64_t kRaiseGive = 6;
// Samples of balanced steps tried per set given in each donor order, from the one of the most LLM load the raised
// pack has room for down, the same by ViT load, and by cost from the most that keeps it within its step's
// costliest pack down (where a capacity binds, the first in cost lack its room; where neither does, the first in
// load cost too much).
constexpr int64_t kRaiseTries = 32;
// Donor orders searched: by LLM load, by ViT load, by cost.
constexpr int kOrders = 3;
// The donors are the samples of this many balanced steps, the cheapest: each of their packs then gives several
// times, so such a step comes down nearly evenly and its refinement afterwards has little left to do. Cost taken
// from every balanced step leaves each uneven, and balancing them again costs about as much as their first
// refinement; fewer steps leave the stuck steps' room less filled.
constexpr Index kRaiseDonorSteps = 4;
// A raised pack stays this share (of its step's costliest pack) below that pack: the costs a caller sums afresh
// in pack order, rounded differently, cannot make it the step's costliest.
constexpr double kRaiseMargin = 1e-9;

class Raiser : public StepPass {
 public:
  Raiser(const Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
         const LargeVector<Index>& order, Index world_size)
      : StepPass(packs, totals, loads, costs, cap, order, world_size) {}

  // Receivers from the step with the most excess over its mean; donors are the samples of the balanced steps'
  // packs. Returns the swaps made; gave[s] is set for every step that gave cost.
  int64_t run(std::vector<char>& gave) {
    const std::vector<Index> stuck = steps_above();
    gave.assign(static_cast<size_t>(num_steps_), 0);
    if (stuck.empty() || static_cast<Index>(stuck.size()) == num_steps_) return 0;
    build_donors();
    int64_t swaps = 0;
    for (const Index s : stuck) {
      for (Index k = s * w_; k < (s + 1) * w_; ++k) swaps += raise_pack(order_[static_cast<size_t>(k)], s, gave);
    }
    return swaps;
  }

 private:
  struct Donor {
    int64_t llm, vit;
    double cost;
    Index id, pack;
  };

  // The donors: every sample of the cheapest balanced steps' packs that may change, in each order.
  void build_donors() {
    Index left = kRaiseDonorSteps;
    for (Index s = num_steps_ - 1; s >= 0 && left > 0; --s) {
      if (above(s)) continue;
      --left;
      for (Index k = s * w_; k < (s + 1) * w_; ++k) {
        const Index p = order_[static_cast<size_t>(k)];
        if (frozen_[static_cast<size_t>(p)]) continue;
        for (Index i = packs_.offsets[static_cast<size_t>(p)]; i < packs_.offsets[static_cast<size_t>(p) + 1]; ++i) {
          const Index x = packs_.samples[static_cast<size_t>(i)];
          donors_.push_back(
              Donor{loads_.llm[static_cast<size_t>(x)], loads_.vit[static_cast<size_t>(x)], sample_cost(x), x, p});
        }
      }
    }
    for (int key = 0; key < kOrders; ++key) {
      Order& o = orders_[key];
      const size_t n = donors_.size();
      o.donor.resize(n);
      for (size_t j = 0; j < n; ++j) o.donor[j] = static_cast<int64_t>(j);
      std::sort(o.donor.begin(), o.donor.end(), [&](int64_t u, int64_t v) {
        const double ku = key_of(key, u), kv = key_of(key, v);
        const Donor &du = donors_[static_cast<size_t>(u)], &dv = donors_[static_cast<size_t>(v)];
        return ku != kv ? ku < kv : du.cost != dv.cost ? du.cost < dv.cost : du.id < dv.id;
      });
      o.place.resize(n);
      o.below.resize(n);
      for (size_t k = 0; k < n; ++k) {
        o.place[static_cast<size_t>(o.donor[k])] = static_cast<int64_t>(k);
        o.below[k] = static_cast<int64_t>(k);
      }
    }
  }

  // Donor j's key in order `key`: its LLM load, its ViT load, its cost.
  double key_of(int key, int64_t j) const {
    const Donor& d = donors_[static_cast<size_t>(j)];
    return key == 0 ? static_cast<double>(d.llm) : key == 1 ? static_cast<double>(d.vit) : d.cost;
  }

  // The last place at or before j of an order whose swapped donors link to the place before them (-1: none),
  // the links walked shortened on the way.
  static int64_t unused_at_or_below(std::vector<int64_t>& below, int64_t j) {
    int64_t root = j;
    while (root >= 0 && below[static_cast<size_t>(root)] != root) root = below[static_cast<size_t>(root)];
    while (j > root) j = std::exchange(below[static_cast<size_t>(j)], root);
    return root;
  }

  // Raises pack b of stuck step s toward the step's costliest pack by swaps, each giving samples of b from the
  // cheapest up (never its costliest), or none; returns the swaps made (each takes a donor for good).
  int64_t raise_pack(Index b, Index s, std::vector<char>& gave) {
    const size_t q = static_cast<size_t>(b);
    if (frozen_[q]) return 0;
    const Index* in = packs_.samples.data() + packs_.offsets[q];
    const size_t n = static_cast<size_t>(packs_.offsets[q + 1] - packs_.offsets[q]);
    auto cheaper = [&](Index u, Index v) {
      return sample_cost(u) != sample_cost(v) ? sample_cost(u) < sample_cost(v) : u < v;
    };
    sorted_.assign(in, in + n);
    std::sort(sorted_.begin(), sorted_.end(), cheaper);
    const size_t last = n > 0 ? n - 1 : 0;  // the costliest stays
    size_t from = 0;
    int64_t swaps = 0;
    received_.clear();
    while (true) {
      const double limit = top_[static_cast<size_t>(s)] * (1.0 - kRaiseMargin);
      if (!(cost(b) < limit)) break;
      const size_t count = std::min(last - from, static_cast<size_t>(kRaiseGive));
      const auto [at, given] = best_swap(b, sorted_.data() + from, count, limit - cost(b));
      if (at < 0) break;
      swap(b, sorted_.data() + from, given, static_cast<size_t>(at));
      gave[static_cast<size_t>(step_of_[static_cast<size_t>(donors_[static_cast<size_t>(at)].pack)])] = 1;
      from += given;
      ++swaps;
    }
    if (swaps > 0) {
      changed_[q] = 1;
      content_[q].assign(sorted_.begin() + static_cast<std::ptrdiff_t>(from), sorted_.end());
      content_[q].insert(content_[q].end(), received_.begin(), received_.end());
    }
    return swaps;
  }

  // The donor (its index in donors_) and the count of give's first samples of the swap that raises pack b the
  // most, by at most `room` in cost, within both capacities of both packs; (-1, 0) when none.
  std::pair<int64_t, size_t> best_swap(Index b, const Index* give, size_t count, double room) {
    int64_t best = -1;
    size_t best_count = 0;
    double best_gain = 0.0, gave_cost = 0.0;
    int64_t gave_vit = 0, gave_llm = 0;
    const size_t q = static_cast<size_t>(b);
    for (size_t c = 0; c <= count; ++c) {
      if (c > 0) {
        const size_t g = static_cast<size_t>(give[c - 1]);
        gave_cost += sample_cost(give[c - 1]), gave_vit += loads_.vit[g], gave_llm += loads_.llm[g];
      }
      // Donor j in place of give[0:c]: kept where it raises b more than the best so far, within `room`.
      auto consider = [&](int64_t j) {
        const Donor& d = donors_[static_cast<size_t>(j)];
        const double gain = d.cost - gave_cost;
        if (!(gain > best_gain) || gain > room) return false;
        const size_t a = static_cast<size_t>(d.pack), x = static_cast<size_t>(d.id);
        if (totals_.vit[q] - gave_vit + loads_.vit[x] > cap_.vit) return false;
        if (totals_.llm[q] - gave_llm + loads_.llm[x] > cap_.llm) return false;
        if (c == 0 && size_of(d.pack) < 2) return false;  // a pack keeps a sample
        if (totals_.vit[a] - loads_.vit[x] + gave_vit > cap_.vit ||
            totals_.llm[a] - loads_.llm[x] + gave_llm > cap_.llm)
          return false;
        best = j, best_count = c, best_gain = gain;
        return true;
      };
      // in each order, the donors of the most LLM load, ViT load or cost that pack b has room for, then less
      const double most[kOrders] = {static_cast<double>(gave_llm + cap_.llm - totals_.llm[q]),
                                    static_cast<double>(gave_vit + cap_.vit - totals_.vit[q]), gave_cost + room};
      for (int key = 0; key < kOrders; ++key) {
        if (key == 1 && cap_.vit <= 0) continue;
        Order& o = orders_[key];
        auto it = std::upper_bound(o.donor.begin(), o.donor.end(), most[key],
                                   [&](double v, int64_t j) { return v < key_of(key, j); });
        int64_t k = unused_at_or_below(o.below, static_cast<int64_t>(it - o.donor.begin()) - 1);
        for (int64_t tries = 0; k >= 0 && tries < kRaiseTries; k = unused_at_or_below(o.below, k - 1), ++tries) {
          if (consider(o.donor[static_cast<size_t>(k)])) break;
        }
      }
    }
    return {best, best_count};
  }

  // give[0:count] leave pack b for the donor's pack, and the donor's sample comes to b (kept in received_; b's
  // samples are stored once its swaps are done).
  void swap(Index b, const Index* give, size_t count, size_t at) {
    const Donor d = donors_[at];
    for (Order& o : orders_) {
      const size_t k = static_cast<size_t>(o.place[at]);
      o.below[k] = static_cast<int64_t>(k) - 1;
    }
    const size_t qb = static_cast<size_t>(b), qa = static_cast<size_t>(d.pack), x = static_cast<size_t>(d.id);
    std::vector<Index>& to_a = samples(d.pack);
    for (size_t c = 0; c < count; ++c) {
      const Index y = give[c];
      const size_t g = static_cast<size_t>(y);
      to_a.push_back(y);
      totals_.vit[qb] -= loads_.vit[g], totals_.vit[qa] += loads_.vit[g];
      totals_.llm[qb] -= loads_.llm[g], totals_.llm[qa] += loads_.llm[g];
      totals_.cost[qb] -= sample_cost(y), totals_.cost[qa] += sample_cost(y);
    }
    to_a.erase(std::find(to_a.begin(), to_a.end(), d.id));
    received_.push_back(d.id);
    totals_.vit[qa] -= loads_.vit[x], totals_.vit[qb] += loads_.vit[x];
    totals_.llm[qa] -= loads_.llm[x], totals_.llm[qb] += loads_.llm[x];
    totals_.cost[qa] -= d.cost, totals_.cost[qb] += d.cost;
  }

  // The donors by LLM load, by ViT load and by cost (ties by cost, then id): their places in donors_, each donor's
  // place in the order, and the links past the swapped ones (unused_at_or_below).
  struct Order {
    std::vector<int64_t> donor, place, below;
  };
  std::array<Order, kOrders> orders_;
  std::vector<Donor> donors_;
  std::vector<Index> sorted_, received_;  // the raised pack's samples by cost, and those it took
};

}  // namespace

int64_t raise_stuck_steps(Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
                          const LargeVector<Index>& order, Index world_size, std::vector<char>& gave) {
  gave.clear();
  if (world_size < 2 || order.empty() || costs.dims != 1) return 0;
  Raiser raiser(packs, totals, loads, costs, cap, order, world_size);
  const int64_t swaps = raiser.run(gave);
  raiser.rebuild(packs);
  return swaps;
}

}  // namespace omnibal
