// refine_steps (step_balance.hpp): sample exchanges between the packs of one step, the heavy pack's partner
// chosen with arg-min trees over the step's packs, the samples exchanged found by binary search in each pack's
// samples sorted by cost.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "step_balance.hpp"

namespace omnibal {
namespace {

// Samples tried on each side of a binary search's position (the nearest costs may not fit the capacities).
constexpr int64_t kNeighbours = 4;
// Samples of the heavy pack tried as the one given in a swap: all of them up to this many, else this many
// evenly spaced in cost order (in large packs a move of one sample nearly always moves the cost wanted).
constexpr int64_t kSwapScan = 64;
// Besides the step's lightest pack, this many packs of the step, in turn, are tried on every exchange, and
// every pack of the step on at most kFullScansPerStep exchanges where those give none.
constexpr int64_t kRotatingCandidates = 4;
constexpr int kFullScansPerStep = 8;

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

// At most this many cost parts (SampleCosts::dims): the step's time, or the ViT's and the LLM's.
constexpr int kMaxDims = 2;

struct Entry {
  double cost[kMaxDims];
  int64_t vit, llm;
  Index id;
};

// Orders entries by cost part d, ties by id.
struct Cheaper {
  int d;
  bool operator()(const Entry& a, const Entry& b) const {
    return a.cost[d] != b.cost[d] ? a.cost[d] < b.cost[d] : a.id < b.id;
  }
};

// First position in `e` (sorted by cost part d) whose part d is >= c.
int64_t lower_cost(const std::vector<Entry>& e, int d, double c) {
  return std::lower_bound(e.begin(), e.end(), c, [d](const Entry& x, double v) { return x.cost[d] < v; }) - e.begin();
}

int64_t log2_ceil(size_t n) {
  int64_t k = 1;
  while ((size_t{1} << k) < n) ++k;
  return k;
}

// Sorts (key, id) pairs by key, ties by id (ids >= 0): at this many pairs and more, a stable radix sort in
// 11-bit digits, on the id and then on the key, skipping the digits every pair shares; below, std::sort.
constexpr size_t kRadixPairs = 2048;
using KeyedId = std::pair<uint64_t, Index>;

void sort_keyed(std::vector<KeyedId>& v, std::vector<KeyedId>& scratch) {
  if (v.size() < kRadixPairs) {
    std::sort(v.begin(), v.end());
    return;
  }
  constexpr int kBits = 11;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  std::vector<size_t> count(size_t{1} << kBits);
  scratch.resize(v.size());
  auto pass = [&](auto digit) {
    std::fill(count.begin(), count.end(), 0);
    for (const KeyedId& e : v) ++count[digit(e)];
    if (count[digit(v[0])] == v.size()) return;
    size_t sum = 0;
    for (size_t& c : count) sum += std::exchange(c, sum);
    for (const KeyedId& e : v) scratch[count[digit(e)]++] = e;
    v.swap(scratch);
  };
  uint64_t max_id = 0;
  for (const KeyedId& e : v) max_id = std::max(max_id, static_cast<uint64_t>(e.second));
  for (int shift = 0; shift < 64 && (max_id >> shift) != 0; shift += kBits) {
    pass([shift](const KeyedId& e) { return static_cast<size_t>((static_cast<uint64_t>(e.second) >> shift) & kMask); });
  }
  for (int shift = 0; shift < 64; shift += kBits) {
    pass([shift](const KeyedId& e) { return static_cast<size_t>((e.first >> shift) & kMask); });
  }
}

// The exchange chosen for the heavy pack: `x` leaves it for pack `other`, `y` (unless has_y) comes back.
struct Exchange {
  double top = kInf;    // the larger score of the two packs after it
  double error = kInf;  // |cost moved - cost wanted|, in the heavy pack's worst part
  int64_t other = -1;
  Entry x{}, y{};
  bool has_y = false;
};

class StepRefiner {
 public:
  StepRefiner(PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap)
      : totals_(totals), loads_(loads), costs_(costs), cap_(cap), dims_(costs.dims) {}

  // Refines the step made of packs ids[0:w] (frozen[k] marks the ones to leave alone) within `budget` units
  // of work; returns the number of exchanges. Its packs' samples are then in content(k).
  int64_t refine(const Index* ids, const std::vector<char>& frozen, int64_t w, int64_t budget, const Packs& packs) {
    ids_ = ids;
    frozen_ = &frozen;
    for (int d = 0; d < dims_; ++d) {
      double sum = 0.0;
      for (int64_t k = 0; k < w; ++k) sum += part(k, d);
      mean_[d] = sum / static_cast<double>(w);
      inv_[d] = mean_[d] > 0.0 ? 1.0 / mean_[d] : 0.0;
    }
    // A pack's score: its largest part relative to the step's mean of that part (1: the least largest pack
    // a step can have). Nothing to gain below 1 within tolerance, or below a pack that cannot change.
    double floor = 1.0 + kRefineTolerance, top = 0.0;
    for (int64_t k = 0; k < w; ++k) {
      if (frozen[static_cast<size_t>(k)]) floor = std::max(floor, score(k));
      else top = std::max(top, score(k));
    }
    if (top <= floor || budget <= 0) return 0;
    if (static_cast<int64_t>(content_.size()) < w) content_.resize(static_cast<size_t>(w));
    heaviest_.reset(w);
    lightest_.reset(w);
    for (int64_t k = 0; k < w; ++k) {
      if (frozen[static_cast<size_t>(k)]) continue;
      // Sorted by part 0 as (cost, id) pairs of integers, a third of an entry's size, then the entries filled in
      // order. Costs are finite and >= 0, so their bit patterns order as they do.
      const size_t p = static_cast<size_t>(ids[k]);
      keys_.clear();
      for (Index i = packs.offsets[p]; i < packs.offsets[p + 1]; ++i) {
        const Index id = packs.samples[static_cast<size_t>(i)];
        const double cost = costs_.cost[id * dims_] + 0.0;  // -0.0 as +0.0
        uint64_t bits;
        std::memcpy(&bits, &cost, sizeof bits);
        keys_.push_back({bits, id});
      }
      sort_keyed(keys_, keys_scratch_);
      std::vector<Entry>& e = content_[static_cast<size_t>(k)][0];
      e.clear();
      for (const auto& key : keys_) {
        const Index id = key.second;
        Entry x{{0.0, 0.0}, loads_.vit[id], loads_.llm[id], id};
        for (int d = 0; d < dims_; ++d) x.cost[d] = costs_.cost[id * dims_ + d];
        e.push_back(x);
      }
      for (int d = 1; d < dims_; ++d) {
        std::vector<Entry>& sorted = content_[static_cast<size_t>(k)][static_cast<size_t>(d)];
        sorted = e;
        std::sort(sorted.begin(), sorted.end(), Cheaper{d});
      }
      update(k);
    }
    work_ = 0;
    int64_t exchanges = 0, cursor = 0;
    int full_scans = 0;
    while (work_ < budget) {
      const int64_t a = heaviest_.best();
      if (a < 0 || score(a) <= floor) break;
      Exchange best;
      tried_.clear();
      try_pair(a, lightest_.best(), best);
      for (int64_t r = 0; r < std::min(kRotatingCandidates, w); ++r) try_pair(a, (cursor++) % w, best);
      if (best.other < 0 && full_scans < kFullScansPerStep) {
        ++full_scans;
        for (int64_t b = 0; b < w; ++b) try_pair(a, b, best);
      }
      if (best.other < 0) break;
      apply(a, best);
      ++exchanges;
    }
    return exchanges;
  }

  const std::vector<Entry>& content(int64_t k) const { return content_[static_cast<size_t>(k)][0]; }

 private:
  double part(int64_t k, int d) const { return totals_.cost[static_cast<size_t>(ids_[k] * dims_ + d)]; }
  double score(int64_t k) const {
    double s = 0.0;
    for (int d = 0; d < dims_; ++d) s = std::max(s, part(k, d) * inv_[d]);
    return s;
  }
  int worst_part(int64_t k) const {
    int worst = 0;
    for (int d = 1; d < dims_; ++d) {
      if (part(k, d) * inv_[d] > part(k, worst) * inv_[worst]) worst = d;
    }
    return worst;
  }

  void update(int64_t k) {
    heaviest_.set(k, -score(k));
    lightest_.set(k, score(k));
  }

  // The exchange between heavy pack a and pack b that moves a cost, in a's worst part, nearest to the one
  // wanted: what brings a down to the step's mean without raising b above it (half their gap when b is
  // above the mean already); it must leave both packs' scores below a's. Kept in `best` when it leaves the
  // larger of the two scores lower than best's.
  void try_pair(int64_t a, int64_t b, Exchange& best) {
    if (b < 0 || b == a || (*frozen_)[static_cast<size_t>(b)]) return;
    if (std::find(tried_.begin(), tried_.end(), b) != tried_.end()) return;
    tried_.push_back(b);
    const int d = worst_part(a);
    const double ca = part(a, d), cb = part(b, d), gap = ca - cb, mean = mean_[d];
    if (!(gap > 0.0)) return;
    const double want = cb < mean ? std::min(ca - mean, mean - cb) : 0.5 * gap;
    const size_t pa = static_cast<size_t>(ids_[a]), pb = static_cast<size_t>(ids_[b]);
    const int64_t room_av = cap_.vit - totals_.vit[pa], room_at = cap_.llm - totals_.llm[pa];
    const int64_t room_bv = cap_.vit - totals_.vit[pb], room_bt = cap_.llm - totals_.llm[pb];
    const std::vector<Entry>& A = content_[static_cast<size_t>(a)][static_cast<size_t>(d)];
    const std::vector<Entry>& B = content_[static_cast<size_t>(b)][static_cast<size_t>(d)];
    const int64_t na = static_cast<int64_t>(A.size()), nb = static_cast<int64_t>(B.size());
    const double limit = score(a);
    Exchange pair;
    // x leaves a for b, y (if any) comes back: both packs' scores after it, against a's now.
    auto consider = [&](const Entry& x, const Entry* y) {
      const double moved = x.cost[d] - (y != nullptr ? y->cost[d] : 0.0);
      const double error = std::fabs(moved - want);
      if (!(moved > 0.0) || error >= pair.error) return;
      double sa = 0.0, sb = 0.0;
      for (int q = 0; q < dims_; ++q) {
        const double delta = x.cost[q] - (y != nullptr ? y->cost[q] : 0.0);
        sa = std::max(sa, (part(a, q) - delta) * inv_[q]);
        sb = std::max(sb, (part(b, q) + delta) * inv_[q]);
      }
      if (!(std::max(sa, sb) < limit)) return;
      pair = Exchange{std::max(sa, sb), error, b, x, y != nullptr ? *y : Entry{}, y != nullptr};
    };
    if (na > 1) {  // a move leaves a at least one sample
      const int64_t at = lower_cost(A, d, want);
      work_ += log2_ceil(A.size()) + 2 * kNeighbours;
      for (int64_t i = std::max<int64_t>(0, at - kNeighbours); i < std::min(na, at + kNeighbours); ++i) {
        const Entry& x = A[static_cast<size_t>(i)];
        if (x.vit <= room_bv && x.llm <= room_bt) consider(x, nullptr);
      }
    }
    const int64_t scan = std::min(na, kSwapScan);
    const int64_t search = log2_ceil(B.size()) + 2 * kNeighbours;
    for (int64_t s = 0; s < scan && nb > 0; ++s) {
      const Entry& x = A[static_cast<size_t>(scan == na ? s : s * na / scan)];
      const int64_t at = lower_cost(B, d, x.cost[d] - want);
      work_ += search;
      for (int64_t j = std::max<int64_t>(0, at - kNeighbours); j < std::min(nb, at + kNeighbours); ++j) {
        const Entry& y = B[static_cast<size_t>(j)];
        const int64_t dv = y.vit - x.vit, dt = y.llm - x.llm;
        if (dv <= room_av && -dv <= room_bv && dt <= room_at && -dt <= room_bt) consider(x, &y);
      }
    }
    if (pair.other >= 0 && pair.top < best.top) best = pair;
  }

  // Takes `e` out of every sorted copy of pack k's samples, or puts it in.
  void remove(int64_t k, const Entry& e) {
    for (int d = 0; d < dims_; ++d) {
      std::vector<Entry>& v = content_[static_cast<size_t>(k)][static_cast<size_t>(d)];
      v.erase(std::lower_bound(v.begin(), v.end(), e, Cheaper{d}));
    }
  }
  void insert(int64_t k, const Entry& e) {
    for (int d = 0; d < dims_; ++d) {
      std::vector<Entry>& v = content_[static_cast<size_t>(k)][static_cast<size_t>(d)];
      v.insert(std::lower_bound(v.begin(), v.end(), e, Cheaper{d}), e);
    }
  }
  // Replaces `out` by `in` in every sorted copy of pack k's samples, shifting only the entries between their
  // places (a swap exchanges samples of near costs: few entries, where an erase and an insert move half the
  // pack each). Returns the number of entries shifted.
  int64_t replace(int64_t k, const Entry& out, const Entry& in) {
    int64_t shifted = 0;
    for (int d = 0; d < dims_; ++d) {
      std::vector<Entry>& v = content_[static_cast<size_t>(k)][static_cast<size_t>(d)];
      const auto at_out = std::lower_bound(v.begin(), v.end(), out, Cheaper{d});
      const auto at_in = std::lower_bound(v.begin(), v.end(), in, Cheaper{d});
      if (at_in > at_out) {  // entries between are above `out` and below `in`: one place down
        std::move(at_out + 1, at_in, at_out);
        *(at_in - 1) = in;
        shifted += at_in - at_out;
      } else {  // entries between are at or above `in` and below `out`: one place up
        std::move_backward(at_in, at_out, at_out + 1);
        *at_in = in;
        shifted += at_out - at_in + 1;
      }
    }
    return shifted;
  }

  void apply(int64_t a, const Exchange& ex) {
    const int64_t b = ex.other;
    const int64_t search = dims_ * 2 * (log2_ceil(content(a).size()) + log2_ceil(content(b).size()));
    if (ex.has_y) {
      work_ += search + replace(a, ex.x, ex.y) + replace(b, ex.y, ex.x);
    } else {
      remove(a, ex.x);
      insert(b, ex.x);
      work_ += search + dims_ * static_cast<int64_t>(content(a).size() + content(b).size());
    }
    const size_t pa = static_cast<size_t>(ids_[a]), pb = static_cast<size_t>(ids_[b]);
    const Entry none{{0.0, 0.0}, 0, 0, -1};
    const Entry& y = ex.has_y ? ex.y : none;
    totals_.vit[pa] += y.vit - ex.x.vit;
    totals_.llm[pa] += y.llm - ex.x.llm;
    totals_.vit[pb] += ex.x.vit - y.vit;
    totals_.llm[pb] += ex.x.llm - y.llm;
    for (int d = 0; d < dims_; ++d) {
      totals_.cost[pa * static_cast<size_t>(dims_) + static_cast<size_t>(d)] += y.cost[d] - ex.x.cost[d];
      totals_.cost[pb * static_cast<size_t>(dims_) + static_cast<size_t>(d)] += ex.x.cost[d] - y.cost[d];
    }
    update(a);
    update(b);
  }

  PackLoads& totals_;
  const Loads& loads_;
  const SampleCosts& costs_;
  Capacity cap_;
  int dims_;
  const Index* ids_ = nullptr;
  const std::vector<char>* frozen_ = nullptr;
  double mean_[kMaxDims] = {0.0, 0.0}, inv_[kMaxDims] = {0.0, 0.0};
  int64_t work_ = 0;
  ArgMin heaviest_, lightest_;
  std::vector<std::array<std::vector<Entry>, kMaxDims>> content_;
  std::vector<int64_t> tried_;
  std::vector<KeyedId> keys_, keys_scratch_;
};

// The packs with the samples of the refined ones (moved_start[p] >= 0: moved[start : start + size]) replaced.
Packs rebuild(const Packs& packs, const std::vector<Index>& moved_start, const std::vector<Index>& moved_size,
              const std::vector<Index>& moved) {
  Packs out;
  out.samples.reserve(packs.samples.size());
  out.offsets.reserve(packs.offsets.size());
  for (Index p = 0; p < packs.size(); ++p) {
    const size_t q = static_cast<size_t>(p);
    if (moved_start[q] >= 0) {
      const auto first = moved.begin() + moved_start[q];
      out.samples.insert(out.samples.end(), first, first + moved_size[q]);
    } else {
      out.samples.insert(out.samples.end(), packs.samples.begin() + packs.offsets[q],
                         packs.samples.begin() + packs.offsets[q + 1]);
    }
    out.close_pack();
  }
  return out;
}

}  // namespace

int64_t refine_steps(Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap,
                     const LargeVector<Index>& order, Index world_size, int64_t work_per_sample) {
  if (world_size < 2 || order.empty()) return 0;
  // Packs used more than once (reused to fill a ragged step) must keep their samples: any change would
  // show in every slot they fill.
  std::vector<Index> uses(static_cast<size_t>(packs.size()), 0);
  for (const Index p : order) ++uses[static_cast<size_t>(p)];
  StepRefiner refiner(totals, loads, costs, cap);
  std::vector<char> frozen(static_cast<size_t>(world_size));
  std::vector<Index> moved_start, moved_size, moved;
  int64_t exchanges = 0;
  const int64_t num_steps = static_cast<int64_t>(order.size()) / world_size;
  const int dims = totals.cost_dims;
  for (int64_t s = 0; s < num_steps; ++s) {
    const Index* ids = order.data() + s * world_size;
    // A step whose costliest pack is within tolerance of the mean, in every part, has nothing to gain (refine
    // would return at once): told from the costs alone, without reading the packs.
    bool balanced = true;
    for (int d = 0; d < dims && balanced; ++d) {
      double sum = 0.0, top = 0.0;
      for (int64_t k = 0; k < world_size; ++k) {
        const double c = totals.cost[static_cast<size_t>(ids[k] * dims + d)];
        sum += c;
        top = std::max(top, c);
      }
      balanced = top * static_cast<double>(world_size) <= (1.0 + kRefineTolerance) * sum;
    }
    if (balanced) continue;
    int64_t samples = 0;
    for (int64_t k = 0; k < world_size; ++k) {
      const size_t p = static_cast<size_t>(ids[k]);
      frozen[static_cast<size_t>(k)] = uses[p] != 1 || totals.vit[p] > cap.vit || totals.llm[p] > cap.llm;
      samples += packs.offsets[p + 1] - packs.offsets[p];
    }
    const int64_t budget = samples > 0 && work_per_sample > std::numeric_limits<int64_t>::max() / samples
                               ? std::numeric_limits<int64_t>::max()
                               : work_per_sample * samples;
    const int64_t made = refiner.refine(ids, frozen, world_size, budget, packs);
    if (made == 0) continue;
    exchanges += made;
    if (moved_start.empty()) {
      moved_start.assign(static_cast<size_t>(packs.size()), -1);
      moved_size.assign(static_cast<size_t>(packs.size()), 0);
    }
    for (int64_t k = 0; k < world_size; ++k) {
      if (frozen[static_cast<size_t>(k)]) continue;
      const size_t p = static_cast<size_t>(ids[k]);
      moved_start[p] = static_cast<Index>(moved.size());
      for (const Entry& e : refiner.content(k)) moved.push_back(e.id);
      moved_size[p] = static_cast<Index>(moved.size()) - moved_start[p];
    }
  }
  if (exchanges > 0) {
    packs = rebuild(packs, moved_start, moved_size, moved);
    // The changed packs' costs summed afresh in pack order: the same sums a caller recomputes from the plan.
    for (Index p = 0; p < packs.size(); ++p) {
      if (moved_start[static_cast<size_t>(p)] >= 0) fill_pack_cost(packs, costs, p, totals);
    }
  }
  return exchanges;
}

}  // namespace omnibal
