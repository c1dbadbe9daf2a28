// spill_to_room (step_balance.hpp): the costliest packs of a step left above its mean give samples to packs with
// room in other steps, each kept within its own step's costliest pack. Where every pack of a step is full in a
// capacity (long text at its capacity: a pack costs the capacity's linear term and the squares of its samples),
// no exchange inside the step moves cost, yet the packs made whole by splits (split_to_whole_steps) have room:
// a sample moved there leaves the heavy pack lighter and raises no step.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "step_balance.hpp"
#include "step_pass.hpp"
#include "step_pool.hpp"

namespace omnibal {
namespace {

// Samples of the heavy pack tried per move (those whose cost is nearest to what brings it down to the next
// pack of its step), and receivers tried per sample (those with the most room below their step's costliest
// pack; the first may lack the loads' room).
constexpr int64_t kSpillSamples = 8;
constexpr int64_t kSpillReceivers = 8;

class Spiller : public StepPass {
 public:
  Spiller(const Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
          const LargeVector<Index>& order, Index world_size)
      : StepPass(packs, totals, loads, costs, cap, order, world_size) {
    double total = 0.0;
    for (const double m : mean_) total += m;
    inv_cost_ = total > 0.0 ? static_cast<double>(num_steps_) / total : 0.0;
    const size_t n = static_cast<size_t>(packs.size());
    std::vector<double> keys(n);
    for (Index p = 0; p < static_cast<Index>(n); ++p) keys[static_cast<size_t>(p)] = receiver_key(p);
    receivers_.build(keys);
  }

  // Steps from the one with the most excess over its mean; returns the samples moved.
  int64_t run() {
    int64_t moved = 0;
    for (const Index s : steps_above()) moved += lower_step(s);
    return moved;
  }

 private:
  struct Move {
    Index sample, from, to, position;
    double cost_from, cost_to;
    bool from_changed, to_changed;
  };

  // A receiver's key: the least of the cost it can take before it raises its step's costliest pack and its room
  // in each capacity, each relative to a whole pack's (most first): a pack nearly full in a capacity takes
  // little, however far below its step's costliest pack it is.
  double receiver_key(Index p) const {
    const size_t q = static_cast<size_t>(p);
    double slack = 0.0;
    if (!frozen_[q] && step_of_[q] >= 0) {
      slack = (top_[static_cast<size_t>(step_of_[q])] - cost(p)) * inv_cost_;
      slack = std::min(slack, static_cast<double>(cap_.llm - totals_.llm[q]) / static_cast<double>(cap_.llm));
      if (cap_.vit > 0) {
        slack = std::min(slack, static_cast<double>(cap_.vit - totals_.vit[q]) / static_cast<double>(cap_.vit));
      }
    }
    return slack > 0.0 ? -slack : kInf;
  }
  void update_receiver(Index p) { receivers_.set(p, receiver_key(p)); }

  // x leaves pack `from` for pack `to`; logged with what undo needs to restore both packs exactly.
  void move(Index x, Index from, Index to) {
    const size_t f = static_cast<size_t>(from), t = static_cast<size_t>(to), i = static_cast<size_t>(x);
    Move m{x, from, to, 0, totals_.cost[f], totals_.cost[t], changed_[f] != 0, changed_[t] != 0};
    std::vector<Index>& src = samples(from);
    const auto at = std::find(src.begin(), src.end(), x);
    m.position = static_cast<Index>(at - src.begin());
    src.erase(at);
    samples(to).push_back(x);
    totals_.vit[f] -= loads_.vit[i], totals_.vit[t] += loads_.vit[i];
    totals_.llm[f] -= loads_.llm[i], totals_.llm[t] += loads_.llm[i];
    totals_.cost[f] -= sample_cost(x), totals_.cost[t] += sample_cost(x);
    log_.push_back(m);
  }

  // Takes back the moves logged, latest first: samples, orders, totals and costs as they were.
  void undo() {
    for (auto m = log_.rbegin(); m != log_.rend(); ++m) {
      const size_t f = static_cast<size_t>(m->from), t = static_cast<size_t>(m->to), i = static_cast<size_t>(m->sample);
      content_[t].pop_back();
      content_[f].insert(content_[f].begin() + m->position, m->sample);
      totals_.vit[f] += loads_.vit[i], totals_.vit[t] -= loads_.vit[i];
      totals_.llm[f] += loads_.llm[i], totals_.llm[t] -= loads_.llm[i];
      totals_.cost[f] = m->cost_from, totals_.cost[t] = m->cost_to;
      if (!m->from_changed) changed_[f] = 0, content_[f].clear();
      if (!m->to_changed) changed_[t] = 0, content_[t].clear();
    }
    for (const Move& m : log_) update_receiver(m.to);
    log_.clear();
  }

  // A receiver outside step s for sample x: room for its loads, and its cost with x's within its step's
  // costliest pack. -1: none among the kSpillReceivers with the most room below their step's costliest pack.
  Index receiver_for(Index x) {
    const size_t i = static_cast<size_t>(x);
    Index found = -1;
    std::vector<std::pair<Index, double>> masked;
    for (int64_t k = 0; k < kSpillReceivers && found < 0; ++k) {
      const Index r = receivers_.best();
      if (r < 0) break;
      const size_t q = static_cast<size_t>(r);
      if (totals_.vit[q] + loads_.vit[i] <= cap_.vit && totals_.llm[q] + loads_.llm[i] <= cap_.llm &&
          cost(r) + sample_cost(x) <= top_[static_cast<size_t>(step_of_[q])]) {
        found = r;
      } else {
        masked.emplace_back(r, 0.0);
        receivers_.set(r, kInf);
      }
    }
    for (const auto& m : masked) update_receiver(m.first);
    return found;
  }

  // Samples of heavy pack a but its costliest (a pack keeps at least one sample), the kSpillSamples whose cost
  // is nearest to `want` first (ties by id).
  void candidates(Index a, double want, std::vector<Index>& out) {
    const Index* in = first(a);
    const Index n = size_of(a);
    out.clear();
    if (n < 2) return;
    Index floor = in[0];
    for (Index k = 0; k < n; ++k) {
      const Index i = in[k];
      if (sample_cost(i) > sample_cost(floor) || (sample_cost(i) == sample_cost(floor) && i < floor)) floor = i;
    }
    for (Index k = 0; k < n; ++k) {
      if (in[k] != floor && sample_cost(in[k]) > 0.0) out.push_back(in[k]);
    }
    auto nearer = [&](Index u, Index v) {
      const double du = std::fabs(sample_cost(u) - want), dv = std::fabs(sample_cost(v) - want);
      return du != dv ? du < dv : u < v;
    };
    const size_t keep = std::min(out.size(), static_cast<size_t>(kSpillSamples));
    std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(keep), out.end(), nearer);
    out.resize(keep);
  }

  // Lowers step s's costliest pack by moves out of its heaviest packs; kept only where the step's costliest
  // pack comes down. Returns the samples moved.
  int64_t lower_step(Index s) {
    const Index* ids = order_.data() + s * w_;
    const double floor = (1.0 + kRefineTolerance) * mean_[static_cast<size_t>(s)];
    double fixed = 0.0;  // the costliest pack that cannot change
    int64_t samples_in_step = 0;
    heavy_.reset(w_);
    for (Index k = 0; k < w_; ++k) {
      receivers_.set(ids[k], kInf);  // no move inside the step
      samples_in_step += size_of(ids[k]);
      if (frozen_[static_cast<size_t>(ids[k])]) fixed = std::max(fixed, cost(ids[k]));
      else heavy_.set(k, -cost(ids[k]));
    }
    log_.clear();
    std::vector<Index> tried;
    while (static_cast<int64_t>(log_.size()) < samples_in_step) {
      const int64_t k = heavy_.best();
      if (k < 0) break;
      const Index a = ids[k];
      if (!(cost(a) > std::max(floor, fixed))) break;
      heavy_.set(k, kInf);
      const int64_t next = heavy_.best();
      heavy_.set(k, -cost(a));
      const double target = std::max({floor, fixed, next >= 0 ? cost(ids[next]) : 0.0});
      candidates(a, cost(a) - target, tried);
      Index x = -1, r = -1;
      for (const Index i : tried) {
        r = receiver_for(i);
        if (r >= 0) {
          x = i;
          break;
        }
      }
      if (x < 0) break;
      move(x, a, r);
      heavy_.set(k, -cost(a));
      update_receiver(r);
    }
    double top = fixed;
    for (Index k = 0; k < w_; ++k) top = std::max(top, cost(ids[k]));
    if (top < top_[static_cast<size_t>(s)]) {
      top_[static_cast<size_t>(s)] = top;
    } else {
      undo();
    }
    double sum = 0.0;
    for (Index k = 0; k < w_; ++k) sum += cost(ids[k]);
    mean_[static_cast<size_t>(s)] = sum / static_cast<double>(w_);
    for (Index k = 0; k < w_; ++k) update_receiver(ids[k]);
    return static_cast<int64_t>(log_.size());
  }

  double inv_cost_ = 0.0;  // 1 / the mean cost of a pack
  ArgMin receivers_, heavy_;
  std::vector<Move> log_;
};

}  // namespace

int64_t spill_to_room(Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
                      const LargeVector<Index>& order, Index world_size) {
  if (world_size < 2 || order.empty() || costs.dims != 1) return 0;
  Spiller spiller(packs, totals, loads, costs, cap, order, world_size);
  const int64_t moved = spiller.run();
  spiller.rebuild(packs);
  return moved;
}

}  // namespace omnibal
