// layered_order (step_balance.hpp): the loads' spreads and correlations on a sample of the packs, the choice
// of sort levels and block sizes from them, and the linear-time sorts that build the order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "step_balance.hpp"

namespace omnibal {
namespace {

// layered_order's sorts are counting sorts on at most kMaxSortGrid key values, kPacksPerCell packs per value
// and at least kMinSortGrid values (finer keys are rounded; see grid_sort_desc).
constexpr int64_t kMaxSortGrid = int64_t{1} << 20;
constexpr int64_t kMinSortGrid = int64_t{1} << 12;
constexpr int64_t kPacksPerCell = 4;
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
  std::nth_element(tmp.begin(), tmp.begin() + static_cast<std::ptrdiff_t>(lo),
                   tmp.begin() + static_cast<std::ptrdiff_t>(hi));
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
    const double mean = std::accumulate(keys[static_cast<size_t>(d)].begin(), keys[static_cast<size_t>(d)].end(), 0.0) /
                        static_cast<double>(n);
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
                          cov[y][b] * (cov[a][a] * cov[y][b] - cov[a][b] * cov[y][a])) /
                         det;
      r2 = std::max(r2, fit / cov[y][y]);
    }
  }
  return std::min(r2, 1.0);
}

// One load of every pack, read in place: integer loads (ViT, LLM) or cost.
struct PackKey {
  const int64_t* ints;
  const double* reals;
  double operator()(int64_t p) const { return ints != nullptr ? static_cast<double>(ints[p]) : reals[p]; }
};

// Stable counting sort of `order` by `key` decreasing: on the integer values themselves when they are few
// enough, else on a grid of one cell per kPacksPerCell packs (at least kMinSortGrid cells): a cell is then
// about 1/(n / 4) of the largest key, far below the 0.1% refine_steps evens out, and the cell counts stay in
// cache.
void grid_sort_desc(LargeVector<Index>& order, const PackKey& key) {
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
  LargeVector<Index> out(order.size());
  for (const int64_t p : order) out[static_cast<size_t>(start[static_cast<size_t>(cell(p))]++)] = p;
  order.swap(out);
}

// Sorts each block of `block` consecutive entries of `order` by key decreasing (ties keep their order), in
// linear time: a stable sort of all entries by key, then a stable counting sort by the block they came from.
void sort_blocks_desc(LargeVector<Index>& order, int64_t block, const PackKey& key) {
  const int64_t n = static_cast<int64_t>(order.size());
  if (block <= 1 || n <= 1) return;
  // Block numbers are int32 (half the memory traffic of this scatter); the largest one is checked once.
  narrow<int32_t>((n - 1) / block, "the number of sort blocks");
  std::vector<int32_t> block_of(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k)
    block_of[static_cast<size_t>(order[static_cast<size_t>(k)])] = static_cast<int32_t>(k / block);
  grid_sort_desc(order, key);
  const int64_t blocks = (n + block - 1) / block;
  std::vector<int64_t> start(static_cast<size_t>(blocks) + 1, 0);
  for (const int64_t p : order) ++start[static_cast<size_t>(block_of[static_cast<size_t>(p)]) + 1];
  for (int64_t b = 0; b < blocks; ++b) start[static_cast<size_t>(b) + 1] += start[static_cast<size_t>(b)];
  LargeVector<Index> out(order.size());
  for (const int64_t p : order)
    out[static_cast<size_t>(start[static_cast<size_t>(block_of[static_cast<size_t>(p)])]++)] = p;
  order.swap(out);
}

// Mean over the steps of `order` (runs of world_size packs) of 1 - mean / max, summed over the three loads;
// over an evenly strided subset of the steps holding about kStatPacks packs.
double step_spread(const LargeVector<Index>& order, const PackKey keys[3], int64_t world_size) {
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
    const double block =
        l + 1 == levels.size() ? 1.0 : std::min(above, std::max(1.0, std::round(above * share / levels[l].first)));
    error += levels[l].first * block / std::max(above, 1.0);
    if (l + 1 < levels.size()) blocks.push_back(block);
    above = block;
  }
  return error;
}

}  // namespace

LargeVector<Index> layered_order(const PackLoads& totals, Index world_size) {
  const int64_t n = static_cast<int64_t>(totals.cost.size());
  LargeVector<Index> order(static_cast<size_t>(n));
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
      const bool in =
          d == exact_load || std::any_of(used.begin(), used.end(), [&](const auto& l) { return l.second == d; });
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
    const double rest_error =
        (rest.empty() ? 0.0 : plan_levels(rest, steps / groups, rest_blocks)) + left_out_error(rest, d);
    if (rest_error < exact_error) exact_error = rest_error, exact = d, exact_inner = rest, exact_blocks = rest_blocks;
  }
  auto build = [&](int exact_load, const std::vector<std::pair<double, int>>& inner,
                   const std::vector<double>& inner_blocks) {
    LargeVector<Index> out(static_cast<size_t>(n));
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
    LargeVector<Index> grouped = build(exact, exact_inner, exact_blocks);
    if (step_spread(grouped, keys, world_size) < step_spread(order, keys, world_size)) order.swap(grouped);
  }
  return order;
}

}  // namespace omnibal
