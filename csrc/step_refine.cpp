// refine_steps (step_balance.hpp): sample exchanges that lower each step's costliest pack. The heavy pack's
// partners: the step's lightest pack and a few others in turn (moves and swaps, found by binary search in each
// pack's samples sorted by cost), and any pack of the pool (swaps found in all the pool's samples sorted by cost,
// and by ViT load then cost). The pool is the step's own packs; a step left above its mean then also draws on
// the packs of the steps before and after it, each kept below its own ceiling, and the step before it gives
// cost to its packs up to its costliest one; once every step is refined, a step still above its mean trades
// with the packs of the step with the most room below its own costliest pack.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "step_balance.hpp"
#include "step_pool.hpp"

namespace omnibal {
namespace {

// Samples tried on each side of a binary search's position in one pack (the nearest costs may not fit).
constexpr int64_t kNeighbours = 4;
// Samples of the heavy pack tried as the one given in a swap: all of them up to this many, else this many
// evenly spaced in cost order (in large packs a move of one sample nearly always moves the cost wanted).
constexpr int64_t kSwapScan = 64;
// Besides the step's lightest pack, this many packs of the step, in turn, are tried on every exchange.
constexpr int64_t kRotatingCandidates = 4;
// Samples tried on each side of the cost wanted in the whole pool, and in each group of one ViT load: many
// packs hold samples of near cost, and only some of those packs are light enough or have the room.
constexpr int64_t kPoolNeighbours = 32;
// Groups of one ViT load tried on each side of the given sample's (where the ViT capacity binds, only samples of
// nearly the same ViT load can trade places).
constexpr int64_t kVitGroups = 8;
// Samples tried on each side of the cost wanted within one group of one ViT load (few share a load exactly).
constexpr int64_t kGroupNeighbours = 4;
// Set exchanges (one sample for two): the heavy pack's costliest samples given, the partner's samples tried as
// the first of the two (all up to this many, else evenly spaced), and the neighbours of the second's cost tried.
constexpr int64_t kSetGivers = 8;
constexpr int64_t kSetScan = 16;
constexpr int64_t kSetNeighbours = 2;
// An exchange search that finds nothing is tried again with this many times the partners, samples scanned and
// neighbours in cost and ViT load above (not the set exchanges', whose work grows fastest): a heavy pack full in a
// capacity trades only with the few samples of nearly its load, which a wider search reaches
// (the suite's time targets, omnibal_kernels.bench.time_targets, measure the epoch cost it gains).
constexpr int64_t kWideReach = 8;
// A step still above its mean once every step is refined trades with the packs of this many other such steps,
// those with the most room below their costliest pack.
constexpr int64_t kFarSteps = 1;

// Samples that move one way in an exchange: none, one or two.
struct Moving {
  Entry e[2]{};
  int n = 0;

  Moving() = default;
  explicit Moving(const Entry& a) : n(1) { e[0] = a; }
  Moving(const Entry& a, const Entry& b) : n(2) { e[0] = a, e[1] = b; }
  double cost(int d) const { return (n > 0 ? e[0].cost[d] : 0.0) + (n > 1 ? e[1].cost[d] : 0.0); }
  int64_t vit() const { return (n > 0 ? e[0].vit : 0) + (n > 1 ? e[1].vit : 0); }
  int64_t llm() const { return (n > 0 ? e[0].llm : 0) + (n > 1 ? e[1].llm : 0); }
};

// The exchange chosen for the heavy pack: `x` leaves it for pack `other`, `y` comes back.
struct Exchange {
  double top = kInf;    // the larger score of the two packs after it, at least 1 (the step's mean)
  double error = kInf;  // |cost moved - cost wanted|, in the heavy pack's worst part
  int64_t other = -1;
  Moving x, y;

  // Lower the larger of the two packs' scores, down to the step's mean (below it both are as good as can be);
  // then move a cost nearer the one wanted.
  bool better_than(const Exchange& e) const { return top != e.top ? top < e.top : error < e.error; }
};

// How a refinement ended.
enum class Ending { kNothingToDo, kBalanced, kStuck, kWorkSpent };

class StepRefiner {
 public:
  StepRefiner(PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap)
      : totals_(totals), pool_(totals, loads, costs, cap), cap_(cap), dims_(costs.dims) {}

  // Refines the step made of the first `w` packs of `ids`. The others come from neighbouring steps (one cost
  // part only) and take cost up to ceiling[k - w] each: the next `before` from the step before, whose
  // costliest pack they stay below (cost moves there even once this step is balanced: every unit this step
  // gives lowers it), the rest from the step after (only while this step is above its mean). frozen[k] marks
  // packs to leave alone. Spends at most `budget` units of work; returns the number of exchanges. The pool's
  // packs' samples are then in content(k).
  int64_t refine(const std::vector<Index>& ids, int64_t w, int64_t before, const std::vector<char>& frozen,
                 const std::vector<double>& ceiling, int64_t budget, const PackContents& contents) {
    w_ = w;
    before_end_ = w + before;
    ceiling_ = &ceiling;
    ending_ = Ending::kNothingToDo;
    for (int d = 0; d < dims_; ++d) {
      double sum = 0.0;
      for (int64_t k = 0; k < w; ++k) sum += totals_.cost[static_cast<size_t>(ids[static_cast<size_t>(k)] * dims_ + d)];
      sum_[d] = sum;
    }
    set_mean();
    frozen_top_.fill(0.0);
    double top = 0.0;
    for (int64_t k = 0; k < w; ++k) {
      const Index p = ids[static_cast<size_t>(k)];
      if (!frozen[static_cast<size_t>(k)]) {
        top = std::max(top, raw_score(p));
        continue;
      }
      for (int d = 0; d < dims_; ++d) {
        frozen_top_[d] = std::max(frozen_top_[d], totals_.cost[static_cast<size_t>(p * dims_ + d)]);
      }
    }
    if ((top <= floor() && before == 0) || budget <= 0) return 0;
    pool_.load(ids, frozen, contents);
    heaviest_.reset(w);
    lightest_.reset(w);
    sink_.reset(before);
    spill_.reset(static_cast<int64_t>(ids.size()) - before_end_);
    for (int64_t k = 0; k < static_cast<int64_t>(ids.size()); ++k) {
      if (!frozen[static_cast<size_t>(k)]) update(k);
    }
    work_ = 0;
    int64_t exchanges = 0, cursor = 0;
    while (true) {
      if (work_ >= budget) {
        ending_ = Ending::kWorkSpent;
        break;
      }
      const int64_t a = heaviest_.best();
      above_ = a >= 0 && score(a) > floor();
      if (a < 0 || (!above_ && sink_.best() < 0)) {
        ending_ = Ending::kBalanced;
        break;
      }
      Exchange best;
      search(a, cursor, best);
      // A wider search costs more work per exchange: only where the usual one finds nothing.
      if (best.other < 0) {
        reach_ = kWideReach;
        search(a, cursor, best);
        reach_ = 1;
      }
      if (best.other < 0) {
        ending_ = above_ ? Ending::kStuck : Ending::kBalanced;
        break;
      }
      apply(a, best);
      ++exchanges;
    }
    return exchanges;
  }

  // Exchanges for heavy pack a with its partners and the pool, the set exchanges where none other is found.
  void search(int64_t a, int64_t& cursor, Exchange& best) {
    tried_.clear();
    if (above_) {
      try_pair(a, lightest_.best(), best);
      for (int64_t r = 0; r < std::min(wide(kRotatingCandidates), w_); ++r) try_pair(a, (cursor++) % w_, best);
      if (spill_.best() >= 0) try_pair(a, before_end_ + spill_.best(), best);
    }
    if (sink_.best() >= 0) try_pair(a, w_ + sink_.best(), best);
    try_pool(a, best);
    // Set exchanges cost more to search: only where no single sample or pair of samples trades places.
    if (best.other < 0) try_sets(a, best);
  }

  // Whether the last refinement stopped with its costliest pack above the mean, no exchange lowering it.
  bool stuck() const { return ending_ == Ending::kStuck; }
  const std::vector<Entry>& content(int64_t k) const { return pool_.content(k, 0); }

 private:
  int64_t wide(int64_t k) const { return k * reach_; }
  double part(int64_t k, int d) const { return totals_.cost[static_cast<size_t>(pool_.id(k) * dims_ + d)]; }
  double score(int64_t k) const {
    double s = 0.0;
    for (int d = 0; d < dims_; ++d) s = std::max(s, part(k, d) * inv_[d]);
    return s;
  }
  double raw_score(Index p) const {
    double s = 0.0;
    for (int d = 0; d < dims_; ++d) s = std::max(s, totals_.cost[static_cast<size_t>(p * dims_ + d)] * inv_[d]);
    return s;
  }
  // Nothing to gain below 1 within tolerance, or below a pack that cannot change.
  double floor() const {
    double f = 1.0 + kRefineTolerance;
    for (int d = 0; d < dims_; ++d) f = std::max(f, frozen_top_[d] * inv_[d]);
    return f;
  }
  int worst_part(int64_t k) const {
    int worst = 0;
    for (int d = 1; d < dims_; ++d) {
      if (part(k, d) * inv_[d] > part(k, worst) * inv_[worst]) worst = d;
    }
    return worst;
  }
  bool own(int64_t k) const { return k < w_; }
  bool sink(int64_t k) const { return k >= w_ && k < before_end_; }
  double ceiling(int64_t k) const { return (*ceiling_)[static_cast<size_t>(k - w_)]; }
  void set_mean() {
    for (int d = 0; d < dims_; ++d) {
      mean_[d] = sum_[d] / static_cast<double>(w_);
      inv_[d] = mean_[d] > 0.0 ? 1.0 / mean_[d] : 0.0;
    }
  }

  // Tree keys: with one cost part the cost itself, which a change of the step's mean leaves in order; a
  // neighbouring step's pack by the cost it can still take (none: out of the tree).
  void update(int64_t k) {
    if (!own(k)) {
      const double room = ceiling(k) - part(k, 0);
      (sink(k) ? sink_ : spill_).set(sink(k) ? k - w_ : k - before_end_, room > 0.0 ? -room : kInf);
      return;
    }
    const double key = dims_ == 1 ? part(k, 0) : score(k);
    heaviest_.set(k, -key);
    lightest_.set(k, key);
  }

  // Scores `x` leaving heavy pack a for pack b and `y` coming back, in a's worst part d, against a's score now
  // and `want`, the cost a should give; kept in `best` when better and within both packs' capacities. A pack of a
  // neighbouring step must stay within its ceiling, and then counts as at the mean; while the step is balanced,
  // cost only sinks into the step before.
  void consider(int64_t a, int64_t b, int d, double want, const Moving& x, const Moving& y, Exchange& best) const {
    const double moved = x.cost(d) - y.cost(d);
    if (!(moved > 0.0) || (!above_ && !sink(b))) return;
    const size_t pa = static_cast<size_t>(pool_.id(a)), pb = static_cast<size_t>(pool_.id(b));
    const int64_t dv = y.vit() - x.vit(), dt = y.llm() - x.llm();
    if (dv > cap_.vit - totals_.vit[pa] || -dv > cap_.vit - totals_.vit[pb] || dt > cap_.llm - totals_.llm[pa] ||
        -dt > cap_.llm - totals_.llm[pb])
      return;
    double sa = 0.0, sb = 0.0;
    if (own(b)) {
      for (int q = 0; q < dims_; ++q) {
        const double delta = x.cost(q) - y.cost(q);
        sa = std::max(sa, (part(a, q) - delta) * inv_[q]);
        sb = std::max(sb, (part(b, q) + delta) * inv_[q]);
      }
    } else {
      if (part(b, 0) + moved > ceiling(b)) return;
      sa = (part(a, 0) - moved) * inv_[0];
    }
    if (!(std::max(sa, sb) < score(a))) return;
    const Exchange e{std::max({sa, sb, 1.0}), std::fabs(moved - want), b, x, y};
    if (e.better_than(best)) best = e;
  }

  // The cost heavy pack a should give: down to the step's mean; once the step is balanced (cost sinking into
  // the step before), down to its lightest pack, or by what its room above the mean allows.
  double give(int64_t a, int d) const {
    const double excess = part(a, d) - mean_[d];
    if (above_) return excess;
    const int64_t l = lightest_.best();
    return std::max(part(a, d) - part(l, d), excess) + kRefineTolerance * mean_[d];
  }

  // The cost pack b may take: up to the step's mean (its ceiling for a neighbouring step's pack).
  double take(int64_t b, int d) const { return own(b) ? mean_[d] - part(b, d) : ceiling(b) - part(b, 0); }

  // Moves and swaps between heavy pack a and pack b, moving a cost in a's worst part near the one wanted: what
  // brings a down to the step's mean without raising b above it (half their gap when b is above the mean).
  void try_pair(int64_t a, int64_t b, Exchange& best) {
    if (b < 0 || b == a || pool_.frozen(b)) return;
    if (std::find(tried_.begin(), tried_.end(), b) != tried_.end()) return;
    tried_.push_back(b);
    const int d = worst_part(a);
    const double room = take(b, d);
    if (!own(b) && !(room > 0.0)) return;
    const double gap = part(a, d) - part(b, d);
    if (own(b) && !(gap > 0.0)) return;
    const double want = room > 0.0 ? std::min(give(a, d), room) : 0.5 * gap;
    const std::vector<Entry>& A = pool_.content(a, d);
    const std::vector<Entry>& B = pool_.content(b, d);
    const int64_t na = static_cast<int64_t>(A.size()), nb = static_cast<int64_t>(B.size());
    if (na > 1) {  // a move leaves a at least one sample
      const int64_t at = lower_cost(A, d, want);
      work_ += log2_ceil(A.size()) + 2 * wide(kNeighbours);
      for (int64_t i = std::max<int64_t>(0, at - wide(kNeighbours)); i < std::min(na, at + wide(kNeighbours)); ++i) {
        consider(a, b, d, want, Moving(A[static_cast<size_t>(i)]), Moving(), best);
      }
    }
    const int64_t scan = std::min(na, wide(kSwapScan));
    const int64_t search = log2_ceil(B.size()) + 2 * wide(kNeighbours);
    for (int64_t s = 0; s < scan && nb > 0; ++s) {
      const Entry& x = A[static_cast<size_t>(scan == na ? s : s * na / scan)];
      const int64_t at = lower_cost(B, d, x.cost[d] - want);
      work_ += search;
      for (int64_t j = std::max<int64_t>(0, at - wide(kNeighbours)); j < std::min(nb, at + wide(kNeighbours)); ++j) {
        consider(a, b, d, want, Moving(x), Moving(B[static_cast<size_t>(j)]), best);
      }
    }
  }

  // a gives one of its costliest samples and takes two of b's whose costs sum to nearly that less `want`: moves
  // cost where one-for-one trades cannot, as between packs full of text (the attention term of one long sample
  // against two of half its length) or full of images of many sizes.
  void try_one_for_two(int64_t a, int64_t b, int d, double want, Exchange& best) {
    const std::vector<Entry>& A = pool_.content(a, d);
    const std::vector<Entry>& B = pool_.content(b, d);
    const int64_t na = static_cast<int64_t>(A.size()), nb = static_cast<int64_t>(B.size());
    if (nb < 2) return;
    const int64_t givers = std::min(na, kSetGivers), takers = std::min(nb, kSetScan);
    for (int64_t i = na - givers; i < na; ++i) {
      const Entry& x = A[static_cast<size_t>(i)];
      for (int64_t s = 0; s < takers; ++s) {
        const int64_t j = takers == nb ? s : s * nb / takers;
        const Entry& y1 = B[static_cast<size_t>(j)];
        const double rest = x.cost[d] - want - y1.cost[d];
        if (!(rest > 0.0)) continue;
        const int64_t at = lower_cost(B, d, rest);
        work_ += log2_ceil(B.size()) + 2 * kSetNeighbours;
        for (int64_t k = std::max<int64_t>(0, at - kSetNeighbours); k < std::min(nb, at + kSetNeighbours); ++k) {
          if (k != j) consider(a, b, d, want, Moving(x), Moving(y1, B[static_cast<size_t>(k)]), best);
        }
      }
    }
  }

  // Swaps of heavy pack a's samples with any of the pool's: for each sample x of a, the samples whose cost is
  // nearest to x's less what brings a down to the step's mean, in all the pool and among those of nearly x's
  // ViT load, whichever pack holds them.
  void try_pool(int64_t a, Exchange& best) {
    const int d = worst_part(a);
    const double want = give(a, d);
    if (!(want > 0.0)) return;
    const std::vector<Entry>& A = pool_.content(a, d);
    const int64_t na = static_cast<int64_t>(A.size());
    const int64_t scan = std::min(na, wide(kSwapScan));
    for (int64_t s = 0; s < scan; ++s) {
      const Entry& x = A[static_cast<size_t>(scan == na ? s : s * na / scan)];
      const double target = x.cost[d] - want;
      work_ += pool_.near_cost(d, target, wide(kPoolNeighbours), [&](const Entry& y, int64_t b) {
        if (b != a) consider(a, b, d, want, Moving(x), Moving(y), best);
      });
      try_vit_near(a, d, want, Moving(x), best, wide(kGroupNeighbours));
    }
  }

  // One of a's samples for two of a partner's (the partners tried above), and two of a's for one of the pool's
  // of nearly their ViT load together: where the ViT capacity binds and ViT loads take many values, a pair's
  // sum finds a sample of its load where a single one finds none.
  void try_sets(int64_t a, Exchange& best) {
    const int d = worst_part(a);
    for (const int64_t b : tried_) try_one_for_two(a, b, d, std::min(give(a, d), std::max(take(b, d), 0.0)), best);
    const double want = give(a, d);
    if (!(want > 0.0)) return;
    const std::vector<Entry>& A = pool_.content(a, d);
    const int64_t na = static_cast<int64_t>(A.size()), pairs = std::min(na, kSetGivers);
    for (int64_t i = na - pairs; i < na; ++i) {
      for (int64_t j = i + 1; j < na; ++j) {
        try_vit_near(a, d, want, Moving(A[static_cast<size_t>(i)], A[static_cast<size_t>(j)]), best, kSetNeighbours);
      }
    }
  }

  // The samples of the pool whose ViT load is nearest to x's (within a's room above it) and whose cost is
  // nearest to x's less `want`, as one for x.
  void try_vit_near(int64_t a, int d, double want, const Moving& x, Exchange& best, int64_t around) {
    const int64_t hi = x.vit() + (cap_.vit - totals_.vit[static_cast<size_t>(pool_.id(a))]);
    work_ += pool_.near_vit_and_cost(d, x.vit(), hi, x.cost(d) - want, wide(kVitGroups), around,
                                     [&](const Entry& y, int64_t b) {
                                       if (b != a) consider(a, b, d, want, x, Moving(y), best);
                                     });
  }

  void apply(int64_t a, const Exchange& ex) {
    const int64_t b = ex.other;
    // one-for-one first, then what is left moves alone
    const int paired = std::min(ex.x.n, ex.y.n);
    for (int k = 0; k < paired; ++k) work_ += pool_.exchange(a, b, ex.x.e[k], &ex.y.e[k]);
    for (int k = paired; k < ex.x.n; ++k) work_ += pool_.exchange(a, b, ex.x.e[k], nullptr);
    for (int k = paired; k < ex.y.n; ++k) work_ += pool_.exchange(b, a, ex.y.e[k], nullptr);
    if (!own(b)) {  // cost left the step
      sum_[0] -= ex.x.cost(0) - ex.y.cost(0);
      set_mean();
    }
    update(a);
    update(b);
  }

  PackLoads& totals_;
  StepPool pool_;
  Capacity cap_;
  int dims_;
  int64_t w_ = 0, before_end_ = 0;
  bool above_ = true;  // the heaviest pack is above the step's mean (else cost only sinks into the step before)
  const std::vector<double>* ceiling_ = nullptr;
  std::array<double, kMaxDims> sum_{}, mean_{}, inv_{}, frozen_top_{};
  int64_t work_ = 0;
  int64_t reach_ = 1;  // the search's breadth, a multiple of the constants above
  Ending ending_ = Ending::kNothingToDo;
  ArgMin heaviest_, lightest_, sink_, spill_;
  std::vector<int64_t> tried_;
};

// Whether the step of packs ids[0:w] has its costliest pack within tolerance of the mean in every part (then
// refine would return at once): told from the costs alone, without reading the packs.
bool balanced(const PackLoads& totals, const Index* ids, Index w) {
  const int dims = totals.cost_dims;
  for (int d = 0; d < dims; ++d) {
    double sum = 0.0, top = 0.0;
    for (Index k = 0; k < w; ++k) {
      const double c = totals.cost[static_cast<size_t>(ids[k] * dims + d)];
      sum += c;
      top = std::max(top, c);
    }
    if (top * static_cast<double>(w) > (1.0 + kRefineTolerance) * sum) return false;
  }
  return true;
}

}  // namespace

int64_t refine_steps(Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
                     const LargeVector<Index>& order, Index world_size, int64_t work_per_sample,
                     const std::vector<char>* only) {
  if (world_size < 2 || order.empty()) return 0;
  auto skipped = [&](int64_t s) { return only != nullptr && !(*only)[static_cast<size_t>(s)]; };
  // Packs used more than once (reused to fill a ragged step) must keep their samples: any change would
  // show in every slot they fill.
  std::vector<Index> uses(static_cast<size_t>(packs.size()), 0);
  for (const Index p : order) ++uses[static_cast<size_t>(p)];
  auto is_frozen = [&](Index p) {
    const size_t q = static_cast<size_t>(p);
    return uses[q] != 1 || totals.vit[q] > cap.vit || totals.llm[q] > cap.llm;
  };
  StepRefiner refiner(totals, loads, costs, cap);
  PackContents contents(packs);
  std::vector<Index> pool;
  std::vector<char> frozen;
  std::vector<double> ceiling;
  int64_t exchanges = 0;
  const int64_t num_steps = static_cast<int64_t>(order.size()) / world_size;
  const size_t w = static_cast<size_t>(world_size);
  // A refinement's work is bounded by the step's own samples (the other steps' packs add candidates, not work), so
  // the exchanges of an epoch cost at most four times work_per_sample per sample (a stuck step is refined twice,
  // the step before it once more, and a step still above its mean once with a far step's packs).
  auto budget_for = [&]() {
    int64_t samples = 0;
    for (size_t k = 0; k < w; ++k) samples += contents.size(pool[k]);
    return samples > 0 && work_per_sample > std::numeric_limits<int64_t>::max() / samples
               ? std::numeric_limits<int64_t>::max()
               : work_per_sample * samples;
  };
  auto save = [&]() {
    for (size_t k = 0; k < pool.size(); ++k) {
      if (!frozen[k]) contents.store(pool[k], refiner.content(static_cast<int64_t>(k)));
    }
  };
  // Step t's costliest pack and mean cost (one cost part).
  auto top_and_mean = [&](int64_t t) {
    const Index* other = order.data() + t * world_size;
    double sum = 0.0, top = 0.0;
    for (size_t k = 0; k < w; ++k) {
      const double c = totals.cost[static_cast<size_t>(other[k])];
      sum += c;
      top = std::max(top, c);
    }
    return std::make_pair(top, sum / static_cast<double>(world_size));
  };
  auto above_mean = [&](int64_t t) {
    const auto [top, mean] = top_and_mean(t);
    return top > (1.0 + kRefineTolerance) * mean;
  };
  // The pool: step t's own packs, none with a ceiling yet.
  auto start_pool = [&](int64_t t) {
    const Index* ids = order.data() + t * world_size;
    pool.assign(ids, ids + world_size);
    frozen.resize(w);
    for (size_t k = 0; k < w; ++k) frozen[k] = is_frozen(pool[k]);
    ceiling.clear();
  };
  // Refines the pool's first world_size packs (the `before` packs after them are a step before) and keeps what
  // moved; returns the exchanges made.
  auto refine_pool = [&](int64_t before) {
    const int64_t made = refiner.refine(pool, world_size, before, frozen, ceiling, budget_for(), contents);
    if (made > 0) save();
    return made;
  };
  auto add_step = [&](int64_t t, double limit) {
    const Index* other = order.data() + t * world_size;
    for (size_t k = 0; k < w; ++k) {
      pool.push_back(other[k]);
      frozen.push_back(is_frozen(other[k]) ? 1 : 0);
      ceiling.push_back(limit);
    }
  };
  const bool one_part = totals.cost_dims == 1;
  auto trade_with_stuck_steps = [&]() {
    // (minus the room below the step's costliest pack as this pass begins, step): the most room first
    std::vector<std::pair<double, int64_t>> stuck;
    for (int64_t t = 0; t < num_steps; ++t) {
      const auto [top, mean] = top_and_mean(t);
      if (top > (1.0 + kRefineTolerance) * mean) stuck.emplace_back(-(top - mean), t);
    }
    std::sort(stuck.begin(), stuck.end());
    // Steps that took cost up to their costliest pack stay balanced: the cursor passes them once.
    size_t cursor = 0;
    int64_t made = 0;
    std::vector<int64_t> partners;
    for (const auto& entry : stuck) {
      const int64_t s = entry.second;
      if (skipped(s) || !above_mean(s)) continue;
      while (cursor < stuck.size() && !above_mean(stuck[cursor].second)) ++cursor;
      partners.clear();
      const size_t scan_end = std::min(stuck.size(), cursor + static_cast<size_t>(4 * kFarSteps + 4));
      for (size_t c = cursor; c < scan_end && static_cast<int64_t>(partners.size()) < kFarSteps; ++c) {
        if (stuck[c].second != s && above_mean(stuck[c].second)) partners.push_back(stuck[c].second);
      }
      if (partners.empty()) continue;
      start_pool(s);
      for (const int64_t t : partners) add_step(t, top_and_mean(t).first);
      made += refine_pool(0);
    }
    return made;
  };
  for (int64_t s = 0; s < num_steps; ++s) {
    if (skipped(s)) continue;
    const Index* ids = order.data() + s * world_size;
    // A step before this one whose costliest pack stands above its mean (a pack no exchange could lower) has
    // room below that pack: cost this step gives there lowers this step and raises nothing.
    double before_top = 0.0;
    bool sink = false;
    if (one_part && s > 0) {
      const auto [top, mean] = top_and_mean(s - 1);
      before_top = top;
      sink = top > (1.0 + kRefineTolerance) * mean;
    }
    if (!sink && balanced(totals, ids, world_size)) continue;
    start_pool(s);
    if (sink) add_step(s - 1, before_top);
    exchanges += refine_pool(sink ? world_size : 0);
    if (!refiner.stuck() || !one_part) continue;
    // Still above its mean: the packs of the step before may take cost up to that step's costliest pack (which
    // they do not raise), those of the step after up to that step's mean (which its refinement then balances).
    pool.resize(w);
    frozen.resize(w);
    ceiling.clear();
    const bool has_before = s > 0, has_after = s + 1 < num_steps;
    if (has_before) add_step(s - 1, top_and_mean(s - 1).first);
    if (has_after) add_step(s + 1, top_and_mean(s + 1).second);
    if (!has_before && !has_after) continue;
    exchanges += refine_pool(has_before ? world_size : 0);
    // Still above its mean: its packs may take cost up to its costliest pack, which they do not raise, from the
    // step before, whose costliest pack that lowers (refined as a step whose step before is this one).
    if (!has_before || !above_mean(s)) continue;
    start_pool(s - 1);
    add_step(s, top_and_mean(s).first);
    exchanges += refine_pool(world_size);
  }
  // Steps still above their mean trade with the packs of the step with the most room below its own costliest
  // pack (another step left above its mean), which they do not raise: where no neighbour can take cost, a
  // far step whose costliest pack cannot come down can.
  if (one_part) exchanges += trade_with_stuck_steps();
  if (exchanges > 0) {
    packs = contents.rebuild();
    // The changed packs' costs summed afresh in pack order: the same sums a caller recomputes from the plan.
    for (Index p = 0; p < packs.size(); ++p) {
      if (contents.changed(p)) fill_pack_cost(packs, costs, p, totals);
    }
  }
  return exchanges;
}

}  // namespace omnibal
