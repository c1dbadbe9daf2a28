// StepPool and PackContents (step_pool.hpp).
#include "step_pool.hpp"

#include <algorithm>
#include <cstring>

namespace omnibal {
namespace {

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

// Orders entries by ViT load, then cost part d, then id.
struct ByVit {
  int d;
  bool operator()(const Entry& a, const Entry& b) const {
    if (a.vit != b.vit) return a.vit < b.vit;
    return a.cost[d] != b.cost[d] ? a.cost[d] < b.cost[d] : a.id < b.id;
  }
};

}  // namespace

void ArgMin::reset(int64_t n) {
  size_ = 1;
  while (size_ < n) size_ <<= 1;
  key_.assign(static_cast<size_t>(size_), kInf);
  node_.assign(static_cast<size_t>(2 * size_), -1);
}

void ArgMin::build(const std::vector<double>& keys) {
  reset(static_cast<int64_t>(keys.size()));
  std::copy(keys.begin(), keys.end(), key_.begin());
  for (size_t i = 0; i < keys.size(); ++i)
    node_[static_cast<size_t>(size_) + i] = keys[i] < kInf ? static_cast<int64_t>(i) : -1;
  for (int64_t x = size_ - 1; x >= 1; --x)
    node_[static_cast<size_t>(x)] = pick(node_[static_cast<size_t>(2 * x)], node_[static_cast<size_t>(2 * x + 1)]);
}

void ArgMin::set(int64_t i, double key) {
  key_[static_cast<size_t>(i)] = key;
  int64_t x = i + size_;
  node_[static_cast<size_t>(x)] = key < kInf ? i : -1;
  for (x >>= 1; x >= 1; x >>= 1)
    node_[static_cast<size_t>(x)] = pick(node_[static_cast<size_t>(2 * x)], node_[static_cast<size_t>(2 * x + 1)]);
}

int64_t ArgMin::pick(int64_t a, int64_t b) const {
  if (a < 0) return b;
  if (b < 0) return a;
  return key_[static_cast<size_t>(b)] < key_[static_cast<size_t>(a)] ? b : a;
}

int64_t lower_cost(const std::vector<Entry>& e, int d, double c) {
  return std::lower_bound(e.begin(), e.end(), c, [d](const Entry& x, double v) { return x.cost[d] < v; }) - e.begin();
}

int64_t log2_ceil(size_t n) {
  int64_t k = 1;
  while ((size_t{1} << k) < n) ++k;
  return k;
}

const Index* PackContents::begin(Index p) const {
  const size_t q = static_cast<size_t>(p);
  return changed(p) ? stored_.data() + start_[q] : packs_.samples.data() + packs_.offsets[q];
}

Index PackContents::size(Index p) const {
  const size_t q = static_cast<size_t>(p);
  return changed(p) ? size_[q] : packs_.offsets[q + 1] - packs_.offsets[q];
}

size_t PackContents::open(Index p) {
  if (start_.empty()) {
    start_.assign(static_cast<size_t>(packs_.size()), -1);
    size_.assign(static_cast<size_t>(packs_.size()), 0);
  }
  const size_t q = static_cast<size_t>(p);
  start_[q] = static_cast<Index>(stored_.size());
  return q;
}

void PackContents::store(Index p, const std::vector<Entry>& samples) {
  const size_t q = open(p);
  for (const Entry& e : samples) stored_.push_back(e.id);
  size_[q] = static_cast<Index>(samples.size());
}

void PackContents::store(Index p, const std::vector<Index>& samples) {
  const size_t q = open(p);
  stored_.insert(stored_.end(), samples.begin(), samples.end());
  size_[q] = static_cast<Index>(samples.size());
}

Packs PackContents::rebuild() const {
  Packs out;
  out.samples.reserve(packs_.samples.size());
  out.offsets.reserve(packs_.offsets.size());
  for (Index p = 0; p < packs_.size(); ++p) {
    const Index* first = begin(p);
    out.samples.insert(out.samples.end(), first, first + size(p));
    out.close_pack();
  }
  return out;
}

void StepPool::load(const std::vector<Index>& ids, const std::vector<char>& frozen, const PackContents& contents) {
  ids_ = &ids;
  frozen_ = &frozen;
  const size_t n = ids.size();
  if (content_.size() < n) content_.resize(n);
  owner_.clear();
  all_[0].clear();
  max_vit_room_ = 0;
  for (size_t k = 0; k < n; ++k) {
    if (frozen[k]) continue;
    max_vit_room_ = std::max(max_vit_room_, cap_.vit - totals_.vit[static_cast<size_t>(ids[k])]);
    // Sorted by part 0 as (cost, id) pairs of integers, a third of an entry's size, then the entries filled in
    // order. Costs are finite and >= 0, so their bit patterns order as they do.
    const Index* samples = contents.begin(ids[k]);
    const Index size = contents.size(ids[k]);
    keys_.clear();
    for (Index i = 0; i < size; ++i) {
      const double cost = costs_.cost[samples[i] * dims_] + 0.0;  // -0.0 as +0.0
      uint64_t bits;
      std::memcpy(&bits, &cost, sizeof bits);
      keys_.push_back({bits, samples[i]});
    }
    sort_keyed(keys_, keys_scratch_);
    std::vector<Entry>& e = content_[k][0];
    e.clear();
    for (const auto& key : keys_) {
      const Index id = key.second;
      Entry x{{0.0, 0.0}, loads_.vit[id], loads_.llm[id], id, static_cast<Index>(owner_.size())};
      for (int d = 0; d < dims_; ++d) x.cost[d] = costs_.cost[id * dims_ + d];
      e.push_back(x);
      owner_.push_back(static_cast<int64_t>(k));
    }
    all_[0].insert(all_[0].end(), e.begin(), e.end());
    for (int d = 1; d < dims_; ++d) {
      std::vector<Entry>& sorted = content_[k][static_cast<size_t>(d)];
      sorted = e;
      std::sort(sorted.begin(), sorted.end(), Cheaper{d});
    }
  }
  for (int d = 0; d < dims_; ++d) {
    const size_t q = static_cast<size_t>(d);
    if (d > 0) all_[q] = all_[0];
    by_vit_[q] = all_[0];
    std::sort(all_[q].begin(), all_[q].end(), Cheaper{d});
    std::sort(by_vit_[q].begin(), by_vit_[q].end(), ByVit{d});
  }
}

bool StepPool::swap_fits(int64_t a, int64_t b, const Entry& x, const Entry& y) const {
  const size_t pa = static_cast<size_t>(id(a)), pb = static_cast<size_t>(id(b));
  const int64_t dv = y.vit - x.vit, dt = y.llm - x.llm;
  return dv <= cap_.vit - totals_.vit[pa] && -dv <= cap_.vit - totals_.vit[pb] && dt <= cap_.llm - totals_.llm[pa] &&
         -dt <= cap_.llm - totals_.llm[pb];
}

int64_t StepPool::vit_start(int d, int64_t vit) const {
  const std::vector<Entry>& v = by_vit_[static_cast<size_t>(d)];
  return std::lower_bound(v.begin(), v.end(), vit, [](const Entry& e, int64_t value) { return e.vit < value; }) -
         v.begin();
}

int64_t StepPool::cost_in_group(int d, int64_t from, int64_t to, double target) const {
  const std::vector<Entry>& v = by_vit_[static_cast<size_t>(d)];
  return std::lower_bound(v.begin() + from, v.begin() + to, target,
                          [d](const Entry& e, double c) { return e.cost[d] < c; }) -
         v.begin();
}

void StepPool::remove(int64_t k, const Entry& e) {
  for (int d = 0; d < dims_; ++d) {
    std::vector<Entry>& v = content_[static_cast<size_t>(k)][static_cast<size_t>(d)];
    v.erase(std::lower_bound(v.begin(), v.end(), e, Cheaper{d}));
  }
}

void StepPool::insert(int64_t k, const Entry& e) {
  for (int d = 0; d < dims_; ++d) {
    std::vector<Entry>& v = content_[static_cast<size_t>(k)][static_cast<size_t>(d)];
    v.insert(std::lower_bound(v.begin(), v.end(), e, Cheaper{d}), e);
  }
}

// Replaces `out` by `in` in every sorted copy of pack k's samples, shifting only the entries between their places
// (a swap exchanges samples of near costs: few entries, where an erase and an insert move half the pack each).
// Returns the number of entries shifted.
int64_t StepPool::replace(int64_t k, const Entry& out, const Entry& in) {
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

int64_t StepPool::exchange(int64_t a, int64_t b, const Entry& x, const Entry* y) {
  const size_t na = content_[static_cast<size_t>(a)][0].size(), nb = content_[static_cast<size_t>(b)][0].size();
  int64_t work = dims_ * 2 * (log2_ceil(na) + log2_ceil(nb));
  if (y != nullptr) {
    work += replace(a, x, *y) + replace(b, *y, x);
  } else {
    remove(a, x);
    insert(b, x);
    work += dims_ * static_cast<int64_t>(na + nb);
  }
  const size_t pa = static_cast<size_t>(id(a)), pb = static_cast<size_t>(id(b));
  const Entry none{{0.0, 0.0}, 0, 0, -1, -1};
  const Entry& back = y != nullptr ? *y : none;
  totals_.vit[pa] += back.vit - x.vit;
  totals_.llm[pa] += back.llm - x.llm;
  totals_.vit[pb] += x.vit - back.vit;
  totals_.llm[pb] += x.llm - back.llm;
  for (int d = 0; d < dims_; ++d) {
    totals_.cost[pa * static_cast<size_t>(dims_) + static_cast<size_t>(d)] += back.cost[d] - x.cost[d];
    totals_.cost[pb * static_cast<size_t>(dims_) + static_cast<size_t>(d)] += x.cost[d] - back.cost[d];
  }
  owner_[static_cast<size_t>(x.local)] = b;
  if (y != nullptr) owner_[static_cast<size_t>(y->local)] = a;
  return work;
}

}  // namespace omnibal
