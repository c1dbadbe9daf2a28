// fill_pack_costs, split_to_whole_steps and cost_order (step_balance.hpp): the packs and their order before the
// exchanges of refine_steps.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "step_balance.hpp"

namespace omnibal {
namespace {

// cost_order sorts by 11-bit digits (6 passes over the packs, every pass's counts in cache at once), and many
// packs only: below kRadixMin packs a comparison sort costs less than the passes' counts.
constexpr int kRadixBits = 11;
constexpr uint64_t kRadixMask = (uint64_t{1} << kRadixBits) - 1;
constexpr size_t kRadixMin = size_t{1} << 13;
// fill_pack_costs asks for the costs of a pack's samples this many packs before it sums them.
constexpr Index kPacksAhead = 4;

inline void prefetch(const void* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address);
#else
  (void)address;
#endif
}

// A cost (finite, >= 0) as a radix key: the bit patterns of such doubles order as the values do, and the
// complement turns decreasing costs into increasing keys (-0.0 counts as +0.0).
uint64_t desc_key(double cost) {
  const double c = cost + 0.0;
  uint64_t bits;
  std::memcpy(&bits, &c, sizeof bits);
  return ~bits;
}

double cost_of_key(uint64_t key) {
  const uint64_t bits = ~key;
  double c;
  std::memcpy(&c, &bits, sizeof c);
  return c;
}

// Stable sort of `items` by increasing key(item), a 64-bit key, in digits of kRadixBits (n >= kRadixMin).
template <typename T, typename Key>
void radix_sort(LargeVector<T>& items, Key key) {
  const size_t n = items.size();
  LargeVector<T> out(n);
  // Every pass's counts in one read of the keys.
  constexpr int kPasses = (64 + kRadixBits - 1) / kRadixBits;
  std::vector<size_t> counts(static_cast<size_t>(kPasses) << kRadixBits, 0);
  for (size_t k = 0; k < n; ++k) {
    const uint64_t x = key(items[k]);
    for (int pass = 0; pass < kPasses; ++pass) {
      ++counts[(static_cast<size_t>(pass) << kRadixBits) + ((x >> (pass * kRadixBits)) & kRadixMask)];
    }
  }
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = pass * kRadixBits;
    size_t* start = counts.data() + (static_cast<size_t>(pass) << kRadixBits);
    // A digit that all keys share leaves the order as it is.
    if (start[(key(items[0]) >> shift) & kRadixMask] == n) continue;
    size_t sum = 0;
    for (size_t d = 0; d <= kRadixMask; ++d) sum += std::exchange(start[d], sum);
    for (size_t k = 0; k < n; ++k) out[start[(key(items[k]) >> shift) & kRadixMask]++] = items[k];
    items.swap(out);
  }
}

// Ids 0 .. n - 1 by decreasing key (finite, >= 0), ties by id.
LargeVector<Index> sorted_desc(const double* cost, size_t n) {
  LargeVector<Index> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (n < kRadixMin) {
    std::sort(order.begin(), order.end(),
              [cost](Index a, Index b) { return cost[a] != cost[b] ? cost[a] > cost[b] : a < b; });
    return order;
  }
  // A stable sort from the ids in order keeps ties by id. Key and id travel together, so that each pass
  // scatters one stream rather than two.
  struct Keyed {
    uint64_t key;
    Index id;
  };
  LargeVector<Keyed> keyed(n);
  for (size_t p = 0; p < n; ++p) keyed[p] = Keyed{desc_key(cost[p]), static_cast<Index>(p)};
  radix_sort(keyed, [](const Keyed& k) { return k.key; });
  for (size_t k = 0; k < n; ++k) order[k] = keyed[k].id;
  return order;
}

// epoch_of the packs of `order` sorted by decreasing cost (one cost part): every world_size-th cost of that
// order, summed as epoch_of sums them, from the costs alone, without the order itself.
double sorted_epoch(const LargeVector<Index>& order, const PackLoads& totals, size_t w) {
  const size_t n = order.size();
  LargeVector<uint64_t> keys(n);
  for (size_t k = 0; k < n; ++k) keys[k] = desc_key(totals.cost[static_cast<size_t>(order[k])]);
  if (n < kRadixMin) {
    std::sort(keys.begin(), keys.end());
  } else {
    radix_sort(keys, [](uint64_t key) { return key; });
  }
  double epoch = 0.0;
  for (size_t s = 0; s + w <= n; s += w) epoch += std::max(0.0, cost_of_key(keys[s]));
  return epoch;
}

}  // namespace

void fill_pack_cost(const Packs& packs, const SampleCosts& costs, Index p, PackLoads& totals, double* costliest) {
  const Index* first = packs.samples.data() + packs.offsets[static_cast<size_t>(p)];
  const Index* last = packs.samples.data() + packs.offsets[static_cast<size_t>(p) + 1];
  double top = 0.0;
  if (costs.dims == 1) {
    double c = 0.0;
    for (const Index* id = first; id != last; ++id) {
      const double x = costs.cost[*id];
      c += x;
      top = std::max(top, x);
    }
    totals.cost[static_cast<size_t>(p)] = c + costs.per_pack;
  } else {  // two parts (SampleCosts)
    double c0 = 0.0, c1 = 0.0;
    for (const Index* id = first; id != last; ++id) {
      const double x0 = costs.cost[2 * *id], x1 = costs.cost[2 * *id + 1];
      c0 += x0;
      c1 += x1;
      top = std::max(top, x0 + x1);
    }
    totals.cost[static_cast<size_t>(2 * p)] = c0;
    totals.cost[static_cast<size_t>(2 * p + 1)] = c1 + costs.per_pack;
  }
  if (costliest != nullptr) *costliest = top;
}

void fill_pack_costs(const Packs& packs, const SampleCosts& costs, PackLoads& totals, LargeVector<double>* costliest) {
  const Index n = packs.size();
  totals.cost_dims = costs.dims;
  totals.cost.resize(static_cast<size_t>(n * costs.dims));
  if (costliest != nullptr) costliest->resize(static_cast<size_t>(n));
  // The samples are read in pack order, their costs at random: the costs of pack p + kPacksAhead are asked
  // for while pack p is summed, so that the reads overlap instead of waiting one after another.
  for (Index p = 0; p < n; ++p) {
    if (p + kPacksAhead < n) {
      const size_t ahead = static_cast<size_t>(p + kPacksAhead);
      for (Index i = packs.offsets[ahead]; i < packs.offsets[ahead + 1]; ++i) {
        prefetch(costs.cost + packs.samples[static_cast<size_t>(i)] * costs.dims);
      }
    }
    fill_pack_cost(packs, costs, p, totals, costliest == nullptr ? nullptr : costliest->data() + p);
  }
}

Index split_to_whole_steps(Packs& packs, PackLoads& totals, LargeVector<double>& costliest, const Loads& loads,
                           const SampleCosts& costs, Index world_size) {
  const Index n = packs.size();
  const Index need = (world_size - n % world_size) % world_size;
  if (need == 0) return 0;
  // A split pack's new half costs at most its cost less its costliest sample, and at most half its cost: the
  // packs whose new half can cost the most are split, so that the new packs are no lighter than need be (a
  // pack of one costly sample and a light one would give a nearly empty pack, and the cheapest step, which
  // waits for its costliest pack, would be one of such packs and a few full ones). One pass over the packs
  // keeps the `need` largest halves, ties by pack id, in a heap whose front is the one to give up first.
  auto better = [](const std::pair<double, Index>& a, const std::pair<double, Index>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::vector<std::pair<double, Index>> halves;
  halves.reserve(static_cast<size_t>(need) + 1);
  for (Index p = 0; p < n; ++p) {
    if (packs.offsets[static_cast<size_t>(p) + 1] - packs.offsets[static_cast<size_t>(p)] < 2) continue;
    const double pack_cost = totals.cost_sum(p) - costs.per_pack;
    const std::pair<double, Index> half{std::min(0.5 * pack_cost, pack_cost - costliest[static_cast<size_t>(p)]), p};
    if (static_cast<Index>(halves.size()) == need && !better(half, halves.front())) continue;
    halves.push_back(half);
    std::push_heap(halves.begin(), halves.end(), better);
    if (static_cast<Index>(halves.size()) > need) {
      std::pop_heap(halves.begin(), halves.end(), better);
      halves.pop_back();
    }
  }
  if (static_cast<Index>(halves.size()) < need) return 0;
  std::vector<Index> candidates;
  for (const auto& h : halves) candidates.push_back(h.second);
  std::sort(candidates.begin(), candidates.end());
  // Each split pack keeps its first half; the second halves become packs n, n + 1, ... in candidate order.
  std::vector<std::vector<Index>> first(static_cast<size_t>(need)), second(static_cast<size_t>(need));
  std::vector<Index> members;
  for (Index k = 0; k < need; ++k) {
    const size_t p = static_cast<size_t>(candidates[static_cast<size_t>(k)]);
    members.assign(packs.samples.begin() + packs.offsets[p], packs.samples.begin() + packs.offsets[p + 1]);
    std::sort(members.begin(), members.end(), [&](Index a, Index b) {
      const double ca = costs.total(a), cb = costs.total(b);
      return ca != cb ? ca > cb : a < b;
    });
    double half[2] = {0.0, 0.0};
    for (const Index id : members) {
      // the cheaper half so far, on a tie the smaller one: neither half is left empty
      const size_t size0 = first[static_cast<size_t>(k)].size(), size1 = second[static_cast<size_t>(k)].size();
      const int h = half[1] < half[0] || (half[1] == half[0] && size1 < size0) ? 1 : 0;
      (h == 0 ? first : second)[static_cast<size_t>(k)].push_back(id);
      half[h] += costs.total(id);
    }
  }
  // In place: the packs after a split one move down by the samples taken out so far (the second halves,
  // appended at the end), each split pack keeping its first half.
  Index removed = 0, from = 0;
  // Packs [from, to): the start of `from` has moved already, the others' offsets are as they were.
  auto shift_unchanged = [&](Index to) {
    if (from == to) return;
    const auto begin = packs.samples.begin() + (packs.offsets[static_cast<size_t>(from)] + removed);
    std::copy(begin, packs.samples.begin() + packs.offsets[static_cast<size_t>(to)], begin - removed);
    for (Index q = from + 1; q <= to; ++q) packs.offsets[static_cast<size_t>(q)] -= removed;
  };
  for (Index k = 0; k < need; ++k) {
    const Index p = candidates[static_cast<size_t>(k)];
    shift_unchanged(p);
    const std::vector<Index>& kept = first[static_cast<size_t>(k)];
    std::copy(kept.begin(), kept.end(), packs.samples.begin() + packs.offsets[static_cast<size_t>(p)]);
    removed += static_cast<Index>(second[static_cast<size_t>(k)].size());
    packs.offsets[static_cast<size_t>(p) + 1] -= removed;
    from = p + 1;
  }
  shift_unchanged(n);
  packs.samples.resize(packs.samples.size() - static_cast<size_t>(removed));
  for (const std::vector<Index>& half : second) {
    packs.samples.insert(packs.samples.end(), half.begin(), half.end());
    packs.close_pack();
  }
  totals.vit.resize(static_cast<size_t>(n + need));
  totals.llm.resize(static_cast<size_t>(n + need));
  totals.cost.resize(static_cast<size_t>((n + need) * costs.dims));
  costliest.resize(static_cast<size_t>(n + need));
  for (Index k = 0; k < need; ++k) {
    for (const Index p : {candidates[static_cast<size_t>(k)], n + k}) {
      int64_t v = 0, t = 0;
      for (Index i = packs.offsets[static_cast<size_t>(p)]; i < packs.offsets[static_cast<size_t>(p) + 1]; ++i) {
        v += loads.vit[packs.samples[static_cast<size_t>(i)]];
        t += loads.llm[packs.samples[static_cast<size_t>(i)]];
      }
      totals.vit[static_cast<size_t>(p)] = v;
      totals.llm[static_cast<size_t>(p)] = t;
      fill_pack_cost(packs, costs, p, totals, &costliest[static_cast<size_t>(p)]);
    }
  }
  return need;
}

LargeVector<Index> cost_order(const PackLoads& totals, Index world_size) {
  const int dims = totals.cost_dims;
  const size_t n = totals.cost.size() / static_cast<size_t>(dims);
  if (dims == 1) return sorted_desc(totals.cost.data(), n);
  // Two parts: sorted by the part whose spread over the packs (5th to 95th percentile, relative to the mean)
  // is wider, then blocks of b steps re-sorted by the other. A step then spans about b / steps of the first
  // part's spread and 1 / b of the second's; b = sqrt(steps * spread_2 / spread_1) makes the two equal.
  double spread[2];
  std::vector<double> part(n);
  for (int d = 0; d < 2; ++d) {
    double sum = 0.0;
    for (size_t p = 0; p < n; ++p) sum += part[p] = totals.cost[2 * p + static_cast<size_t>(d)];
    std::sort(part.begin(), part.end());
    const double lo = part[static_cast<size_t>(0.05 * static_cast<double>(n - 1))];
    const double hi = part[static_cast<size_t>(0.95 * static_cast<double>(n - 1))];
    spread[d] = sum > 0.0 ? (hi - lo) * static_cast<double>(n) / sum : 0.0;
  }
  const int first = spread[1] > spread[0] ? 1 : 0;
  const double steps = std::max(1.0, static_cast<double>(n / static_cast<size_t>(world_size)));
  const double blocks = spread[first] > 0.0 ? std::sqrt(steps * spread[1 - first] / spread[first]) : steps;
  const size_t block =
      static_cast<size_t>(std::min(steps, std::max(1.0, std::round(blocks)))) * static_cast<size_t>(world_size);
  LargeVector<double> key(n);
  for (size_t p = 0; p < n; ++p) key[p] = totals.cost[2 * p + static_cast<size_t>(first)];
  LargeVector<Index> order = sorted_desc(key.data(), n);
  for (size_t from = 0; from < n; from += block) {
    const size_t to = std::min(n, from + block);
    std::sort(order.begin() + static_cast<std::ptrdiff_t>(from), order.begin() + static_cast<std::ptrdiff_t>(to),
              [&](Index a, Index b) {
                const double ca = totals.cost[2 * static_cast<size_t>(a) + static_cast<size_t>(1 - first)];
                const double cb = totals.cost[2 * static_cast<size_t>(b) + static_cast<size_t>(1 - first)];
                return ca != cb ? ca > cb : a < b;
              });
  }
  return order;
}

}  // namespace omnibal

namespace omnibal {

Index lift_stuck_packs(LargeVector<Index>& order, const PackLoads& totals, const LargeVector<double>& costliest,
                       const SampleCosts& costs, Index world_size) {
  if (totals.cost_dims != 1 || world_size < 2) return 0;
  const size_t w = static_cast<size_t>(world_size);
  const size_t steps = order.size() / w;
  if (steps < 2) return 0;
  const Index n = static_cast<Index>(totals.cost.size());
  // A pack's floor: its costliest sample, what exchanges of its other samples cannot take out.
  auto floor = [&](Index p) { return costliest[static_cast<size_t>(p)] + costs.per_pack; };
  std::vector<Index> uses(static_cast<size_t>(n), 0);
  for (const Index p : order) ++uses[static_cast<size_t>(p)];
  auto step_sum = [&](size_t s) {
    double sum = 0.0;
    for (size_t k = s * w; k < (s + 1) * w; ++k) sum += totals.cost[static_cast<size_t>(order[k])];
    return sum;
  };
  std::vector<char> lifted(static_cast<size_t>(n), 0);
  Index moved = 0;
  double above = step_sum(0);
  for (size_t s = 1; s < steps; ++s) {
    double sum = step_sum(s);
    // the cheapest packs of step s - 1 that may come down: scanned from its end (packs sorted by cost)
    size_t down = s * w;
    for (size_t k = s * w; k < (s + 1) * w; ++k) {
      const Index p = order[k];
      if (uses[static_cast<size_t>(p)] != 1) continue;
      const double limit = (1.0 + kRefineTolerance) * sum / static_cast<double>(w);
      if (!(totals.cost[static_cast<size_t>(p)] > limit) || !(floor(p) > limit)) continue;
      // the cheapest pack of step s - 1 that is not stuck here, nor lifted into it
      while (down > (s - 1) * w) {
        const Index q = order[down - 1];
        if (uses[static_cast<size_t>(q)] == 1 && !lifted[static_cast<size_t>(q)] && floor(q) <= limit) break;
        --down;
      }
      if (down == (s - 1) * w) break;
      // The pack brought down must not cost more over the sticking one than that one does over the mean: this
      // step's exchanges then have at most twice that excess to place, in a pack whose samples can move.
      const double cost_p = totals.cost[static_cast<size_t>(p)];
      if (totals.cost[static_cast<size_t>(order[down - 1])] - cost_p > cost_p - sum / static_cast<double>(w)) continue;
      const Index q = order[--down];
      const double delta = totals.cost[static_cast<size_t>(q)] - cost_p;
      std::swap(order[k], order[down]);
      lifted[static_cast<size_t>(p)] = 1;
      sum += delta;
      above -= delta;
      ++moved;
    }
    above = sum;
  }
  return moved;
}

}  // namespace omnibal

namespace omnibal {

namespace {

constexpr double kNoCost = std::numeric_limits<double>::infinity();

}  // namespace

double epoch_of(const LargeVector<Index>& order, const PackLoads& totals, Index world_size) {
  const size_t w = static_cast<size_t>(world_size);
  double epoch = 0.0;
  for (size_t s = 0; s + w <= order.size(); s += w) {
    double top = 0.0;
    for (size_t k = s; k < s + w; ++k) top = std::max(top, totals.cost_sum(order[k]));
    epoch += top;
  }
  return epoch;
}

double ideal_of(const LargeVector<Index>& order, const PackLoads& totals, Index world_size) {
  double total = 0.0;
  for (const Index p : order) total += totals.cost_sum(p);
  return total / static_cast<double>(world_size);
}

Index settle_steps(LargeVector<Index>& order, const PackLoads& totals, Index world_size) {
  if (totals.cost_dims != 1 || world_size < 2) return 0;
  const size_t w = static_cast<size_t>(world_size);
  const size_t steps = order.size() / w;
  std::vector<Index> uses(totals.cost.size(), 0);
  for (const Index p : order) ++uses[static_cast<size_t>(p)];
  auto cost = [&](Index p) { return totals.cost[static_cast<size_t>(p)]; };
  auto by_cost = [&](Index a, Index b) { return cost(a) != cost(b) ? cost(a) < cost(b) : a < b; };
  Index swapped = 0;
  for (size_t s = 1; s < steps; ++s) {
    const auto above = order.begin() + static_cast<std::ptrdiff_t>((s - 1) * w);
    const auto here = above + static_cast<std::ptrdiff_t>(w);
    double lightest_above = kNoCost, heaviest_here = 0.0;
    for (size_t k = 0; k < w; ++k) {
      lightest_above = std::min(lightest_above, cost(*(above + static_cast<std::ptrdiff_t>(k))));
      heaviest_here = std::max(heaviest_here, cost(*(here + static_cast<std::ptrdiff_t>(k))));
    }
    if (!(heaviest_here > lightest_above)) continue;  // nothing to trade
    std::sort(above, here, by_cost);                  // lightest first
    std::sort(here, here + static_cast<std::ptrdiff_t>(w), [&](Index a, Index b) { return by_cost(b, a); });
    const double top = cost(*(here - 1));
    size_t i = 0, j = 0;
    while (i < w && j < w) {
      Index& light = *(above + static_cast<std::ptrdiff_t>(i));
      Index& heavy = *(here + static_cast<std::ptrdiff_t>(j));
      if (uses[static_cast<size_t>(light)] != 1) {
        ++i;
        continue;
      }
      if (uses[static_cast<size_t>(heavy)] != 1) {
        ++j;
        continue;
      }
      if (!(cost(heavy) > cost(light) && cost(heavy) <= top)) break;
      std::swap(light, heavy);
      ++i, ++j, ++swapped;
    }
  }
  // The same packs sorted by cost and cut into steps, where that is cheaper (the order itself is only built then).
  if (!(sorted_epoch(order, totals, w) < epoch_of(order, totals, world_size))) return swapped;
  LargeVector<double> slot_cost(order.size());
  for (size_t k = 0; k < order.size(); ++k) slot_cost[k] = cost(order[k]);
  LargeVector<Index> sorted = sorted_desc(slot_cost.data(), order.size());
  for (Index& k : sorted) k = order[static_cast<size_t>(k)];
  order.swap(sorted);
  return swapped;
}

}  // namespace omnibal
