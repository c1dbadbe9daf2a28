// refine_steps (step_balance.hpp): sample swaps between the packs of one step, choosing each swap with
// arg-min trees over the step's packs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "step_balance.hpp"

namespace omnibal {
namespace {

// At most this many swaps per pack of a step, and this many scans of every pack of the step when the
// lightest ones give no swap (the work per step stays linear in its packs). Fewer leave the LLM dist ratio
// of 512 ranks on patch loads visibly higher, more do not lower it (the targets part of
// benchmarks/bench_balance.py measures it); 8 ranks use a few swaps per step whatever the bound.
constexpr int64_t kSwapsPerPack = 32;
constexpr int kFullScansPerStep = 64;
// Besides the lightest packs, this many packs of the step, in turn, are tried on every swap.
constexpr int64_t kRotatingCandidates = 4;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Index of the smallest key among n, with updates in O(log n); ties go to the lower index.
class ArgMin {
 public:
  void reset(int64_t n) {
    size_ = 1;
    while (size_ < n) size_ <<= 1;
    key_.assign(static_cast<size_t>(size_), kInf);
    node_.assign(static_cast<size_t>(2 * size_), -1);
  }
  void set(int64_t i, double key) {
    key_[static_cast<size_t>(i)] = key;
    int64_t x = i + size_;
    node_[static_cast<size_t>(x)] = key < kInf ? i : -1;
    for (x >>= 1; x >= 1; x >>= 1)
      node_[static_cast<size_t>(x)] = pick(node_[static_cast<size_t>(2 * x)], node_[static_cast<size_t>(2 * x + 1)]);
  }
  int64_t best() const { return node_[1]; }  // -1 when every key is infinite

 private:
  int64_t pick(int64_t a, int64_t b) const {
    if (a < 0) return b;
    if (b < 0) return a;
    return key_[static_cast<size_t>(b)] < key_[static_cast<size_t>(a)] ? b : a;
  }
  int64_t size_ = 1;
  std::vector<double> key_;
  std::vector<int64_t> node_;
};

struct SampleLoad {
  int64_t vit, llm;
  double cost;
};

class StepRefiner {
 public:
  StepRefiner(Packs& packs, PackLoads& totals, const Loads& loads, const CostModel& cost, Capacity cap)
      : packs_(packs), totals_(totals), loads_(loads), cost_(cost), cap_(cap) {}

  // Refines the step made of packs ids[0:w]; frozen[k] marks the ones to leave alone.
  int64_t refine(const int64_t* ids, const std::vector<char>& frozen, int64_t w) {
    ids_ = ids;
    w_ = w;
    double mv = 0.0, mt = 0.0, mc = 0.0;
    for (int64_t k = 0; k < w; ++k) {
      const size_t p = static_cast<size_t>(ids[k]);
      mv += static_cast<double>(totals_.vit[p]);
      mt += static_cast<double>(totals_.llm[p]);
      mc += totals_.cost[p];
    }
    // Loads relative to the least largest pack a step can have: the mean for cost, the mean rounded up for
    // the integer loads (8 packs holding 127 tiles leave one pack with 16, however samples move). A load that
    // is zero in the whole step (text-only data: no ViT load) takes no part.
    const double wd = static_cast<double>(w);
    iv_ = mv > 0.0 ? 1.0 / std::ceil(mv / wd) : 0.0;
    it_ = mt > 0.0 ? 1.0 / std::ceil(mt / wd) : 0.0;
    ic_ = mc > 0.0 ? wd / mc : 0.0;
    frozen_ = &frozen;
    // Most steps of sorted packs are balanced already: check that before building anything.
    double start_worst = 0.0;
    for (int64_t k = 0; k < w; ++k) {
      if (!frozen[static_cast<size_t>(k)]) start_worst = std::max(start_worst, score_of(k));
    }
    if (start_worst <= 1.0 + kRefineTolerance) return 0;
    heaviest_.reset(w);
    lightest_.reset(w);
    least_vit_.reset(w);
    least_llm_.reset(w);
    least_cost_.reset(w);
    most_vit_.reset(w);
    most_llm_.reset(w);
    most_cost_.reset(w);
    for (int64_t k = 0; k < w; ++k) update(k);

    int64_t swaps = 0, cursor = 0;
    int full_scans = 0;
    const int64_t max_swaps = kSwapsPerPack * w;
    while (swaps < max_swaps) {
      const int64_t a = heaviest_.best();
      if (a < 0) break;
      const double worst = score_of(a);
      if (worst <= 1.0 + kRefineTolerance) break;
      gather(a, heavy_);
      Swap best{worst, -1, 0, 0};
      // The lightest pack in the load where the heavy pack is worst comes first, then the other lightest.
      const int64_t firsts[4] = {worst_dim_lightest(a), lightest_.best(), least_llm_.best(), least_vit_.best()};
      tried_.clear();
      for (const int64_t b : firsts) try_pack(a, b, best);
      try_pack(a, least_cost_.best(), best);
      for (int64_t r = 0; r < std::min(kRotatingCandidates, w); ++r) try_pack(a, (cursor++) % w, best);
      if (best.other < 0 && full_scans < kFullScansPerStep) {
        ++full_scans;
        for (int64_t b = 0; b < w; ++b) try_pack(a, b, best);
      }
      if (best.other < 0) break;
      apply(a, best);
      ++swaps;
    }
    return swaps;
  }

 private:
  struct Swap {
    double score;          // the larger relative load of the two packs after the swap
    int64_t other;         // step position of the other pack, -1 for none
    int64_t pos_a, pos_b;  // positions in packs_.samples
  };

  double score(double v, double t, double c) const { return std::max(std::max(v * iv_, t * it_), c * ic_); }
  double score_of(int64_t k) const {
    const size_t p = static_cast<size_t>(ids_[k]);
    return score(static_cast<double>(totals_.vit[p]), static_cast<double>(totals_.llm[p]), totals_.cost[p]);
  }

  void update(int64_t k) {
    const size_t p = static_cast<size_t>(ids_[k]);
    // every pack, frozen ones too, counts for the step's largest load of each kind
    most_vit_.set(k, -static_cast<double>(totals_.vit[p]));
    most_llm_.set(k, -static_cast<double>(totals_.llm[p]));
    most_cost_.set(k, -totals_.cost[p]);
    if ((*frozen_)[static_cast<size_t>(k)]) return;  // keys stay infinite: never picked
    const double s = score_of(k);
    heaviest_.set(k, -s);
    lightest_.set(k, s);
    least_vit_.set(k, static_cast<double>(totals_.vit[p]) * iv_);
    least_llm_.set(k, static_cast<double>(totals_.llm[p]) * it_);
    least_cost_.set(k, totals_.cost[p] * ic_);
  }

  int64_t worst_dim_lightest(int64_t a) const {
    const size_t p = static_cast<size_t>(ids_[a]);
    const double v = static_cast<double>(totals_.vit[p]) * iv_, t = static_cast<double>(totals_.llm[p]) * it_,
                 c = totals_.cost[p] * ic_;
    if (v >= t && v >= c) return least_vit_.best();
    if (t >= c) return least_llm_.best();
    return least_cost_.best();
  }

  void gather(int64_t k, std::vector<SampleLoad>& out) const {
    const size_t p = static_cast<size_t>(ids_[k]);
    out.clear();
    for (int64_t i = packs_.offsets[p]; i < packs_.offsets[p + 1]; ++i) {
      const int64_t id = packs_.samples[static_cast<size_t>(i)];
      out.push_back(SampleLoad{loads_.vit[id], loads_.llm[id], cost_.sample_cost(loads_.vit[id], loads_.llm[id])});
    }
  }

  void try_pack(int64_t a, int64_t b, Swap& best) {
    if (b < 0 || b == a || (*frozen_)[static_cast<size_t>(b)]) return;
    if (std::find(tried_.begin(), tried_.end(), b) != tried_.end()) return;
    tried_.push_back(b);
    const size_t pa = static_cast<size_t>(ids_[a]), pb = static_cast<size_t>(ids_[b]);
    gather(b, light_);
    const int64_t av = totals_.vit[pa], at = totals_.llm[pa], bv = totals_.vit[pb], bt = totals_.llm[pb];
    // No load may end above the step's largest of its kind: evening out one load must not make the step
    // wait longer on another (the capacities bound them too).
    const size_t mv = static_cast<size_t>(ids_[most_vit_.best()]), mt = static_cast<size_t>(ids_[most_llm_.best()]),
                 mc = static_cast<size_t>(ids_[most_cost_.best()]);
    const int64_t vit_limit = std::min(cap_.vit, totals_.vit[mv]), llm_limit = std::min(cap_.llm, totals_.llm[mt]);
    const double cost_limit = totals_.cost[mc];
    const double ac = totals_.cost[pa], bc = totals_.cost[pb];
    for (size_t i = 0; i < heavy_.size(); ++i) {
      const SampleLoad& x = heavy_[i];
      for (size_t j = 0; j < light_.size(); ++j) {
        const SampleLoad& y = light_[j];
        const int64_t dv = y.vit - x.vit, dt = y.llm - x.llm;
        if (av + dv > vit_limit || at + dt > llm_limit || bv - dv > vit_limit || bt - dt > llm_limit) continue;
        const double dc = y.cost - x.cost;
        if (ac + dc > cost_limit || bc - dc > cost_limit) continue;
        const double s = std::max(score(static_cast<double>(av + dv), static_cast<double>(at + dt), ac + dc),
                                  score(static_cast<double>(bv - dv), static_cast<double>(bt - dt), bc - dc));
        if (s < best.score) {
          best = Swap{s, b, packs_.offsets[pa] + static_cast<int64_t>(i), packs_.offsets[pb] + static_cast<int64_t>(j)};
        }
      }
    }
  }

  void apply(int64_t a, const Swap& s) {
    const size_t pa = static_cast<size_t>(ids_[a]), pb = static_cast<size_t>(ids_[s.other]);
    int64_t& x = packs_.samples[static_cast<size_t>(s.pos_a)];
    int64_t& y = packs_.samples[static_cast<size_t>(s.pos_b)];
    const int64_t dv = loads_.vit[y] - loads_.vit[x], dt = loads_.llm[y] - loads_.llm[x];
    const double dc = cost_.sample_cost(loads_.vit[y], loads_.llm[y]) - cost_.sample_cost(loads_.vit[x], loads_.llm[x]);
    totals_.vit[pa] += dv;
    totals_.llm[pa] += dt;
    totals_.cost[pa] += dc;
    totals_.vit[pb] -= dv;
    totals_.llm[pb] -= dt;
    totals_.cost[pb] -= dc;
    std::swap(x, y);
    update(a);
    update(s.other);
  }

  Packs& packs_;
  PackLoads& totals_;
  const Loads& loads_;
  const CostModel& cost_;
  Capacity cap_;
  const int64_t* ids_ = nullptr;
  int64_t w_ = 0;
  const std::vector<char>* frozen_ = nullptr;
  double iv_ = 0.0, it_ = 0.0, ic_ = 0.0;
  ArgMin heaviest_, lightest_, least_vit_, least_llm_, least_cost_, most_vit_, most_llm_, most_cost_;
  std::vector<SampleLoad> heavy_, light_;
  std::vector<int64_t> tried_;
};

}  // namespace

int64_t refine_steps(Packs& packs, PackLoads& totals, const Loads& loads, const CostModel& cost, Capacity cap,
                     const LargeVector<Index>& order, Index world_size) {
  if (world_size < 2 || order.empty()) return 0;
  // Packs used more than once (reused to fill a ragged step) must keep their samples: any change would
  // show in every slot they fill.
  std::vector<Index> uses(static_cast<size_t>(packs.size()), 0);
  for (const int64_t p : order) ++uses[static_cast<size_t>(p)];
  StepRefiner refiner(packs, totals, loads, cost, cap);
  std::vector<char> frozen(static_cast<size_t>(world_size));
  int64_t swaps = 0;
  const int64_t num_steps = static_cast<int64_t>(order.size()) / world_size;
  for (int64_t s = 0; s < num_steps; ++s) {
    const int64_t* ids = order.data() + s * world_size;
    for (int64_t k = 0; k < world_size; ++k) {
      const size_t p = static_cast<size_t>(ids[k]);
      frozen[static_cast<size_t>(k)] = uses[p] != 1 || totals.vit[p] > cap.vit || totals.llm[p] > cap.llm;
    }
    swaps += refiner.refine(ids, frozen, world_size);
  }
  return swaps;
}

}  // namespace omnibal
