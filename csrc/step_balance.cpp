#include "step_balance.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

namespace omnibal {
namespace {

// A step is balanced enough once every pack is within this share of the step's mean in every load and in
// cost: its dist ratios and step efficiency are then within 0.001 of perfect, five times inside the tightest
// target (0.005). Below that, more swaps cost planning time for no visible gain.
constexpr double kRefineTolerance = 1e-3;
// At most this many swaps per pack of a step, and this many scans of every pack of the step when the
// lightest ones give no swap (the work per step stays linear in its packs). Measured at 512 ranks on
// Qwen2-VL-like patch loads (155k samples, 55 steps), LLM dist: 0.014 with 4 swaps and 1 scan, 0.0098 with
// 32 and 64, 0.0098 with 128 and 512; 8 ranks use a few swaps per step whatever the bound.
constexpr int64_t kSwapsPerPack = 32;
constexpr int kFullScansPerStep = 64;
// Besides the lightest packs, this many packs of the step, in turn, are tried on every swap.
constexpr int64_t kRotatingCandidates = 4;

constexpr double kInf = std::numeric_limits<double>::infinity();

// layered_order's sorts are counting sorts on at most kMaxSortGrid key values, kPacksPerCell packs per value
// and at least kMinSortGrid values (finer keys are rounded; see grid_sort_desc).
constexpr int64_t kMaxSortGrid = int64_t{1} << 20;
constexpr int64_t kMinSortGrid = int64_t{1} << 12;
constexpr int64_t kPacksPerCell = 4;
// step_trend leaves out loads whose step totals vary less than this (coefficient of variation).
constexpr double kMinTrendVariation = 0.01;
// layered_order measures the loads' spreads and correlations on at most this many packs.
constexpr int64_t kStatPacks = int64_t{1} << 16;
// The spread of a load is measured between these percentiles, so that a few outlying packs (the last
// packs of a best fit, oversize singles) do not make it look wider than it is for most steps.
constexpr double kSpreadLow = 0.05, kSpreadHigh = 0.95;

// (5th, 95th) percentile of `x` (not empty).
std::pair<double, double> percentile_range(const std::vector<double>& x) {
  std::vector<double> tmp(x);
  const size_t lo = static_cast<size_t>(kSpreadLow * static_cast<double>(tmp.size() - 1));
  const size_t hi = static_cast<size_t>(kSpreadHigh * static_cast<double>(tmp.size() - 1));
  std::nth_element(tmp.begin(), tmp.begin() + static_cast<std::ptrdiff_t>(hi), tmp.end());
  const double top = tmp[hi];
  std::nth_element(tmp.begin(), tmp.begin() + static_cast<std::ptrdiff_t>(lo), tmp.begin() + static_cast<std::ptrdiff_t>(hi));
  return {tmp[lo], top};
}

// 1 / sum of squared shares of the distinct values of `x` (integers in [0, kMaxSortGrid)), the number of
// equally common values that would be as mixed; 0 when `x` has other values.
double effective_groups(const std::vector<double>& x) {
  if (x.empty()) return 0.0;
  const double top = *std::max_element(x.begin(), x.end());
  if (!(top < static_cast<double>(kMaxSortGrid))) return 0.0;
  std::vector<int64_t> count(static_cast<size_t>(top) + 1, 0);
  for (const double v : x) {
    if (v < 0.0 || v != std::floor(v)) return 0.0;
    ++count[static_cast<size_t>(v)];
  }
  double sum_sq = 0.0;
  const double total = static_cast<double>(x.size());
  for (const int64_t c : count) sum_sq += (static_cast<double>(c) / total) * (static_cast<double>(c) / total);
  return 1.0 / sum_sq;
}


// The cube root of x >= 0 by bisection: plain arithmetic, so the same on every platform (std::cbrt, like
// std::log and std::exp, may round differently from one math library to another; std::sqrt may not).
double cube_root(double x) {
  double lo = 0.0, hi = std::max(1.0, x);
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (mid * mid * mid < x) lo = mid;
    else hi = mid;
  }
  return hi;
}

// Covariance matrix of the three loads, each relative to its mean (0 rows and columns for a load that is 0).
void covariance(const std::vector<std::vector<double>>& keys, double cov[3][3]) {
  const size_t n = keys[0].size();
  double scale[3];
  for (int d = 0; d < 3; ++d) {
    const double mean = std::accumulate(keys[static_cast<size_t>(d)].begin(), keys[static_cast<size_t>(d)].end(), 0.0) / static_cast<double>(n);
    scale[d] = mean > 0.0 ? 1.0 / mean : 0.0;
  }
  double sum[3][3] = {{0.0}};
  for (size_t p = 0; p < n; ++p) {
    double x[3];
    for (int d = 0; d < 3; ++d) x[d] = scale[d] > 0.0 ? keys[static_cast<size_t>(d)][p] * scale[d] - 1.0 : 0.0;
    for (int a = 0; a < 3; ++a) {
      for (int b = a; b < 3; ++b) sum[a][b] += x[a] * x[b];
    }
  }
  for (int a = 0; a < 3; ++a) {
    for (int b = a; b < 3; ++b) cov[a][b] = cov[b][a] = sum[a][b] / static_cast<double>(n);
  }
}

// Share of the variance of load y explained by a linear fit on the loads of `levels` (one or two of them).
double explained(const double cov[3][3], int y, const std::vector<std::pair<double, int>>& levels) {
  if (levels.empty() || !(cov[y][y] > 0.0)) return 0.0;
  const int a = levels[0].second;
  double r2 = cov[a][a] > 0.0 ? cov[y][a] * cov[y][a] / (cov[a][a] * cov[y][y]) : 0.0;
  if (levels.size() >= 2) {
    const int b = levels[1].second;
    const double det = cov[a][a] * cov[b][b] - cov[a][b] * cov[a][b];
    if (det > 1e-12 * cov[a][a] * cov[b][b]) {
      const double fit = (cov[y][a] * (cov[b][b] * cov[y][a] - cov[a][b] * cov[y][b]) +
                          cov[y][b] * (cov[a][a] * cov[y][b] - cov[a][b] * cov[y][a])) / det;
      r2 = std::max(r2, fit / cov[y][y]);
    }
  }
  return std::min(r2, 1.0);
}

// One load of every pack, read in place: integer loads (ViT, LLM) or cost.
struct PackKey {
  const int64_t* ints;
  const double* reals;
  double operator()(int64_t p) const {
    return ints != nullptr ? static_cast<double>(ints[p]) : reals[p];
  }
};

// Stable counting sort of `order` by `key` decreasing: on the integer values themselves when they are few
// enough, else on a grid of one cell per kPacksPerCell packs (at least kMinSortGrid cells): a cell is then
// about 1/(n / 4) of the largest key, far below the 0.1% refine_steps evens out, and the cell counts stay in
// cache.
void grid_sort_desc(LargeVector<int64_t>& order, const PackKey& key) {
  const int64_t n = static_cast<int64_t>(order.size());
  double top = 0.0;
  for (const int64_t p : order) top = std::max(top, key(p));
  if (!(top > 0.0)) return;
  const int64_t max_grid = std::min<int64_t>(kMaxSortGrid, std::max<int64_t>(n / kPacksPerCell, kMinSortGrid));
  const bool exact = key.ints != nullptr && top < static_cast<double>(max_grid);
  const int64_t grid = exact ? static_cast<int64_t>(top) + 1 : max_grid;
  const double scale = exact ? 1.0 : static_cast<double>(grid - 1) / top;
  auto cell = [&](int64_t p) {
    const double k = key(p);
    return k > 0.0 ? grid - 1 - std::min<int64_t>(static_cast<int64_t>(k * scale), grid - 1) : grid - 1;
  };
  std::vector<int64_t> start(static_cast<size_t>(grid) + 1, 0);
  for (const int64_t p : order) ++start[static_cast<size_t>(cell(p)) + 1];
  for (int64_t v = 0; v < grid; ++v) start[static_cast<size_t>(v) + 1] += start[static_cast<size_t>(v)];
  LargeVector<int64_t> out(order.size());
  for (const int64_t p : order) out[static_cast<size_t>(start[static_cast<size_t>(cell(p))]++)] = p;
  order.swap(out);
}

// Sorts each block of `block` consecutive entries of `order` by key decreasing (ties keep their order), in
// linear time: a stable sort of all entries by key, then a stable counting sort by the block they came from.
void sort_blocks_desc(LargeVector<int64_t>& order, int64_t block, const PackKey& key) {
  const int64_t n = static_cast<int64_t>(order.size());
  if (block <= 1 || n <= 1) return;
  std::vector<int32_t> block_of(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) block_of[static_cast<size_t>(order[static_cast<size_t>(k)])] = static_cast<int32_t>(k / block);
  grid_sort_desc(order, key);
  const int64_t blocks = (n + block - 1) / block;
  std::vector<int64_t> start(static_cast<size_t>(blocks) + 1, 0);
  for (const int64_t p : order) ++start[static_cast<size_t>(block_of[static_cast<size_t>(p)]) + 1];
  for (int64_t b = 0; b < blocks; ++b) start[static_cast<size_t>(b) + 1] += start[static_cast<size_t>(b)];
  LargeVector<int64_t> out(order.size());
  for (const int64_t p : order) out[static_cast<size_t>(start[static_cast<size_t>(block_of[static_cast<size_t>(p)])]++)] = p;
  order.swap(out);
}

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
    for (x >>= 1; x >= 1; x >>= 1) node_[static_cast<size_t>(x)] = pick(node_[static_cast<size_t>(2 * x)],
                                                                         node_[static_cast<size_t>(2 * x + 1)]);
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
    double worst = 0.0;
    for (int64_t k = 0; k < w; ++k) {
      if (!frozen[static_cast<size_t>(k)]) worst = std::max(worst, score_of(k));
    }
    if (worst <= 1.0 + kRefineTolerance) return 0;
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
    double score;   // the larger relative load of the two packs after the swap
    int64_t other;  // step position of the other pack, -1 for none
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

// Mean over the steps of `order` (runs of world_size packs) of 1 - mean / max, summed over the three loads;
// over an evenly strided subset of the steps holding about kStatPacks packs.
double step_spread(const LargeVector<int64_t>& order, const PackKey keys[3], int64_t world_size) {
  const int64_t steps = static_cast<int64_t>(order.size()) / world_size;
  const int64_t stride = std::max<int64_t>(1, steps * world_size / kStatPacks);
  double total = 0.0;
  int64_t measured = 0;
  for (int64_t s = 0; s < steps; s += stride, ++measured) {
    for (int d = 0; d < 3; ++d) {
      double sum = 0.0, top = 0.0;
      for (int64_t k = s * world_size; k < (s + 1) * world_size; ++k) {
        const double x = keys[d](order[static_cast<size_t>(k)]);
        sum += x;
        top = std::max(top, x);
      }
      if (top > 0.0) total += 1.0 - sum / (static_cast<double>(world_size) * top);
    }
  }
  return measured > 0 ? total / static_cast<double>(measured) : 0.0;
}

// Block sizes (in steps) of levels 2.. of a layered sort over `steps` steps, rounded to whole steps, and the
// predicted relative spreads left in a step, summed over the levels: level l leaves spread_l * (its block /
// the block above).
double plan_levels(const std::vector<std::pair<double, int>>& levels, double steps, std::vector<double>& blocks) {
  double product = 1.0 / steps;
  for (const auto& level : levels) product *= level.first;
  const double share = levels.size() == 1 ? product : levels.size() == 2 ? std::sqrt(product) : cube_root(product);
  blocks.clear();
  double above = steps, error = 0.0;
  for (size_t l = 0; l < levels.size(); ++l) {
    // a step spans 1/block of the spread its level leaves: block = steps above * share / spread
    const double block = l + 1 == levels.size()
                             ? 1.0
                             : std::min(above, std::max(1.0, std::round(above * share / levels[l].first)));
    error += levels[l].first * block / std::max(above, 1.0);
    if (l + 1 < levels.size()) blocks.push_back(block);
    above = block;
  }
  return error;
}

LargeVector<int64_t> layered_order(const PackLoads& totals, int64_t world_size) {
  const int64_t n = static_cast<int64_t>(totals.cost.size());
  LargeVector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (n <= world_size) return order;
  const PackKey keys[3] = {{totals.vit.data(), nullptr}, {totals.llm.data(), nullptr}, {nullptr, totals.cost.data()}};
  // The statistics that choose the levels come from an evenly strided subset of the packs (packs are
  // numbered in random order): they need a few digits, not every pack.
  const int64_t stride = (n + kStatPacks - 1) / kStatPacks;
  std::vector<std::vector<double>> sample(3);
  for (int d = 0; d < 3; ++d) {
    for (int64_t p = 0; p < n; p += stride) sample[static_cast<size_t>(d)].push_back(keys[d](p));
  }
  // Levels are chosen greedily: the load with the widest spread first, then the load with the widest spread
  // left once the loads already chosen are accounted for (its spread times sqrt(1 - R^2) of a linear fit on
  // them: cost follows the LLM load closely, so after it cost needs a much finer level than its own spread).
  double spread[3], cov[3][3], mean[3];
  std::pair<double, double> range[3];
  covariance(sample, cov);
  for (int d = 0; d < 3; ++d) {
    const std::vector<double>& x = sample[static_cast<size_t>(d)];
    mean[d] = std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(x.size());
    range[d] = percentile_range(x);
    spread[d] = mean[d] > 0.0 ? (range[d].second - range[d].first) / mean[d] : 0.0;
  }
  std::vector<std::pair<double, int>> levels;  // (spread left, load)
  bool chosen[3] = {false, false, false};
  for (int round = 0; round < 3; ++round) {
    int best = -1;
    double best_left = kRefineTolerance;
    for (int d = 0; d < 3; ++d) {
      if (chosen[d]) continue;
      const double left = spread[d] * std::sqrt(std::max(0.0, 1.0 - explained(cov, d, levels)));
      if (left > best_left) best = d, best_left = left;
    }
    if (best < 0) break;
    chosen[best] = true;
    levels.emplace_back(best_left, best);
  }
  // A load that is not a level leaves its spread in a step: about (95th percentile - mean) / 95th
  // percentile, the share a typical step's largest pack has over its mean (ViT loads of packs mostly at the
  // capacity and a few below it, say).
  double unsorted[3];
  for (int d = 0; d < 3; ++d) {
    const double top = range[d].second;
    unsorted[d] = top > 0.0 ? std::max(0.0, top - mean[d]) / top : 0.0;
  }
  auto left_out_error = [&](const std::vector<std::pair<double, int>>& used, int exact_load) {
    double e = 0.0;
    for (int d = 0; d < 3; ++d) {
      const bool in = d == exact_load || std::any_of(used.begin(), used.end(), [&](const auto& l) { return l.second == d; });
      if (!in) e += unsorted[d];
    }
    return e;
  };
  const double steps = static_cast<double>(n / world_size);
  std::vector<double> blocks;
  double error = (levels.empty() ? 0.0 : plan_levels(levels, steps, blocks)) + left_out_error(levels, -1);
  // Or an integer load as exact groups (the ViT load of packs at the ViT capacity: mostly 16 tiles, a few 15),
  // the other loads layered within each group: that load keeps no spread, the others get the steps of a
  // group, steps / (effective number of groups, 1 / sum of squared group shares). The load whose predicted
  // spreads left in a step, summed over the three loads, are smallest is built as well, and the two orders
  // are compared on their measured spreads (the prediction cannot see how rare values fall into steps).
  int exact = -1;
  double exact_error = std::numeric_limits<double>::infinity();
  std::vector<std::pair<double, int>> exact_inner;
  std::vector<double> exact_blocks;
  for (int d = 0; d < 2; ++d) {  // cost is not an integer load
    const double groups = effective_groups(sample[static_cast<size_t>(d)]);
    if (!(groups >= 1.0) || groups > steps) continue;
    std::vector<std::pair<double, int>> rest;
    for (const auto& level : levels) {
      if (level.second != d) rest.push_back(level);
    }
    std::vector<double> rest_blocks;
    const double rest_error = (rest.empty() ? 0.0 : plan_levels(rest, steps / groups, rest_blocks)) +
                              left_out_error(rest, d);
    if (rest_error < exact_error) exact_error = rest_error, exact = d, exact_inner = rest, exact_blocks = rest_blocks;
  }
  auto build = [&](int exact_load, const std::vector<std::pair<double, int>>& inner,
                   const std::vector<double>& inner_blocks) {
    LargeVector<int64_t> out(static_cast<size_t>(n));
    std::iota(out.begin(), out.end(), 0);
    if (!inner.empty()) grid_sort_desc(out, keys[inner[0].second]);
    if (exact_load >= 0) grid_sort_desc(out, keys[exact_load]);  // stable: groups keep the order above
    for (size_t l = 1; l < inner.size(); ++l) {
      sort_blocks_desc(out, static_cast<int64_t>(inner_blocks[l - 1]) * world_size, keys[inner[l].second]);
    }
    return out;
  };
  order = build(-1, levels, blocks);
  if (exact >= 0 && exact_error < error) {
    LargeVector<int64_t> grouped = build(exact, exact_inner, exact_blocks);
    if (step_spread(grouped, keys, world_size) < step_spread(order, keys, world_size)) order.swap(grouped);
  }
  return order;
}

int64_t refine_steps(Packs& packs, PackLoads& totals, const Loads& loads, const CostModel& cost, Capacity cap,
                     const LargeVector<int64_t>& order, int64_t world_size) {
  if (world_size < 2 || order.empty()) return 0;
  // Packs used more than once (reused to fill a ragged step) must keep their samples: any change would
  // show in every slot they fill.
  std::vector<int32_t> uses(static_cast<size_t>(packs.size()), 0);
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

StepTotals step_totals(const LargeVector<int64_t>& order, const PackLoads& totals, int64_t world_size) {
  StepTotals out;
  const int64_t steps = static_cast<int64_t>(order.size()) / world_size;
  for (auto& load : out.load) load.assign(static_cast<size_t>(steps), 0.0);
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t k = s * world_size; k < (s + 1) * world_size; ++k) {
      const size_t p = static_cast<size_t>(order[static_cast<size_t>(k)]);
      out.load[0][static_cast<size_t>(s)] += static_cast<double>(totals.vit[p]);
      out.load[1][static_cast<size_t>(s)] += static_cast<double>(totals.llm[p]);
      out.load[2][static_cast<size_t>(s)] += totals.cost[p];
    }
  }
  return out;
}

double step_trend(const LargeVector<int64_t>& step_order, const StepTotals& totals) {
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
    if (!(mean > 0.0) || var <= kMinTrendVariation * kMinTrendVariation * mean * mean * static_cast<double>(n)) continue;
    worst = std::max(worst, std::fabs(cov) / std::sqrt(var * var_pos));
  }
  return worst;
}

}  // namespace omnibal
