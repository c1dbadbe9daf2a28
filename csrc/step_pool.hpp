// The packs one step refinement works on (step_refine.cpp): each pack's samples sorted by cost, all the pool's
// samples sorted by cost and by ViT load then cost with the pack that holds each, and the exchanges that keep
// them and the packs' totals in step; PackContents, the packs' samples as refinements leave them.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "buffers.hpp"
#include "grouping.hpp"
#include "index.hpp"
#include "loads.hpp"

namespace omnibal {

constexpr double kInf = std::numeric_limits<double>::infinity();

// At most this many cost parts (SampleCosts::dims): the step's time, or the ViT's and the LLM's.
constexpr int kMaxDims = 2;

// Index of the smallest key among n, with updates in O(log n); ties go to the lower index.
class ArgMin {
 public:
  void reset(int64_t n);
  void set(int64_t i, double key);
  // All n keys at once (reset and set in O(n)).
  void build(const std::vector<double>& keys);
  int64_t best() const { return node_[1]; }  // -1 when every key is infinite (or n is 0)

 private:
  int64_t pick(int64_t a, int64_t b) const;
  int64_t size_ = 1;
  std::vector<double> key_;
  std::vector<int64_t> node_;
};

struct Entry {
  double cost[kMaxDims];
  int64_t vit, llm;
  Index id;
  Index local;  // the sample's place in the pool (StepPool's owner of each sample)
};

// Orders entries by cost part d, ties by id.
struct Cheaper {
  int d;
  bool operator()(const Entry& a, const Entry& b) const {
    return a.cost[d] != b.cost[d] ? a.cost[d] < b.cost[d] : a.id < b.id;
  }
};

// First position in `e` (sorted by cost part d) whose part d is >= c.
int64_t lower_cost(const std::vector<Entry>& e, int d, double c);
int64_t log2_ceil(size_t n);

// The samples of every pack as the refinements leave them: a refined pack's samples are stored anew (the
// latest copy counts), the others read from the packs given.
class PackContents {
 public:
  explicit PackContents(const Packs& packs) : packs_(packs) {}
  const Index* begin(Index p) const;
  Index size(Index p) const;
  void store(Index p, const std::vector<Entry>& samples);
  void store(Index p, const std::vector<Index>& samples);
  bool changed(Index p) const { return !start_.empty() && start_[static_cast<size_t>(p)] >= 0; }
  // The packs with every stored pack's samples in place of its original ones.
  Packs rebuild() const;

 private:
  size_t open(Index p);  // pack p's samples stored from here on: its index

  const Packs& packs_;
  std::vector<Index> start_, size_, stored_;
};

// The pool of one refinement: its packs' samples, sorted, and the exchanges between them.
class StepPool {
 public:
  StepPool(PackLoads& totals, const Loads& loads, const SampleCosts& costs, Capacity cap)
      : totals_(totals), loads_(loads), costs_(costs), cap_(cap), dims_(costs.dims) {}

  // Reads the samples of the packs ids[k] that are not frozen[k].
  void load(const std::vector<Index>& ids, const std::vector<char>& frozen, const PackContents& contents);

  Index id(int64_t k) const { return (*ids_)[static_cast<size_t>(k)]; }
  bool frozen(int64_t k) const { return (*frozen_)[static_cast<size_t>(k)] != 0; }
  // Pack k's samples sorted by cost part d.
  const std::vector<Entry>& content(int64_t k, int d) const {
    return content_[static_cast<size_t>(k)][static_cast<size_t>(d)];
  }
  // Whether y may replace x in pack a and x replace y in pack b within both capacities.
  bool swap_fits(int64_t a, int64_t b, const Entry& x, const Entry& y) const;

  // Calls fn(y, pack holding y) for the `around` samples on each side of cost `target` in part d among all the
  // pool's; returns the work spent.
  template <typename Fn>
  int64_t near_cost(int d, double target, int64_t around, Fn&& fn) const {
    const std::vector<Entry>& all = all_[static_cast<size_t>(d)];
    const int64_t n = static_cast<int64_t>(all.size()), at = lower_cost(all, d, target);
    for (int64_t j = std::max<int64_t>(0, at - around); j < std::min(n, at + around); ++j) {
      fn(all[static_cast<size_t>(j)], owner_[static_cast<size_t>(all[static_cast<size_t>(j)].local)]);
    }
    return log2_ceil(all.size()) + 2 * around;
  }

  // The same within each group of one ViT load: the `groups` groups at or above `vit` (up to `vit_high`) and
  // the `groups` below it (down to `vit` less the most ViT room a pool's pack had when loaded), nearest first;
  // returns the work spent.
  template <typename Fn>
  int64_t near_vit_and_cost(int d, int64_t vit, int64_t vit_high, double target, int64_t groups, int64_t around,
                            Fn&& fn) const {
    const std::vector<Entry>& v = by_vit_[static_cast<size_t>(d)];
    const int64_t n = static_cast<int64_t>(v.size());
    int64_t work = 0;
    auto search = [&](int64_t from, int64_t to) {
      const int64_t at = cost_in_group(d, from, to, target);
      for (int64_t j = std::max(from, at - around); j < std::min(to, at + around); ++j) {
        fn(v[static_cast<size_t>(j)], owner_[static_cast<size_t>(v[static_cast<size_t>(j)].local)]);
      }
      work += 3 * log2_ceil(v.size()) + 2 * around;
    };
    const int64_t mid = vit_start(d, vit);
    int64_t pos = mid;
    for (int64_t g = 0; g < groups && pos < n && v[static_cast<size_t>(pos)].vit <= vit_high; ++g) {
      const int64_t end = vit_start(d, v[static_cast<size_t>(pos)].vit + 1);
      search(pos, end);
      pos = end;
    }
    pos = mid;
    for (int64_t g = 0; g < groups && pos > 0 && v[static_cast<size_t>(pos - 1)].vit >= vit - max_vit_room_; ++g) {
      const int64_t begin = vit_start(d, v[static_cast<size_t>(pos - 1)].vit);
      search(begin, pos);
      pos = begin;
    }
    return work;
  }

  // x leaves pack a for pack b and y (if not null) comes back: the sorted copies, the owners and both packs'
  // totals follow. Returns the work spent.
  int64_t exchange(int64_t a, int64_t b, const Entry& x, const Entry* y);

 private:
  int64_t vit_start(int d, int64_t vit) const;  // first place in by_vit_[d] whose ViT load is >= vit
  int64_t cost_in_group(int d, int64_t from, int64_t to, double target) const;
  void remove(int64_t k, const Entry& e);
  void insert(int64_t k, const Entry& e);
  int64_t replace(int64_t k, const Entry& out, const Entry& in);

  PackLoads& totals_;
  const Loads& loads_;
  const SampleCosts& costs_;
  Capacity cap_;
  int dims_;
  const std::vector<Index>* ids_ = nullptr;
  const std::vector<char>* frozen_ = nullptr;
  std::vector<std::array<std::vector<Entry>, kMaxDims>> content_;
  std::array<std::vector<Entry>, kMaxDims> all_, by_vit_;
  std::vector<int64_t> owner_;
  int64_t max_vit_room_ = 0;
  std::vector<std::pair<uint64_t, Index>> keys_, keys_scratch_;
};

}  // namespace omnibal
