// fill_pack_costs, split_to_whole_steps and cost_order (step_balance.hpp): the packs and their order before the
// exchanges of refine_steps.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "step_balance.hpp"

namespace omnibal {
namespace {

// cost_order sorts by 16-bit digits (4 passes over the packs, counts that stay in cache), and many packs
// only: below kRadixMin packs a comparison sort costs less than the passes' counts.
constexpr int kRadixBits = 16;
constexpr uint64_t kRadixMask = (uint64_t{1} << kRadixBits) - 1;
constexpr size_t kRadixMin = size_t{1} << 16;

}  // namespace

void fill_pack_costs(const Packs& packs, const SampleCosts& costs, PackLoads& totals) {
  const Index n = packs.size();
  totals.cost.resize(static_cast<size_t>(n));
  for (Index p = 0; p < n; ++p) {
    double c = 0.0;
    for (Index i = packs.offsets[static_cast<size_t>(p)]; i < packs.offsets[static_cast<size_t>(p) + 1]; ++i) {
      c += costs.cost[packs.samples[static_cast<size_t>(i)]];
    }
    totals.cost[static_cast<size_t>(p)] = c + costs.per_pack;
  }
}

Index split_to_whole_steps(Packs& packs, PackLoads& totals, const Loads& loads, const SampleCosts& costs,
                           Index world_size) {
  const Index n = packs.size();
  const Index need = (world_size - n % world_size) % world_size;
  if (need == 0) return 0;
  std::vector<Index> candidates;
  for (Index p = 0; p < n; ++p) {
    if (packs.offsets[static_cast<size_t>(p) + 1] - packs.offsets[static_cast<size_t>(p)] >= 2) candidates.push_back(p);
  }
  if (static_cast<Index>(candidates.size()) < need) return 0;
  auto costlier = [&](Index a, Index b) {
    const double ca = totals.cost[static_cast<size_t>(a)], cb = totals.cost[static_cast<size_t>(b)];
    return ca != cb ? ca > cb : a < b;
  };
  std::nth_element(candidates.begin(), candidates.begin() + (need - 1), candidates.end(), costlier);
  candidates.resize(static_cast<size_t>(need));
  std::sort(candidates.begin(), candidates.end());
  // Each split pack keeps its first half; the second halves become packs n, n + 1, ... in candidate order.
  std::vector<std::vector<Index>> first(static_cast<size_t>(need)), second(static_cast<size_t>(need));
  std::vector<Index> members;
  for (Index k = 0; k < need; ++k) {
    const size_t p = static_cast<size_t>(candidates[static_cast<size_t>(k)]);
    members.assign(packs.samples.begin() + packs.offsets[p], packs.samples.begin() + packs.offsets[p + 1]);
    std::sort(members.begin(), members.end(), [&](Index a, Index b) {
      return costs.cost[a] != costs.cost[b] ? costs.cost[a] > costs.cost[b] : a < b;
    });
    double half[2] = {0.0, 0.0};
    for (const Index id : members) {
      const int h = half[1] < half[0] ? 1 : 0;
      (h == 0 ? first : second)[static_cast<size_t>(k)].push_back(id);
      half[h] += costs.cost[id];
    }
  }
  Packs out;
  out.samples.reserve(packs.samples.size());
  out.offsets.reserve(static_cast<size_t>(n + need) + 1);
  size_t next = 0;
  for (Index p = 0; p < n; ++p) {
    if (next < candidates.size() && candidates[next] == p) {
      out.samples.insert(out.samples.end(), first[next].begin(), first[next].end());
      ++next;
    } else {
      out.samples.insert(out.samples.end(), packs.samples.begin() + packs.offsets[static_cast<size_t>(p)],
                         packs.samples.begin() + packs.offsets[static_cast<size_t>(p) + 1]);
    }
    out.close_pack();
  }
  for (const std::vector<Index>& half : second) {
    out.samples.insert(out.samples.end(), half.begin(), half.end());
    out.close_pack();
  }
  packs = std::move(out);
  totals.vit.resize(static_cast<size_t>(n + need));
  totals.llm.resize(static_cast<size_t>(n + need));
  for (Index k = 0; k < need; ++k) {
    for (const Index p : {candidates[static_cast<size_t>(k)], n + k}) {
      int64_t v = 0, t = 0;
      for (Index i = packs.offsets[static_cast<size_t>(p)]; i < packs.offsets[static_cast<size_t>(p) + 1]; ++i) {
        v += loads.vit[packs.samples[static_cast<size_t>(i)]];
        t += loads.llm[packs.samples[static_cast<size_t>(i)]];
      }
      totals.vit[static_cast<size_t>(p)] = v;
      totals.llm[static_cast<size_t>(p)] = t;
    }
  }
  fill_pack_costs(packs, costs, totals);
  return need;
}

LargeVector<Index> cost_order(const PackLoads& totals) {
  const size_t n = totals.cost.size();
  LargeVector<Index> order(n);
  std::iota(order.begin(), order.end(), 0);
  const double* cost = totals.cost.data();
  if (n < kRadixMin) {
    std::sort(order.begin(), order.end(),
              [cost](Index a, Index b) { return cost[a] != cost[b] ? cost[a] > cost[b] : a < b; });
    return order;
  }
  // Costs are finite and >= 0, so their bit patterns order as they do; complemented, an increasing stable
  // radix sort from the ids in order gives decreasing cost, ties by id.
  LargeVector<uint64_t> key(n), key_out(n);
  for (size_t p = 0; p < n; ++p) {
    uint64_t bits;
    std::memcpy(&bits, cost + p, sizeof bits);
    key[p] = ~bits;
  }
  LargeVector<Index> out(n);
  std::vector<size_t> start(size_t{1} << kRadixBits);
  for (int shift = 0; shift < 64; shift += kRadixBits) {
    std::fill(start.begin(), start.end(), 0);
    for (size_t k = 0; k < n; ++k) ++start[(key[k] >> shift) & kRadixMask];
    size_t sum = 0;
    for (size_t& s : start) sum += std::exchange(s, sum);
    for (size_t k = 0; k < n; ++k) {
      const size_t to = start[(key[k] >> shift) & kRadixMask]++;
      out[to] = order[k];
      key_out[to] = key[k];
    }
    order.swap(out);
    key.swap(key_out);
  }
  return order;
}

}  // namespace omnibal
