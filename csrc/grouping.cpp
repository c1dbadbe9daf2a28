// Samples into packs (grouping.hpp): the shuffled items every method starts from, next-fit (random next-fit
// and the ISF rounds), and the balanced method's best fit in rounds with the merge of its leftover packs.
#include "grouping.hpp"

#include <algorithm>
#include <climits>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rng.hpp"

namespace omnibal {
namespace {

// A chunk goes back to the pool for another best-fit round only if at least 1 / kMinFinalShare of its items
// are in final packs (best_fit_packs).
constexpr size_t kMinFinalShare = 4;
// A chunk goes back to the pool for another round only if its open packs have room for at least
// 1 / kMinOpenRoom of its packs' capacity: below that, another round could save at most that share of its
// packs, which bounds what skipping the round costs in packs.
constexpr double kMinOpenRoom = 512.0;
// A pack's number within one chunk is an int32 in BestFitPass::pack_of: a chunk holds fewer packs than that.
static_assert(kBestFitChunk <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), "pack_of is int32");

// A sample with its loads next to its id, so that passes over a shuffled order read memory sequentially.
// The loads are int32, so that an Item is 16 bytes.
struct Item {
  // Left unset: a buffer of items is written before it is read, and resizing one then costs no zeroing pass.
  Item() {}
  Item(Index id_, int32_t vit_, int32_t llm_) : id(id_), vit(vit_), llm(llm_) {}
  Index id;
  int32_t vit;
  int32_t llm;
};
using ItemVector = LargeVector<Item>;

[[noreturn]] void refuse_load(const char* name, Index id, Index load) {
  throw_too_large(std::string(name) + " load of sample " + std::to_string(id), load, 0, kMaxLoad);
}

// Every load the grouping reads passes here, where it narrows to int32: a load outside [0, kMaxLoad] is
// refused rather than wrapped.
Item item_of(const Loads& loads, Index id) {
  const int64_t vit = loads.vit[id], llm = loads.llm[id];
  if (vit < 0 || vit > kMaxLoad) refuse_load("vit", id, vit);
  if (llm < 0 || llm > kMaxLoad) refuse_load("llm", id, llm);
  return Item{id, static_cast<int32_t>(vit), static_cast<int32_t>(llm)};
}

// The items in uniformly random order, gathered while shuffling (one pass over the loads).
ItemVector shuffled_items(const Loads& loads, ItemSet items, Rng& rng) {
  ItemVector out;
  const auto item = [&](size_t k) { return item_of(loads, items.id(static_cast<Index>(k))); };
  shuffle_from(static_cast<size_t>(items.count), item, rng, out);
  return out;
}

// Next-fit over `order`: returns the offsets of its packs (CSR over `order` itself).
LargeVector<Index> next_fit_offsets(const ItemVector& order, Capacity cap) {
  LargeVector<Index> offsets{0};
  int64_t vit_sum = 0, llm_sum = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k > 0 && (vit_sum + order[k].vit > cap.vit || llm_sum + order[k].llm > cap.llm)) {
      offsets.push_back(static_cast<Index>(k));
      vit_sum = llm_sum = 0;
    }
    vit_sum += order[k].vit;
    llm_sum += order[k].llm;
  }
  // The last pack is always closed, whatever its last sample was (the reference OmniBal code can lose it).
  if (!order.empty()) offsets.push_back(static_cast<Index>(order.size()));
  return offsets;
}

void append_pack(Packs& out, const Item* first, const Item* last) {
  for (const Item* it = first; it != last; ++it) out.samples.push_back(it->id);
  out.close_pack();
}

// Bit set over bucket indices with "first set bit at or after i". A second level marks the non-empty
// words, so a search skips 4,096 empty buckets per step: a capacity of 16k tokens has 16k buckets, mostly
// empty, and the search for a pack with room runs once per sample.
class BucketBits {
 public:
  explicit BucketBits(int64_t n)
      : words_(static_cast<size_t>((n + 63) / 64), 0), summary_((words_.size() + 63) / 64, 0), n_(n) {}
  void set(int64_t i) {
    const size_t w = static_cast<size_t>(i >> 6);
    words_[w] |= (uint64_t{1} << (i & 63));
    summary_[w >> 6] |= (uint64_t{1} << (w & 63));
  }
  void clear(int64_t i) {
    const size_t w = static_cast<size_t>(i >> 6);
    words_[w] &= ~(uint64_t{1} << (i & 63));
    if (words_[w] == 0) summary_[w >> 6] &= ~(uint64_t{1} << (w & 63));
  }
  int64_t next(int64_t i) const {  // n when no set bit is at or after i
    if (i >= n_) return n_;
    size_t w = static_cast<size_t>(i >> 6);
    const uint64_t word = words_[w] & (~uint64_t{0} << (i & 63));
    if (word != 0) return static_cast<int64_t>(w * 64 + static_cast<size_t>(count_trailing_zeros(word)));
    // the next non-empty word after w, from the summary
    ++w;
    size_t s = w >> 6;
    if (s >= summary_.size()) return n_;
    uint64_t bits = summary_[s] & (~uint64_t{0} << (w & 63));
    while (bits == 0) {
      if (++s >= summary_.size()) return n_;
      bits = summary_[s];
    }
    w = s * 64 + static_cast<size_t>(count_trailing_zeros(bits));
    return static_cast<int64_t>(w * 64 + static_cast<size_t>(count_trailing_zeros(words_[w])));
  }

 private:
  std::vector<uint64_t> words_;
  std::vector<uint64_t> summary_;
  int64_t n_;
};

// One best-fit pass over `order`: each item goes to the open pack with the least primary room that still
// fits it in both dimensions, or to a new pack. Open packs sit in buckets by primary room: exact buckets
// when the capacity is small (tiles, tokens), quantized ones when it is large (patches), where the exact
// room is still checked before placing.
struct BestFitPass {
  std::vector<int32_t> pack_of;                       // per position in `order`
  std::vector<int64_t> room_primary, room_secondary;  // per pack, as the pass leaves it

  size_t num_packs() const { return room_primary.size(); }
  // Where each pack's members start when the pass's items are grouped by pack (a counting sort), and the end.
  std::vector<size_t> pack_starts() const {
    std::vector<size_t> start(num_packs() + 1, 0);
    for (const int32_t p : pack_of) ++start[static_cast<size_t>(p) + 1];
    for (size_t p = 0; p < num_packs(); ++p) start[p + 1] += start[p];
    return start;
  }
};

// The buckets of open packs, allocated once per plan and left empty by every pass. Each bucket is a stack
// threaded through the pass's packs (a head per bucket, a link per pack), most recently added first: a
// placement reads two small arrays and the pack's rooms, where a vector per bucket costs a cache miss on
// its header and another on its storage. A capacity of 32k tokens has 32k buckets, more than a chunk has
// samples, so they are not allocated per chunk.
class OpenPacks {
 public:
  explicit OpenPacks(int64_t primary_cap)
      : primary_cap_(primary_cap),
        num_buckets_(std::min<int64_t>(primary_cap + 1, int64_t{1} << 16)),
        exact_(num_buckets_ == primary_cap + 1),
        head_(static_cast<size_t>(num_buckets_), -1),
        nonempty_(num_buckets_) {}

  int64_t num_buckets() const { return num_buckets_; }
  int64_t bucket_of(int64_t room) const {
    return exact_ ? room
                  : static_cast<int64_t>(static_cast<double>(room) * static_cast<double>(num_buckets_) /
                                         static_cast<double>(primary_cap_ + 1));
  }
  int64_t next_nonempty(int64_t b) const { return nonempty_.next(b); }
  int32_t head(int64_t b) const { return head_[static_cast<size_t>(b)]; }
  int32_t next(int32_t pack) const { return next_[static_cast<size_t>(pack)]; }

  // A new pack of the pass (numbered from 0 in every pass), not yet in a bucket.
  void new_pack() { next_.push_back(-1); }
  void push(int64_t b, int32_t pack) {
    next_[static_cast<size_t>(pack)] = head_[static_cast<size_t>(b)];
    head_[static_cast<size_t>(b)] = pack;
    nonempty_.set(b);
  }
  // Takes `pack` out of bucket b; `prev` is the pack before it in the bucket (-1: it is the head).
  void unlink(int64_t b, int32_t prev, int32_t pack) {
    if (prev >= 0) {
      next_[static_cast<size_t>(prev)] = next_[static_cast<size_t>(pack)];
      return;
    }
    head_[static_cast<size_t>(b)] = next_[static_cast<size_t>(pack)];
    if (head_[static_cast<size_t>(b)] < 0) nonempty_.clear(b);
  }
  // Empties every bucket, for the next pass.
  void clear() {
    for (int64_t b = nonempty_.next(0); b < num_buckets_; b = nonempty_.next(b + 1)) {
      head_[static_cast<size_t>(b)] = -1;
      nonempty_.clear(b);
    }
    next_.clear();
  }

 private:
  int64_t primary_cap_;
  int64_t num_buckets_;
  bool exact_;
  std::vector<int32_t> head_;
  std::vector<int32_t> next_;
  BucketBits nonempty_;
};

// T: anything with `vit` and `llm` loads (a sample, or a part of a pack in the merge of leftovers).
template <typename T>
BestFitPass best_fit_pass(const T* order, size_t count, bool vit_binds, Capacity cap, int64_t min_primary,
                          int64_t min_secondary, OpenPacks& open) {
  const int64_t primary_cap = vit_binds ? cap.vit : cap.llm;
  const int64_t secondary_cap = vit_binds ? cap.llm : cap.vit;
  // Packs checked per item for room in the second dimension, per bucket and in all; past that a new pack
  // opens. Bounds the work per item when the second dimension is nearly full everywhere.
  constexpr int64_t kTriesPerBucket = 16;
  constexpr int64_t kTriesPerItem = 64;

  BestFitPass res;
  res.pack_of.resize(count);
  res.room_primary.reserve(count / 2 + 1);
  res.room_secondary.reserve(count / 2 + 1);
  int64_t* room1 = nullptr;
  int64_t* room2 = nullptr;
  const int64_t num_buckets = open.num_buckets();

  for (size_t k = 0; k < count; ++k) {
    const int64_t need = vit_binds ? order[k].vit : order[k].llm;
    const int64_t need2 = vit_binds ? order[k].llm : order[k].vit;
    int32_t chosen = -1;
    int64_t tries = 0;
    for (int64_t b = open.next_nonempty(open.bucket_of(need)); b < num_buckets && tries < kTriesPerItem;
         b = open.next_nonempty(b + 1)) {
      int32_t prev = -1;
      int64_t in_bucket = 0;
      for (int32_t p = open.head(b); p >= 0 && in_bucket < kTriesPerBucket; prev = p, p = open.next(p)) {
        ++in_bucket, ++tries;
        if (room1[p] >= need && room2[p] >= need2) {
          chosen = p;
          open.unlink(b, prev, p);
          break;
        }
      }
      if (chosen >= 0) break;
    }
    if (chosen < 0) {
      chosen = static_cast<int32_t>(res.room_primary.size());
      res.room_primary.push_back(primary_cap);
      res.room_secondary.push_back(secondary_cap);
      room1 = res.room_primary.data();
      room2 = res.room_secondary.data();
      open.new_pack();
    }
    room1[chosen] -= need;
    room2[chosen] -= need2;
    res.pack_of[k] = chosen;
    // A pack that no sample can join any more leaves the buckets for good.
    if (room1[chosen] >= min_primary && room2[chosen] >= min_secondary)
      open.push(open.bucket_of(room1[chosen]), chosen);
  }
  open.clear();
  return res;
}

// Appends a pack and its totals (the samples' loads are at hand where packs are formed).
void append_pack_with_totals(Packs& packs, const Item* first, const Item* last, PackLoads& totals) {
  append_pack(packs, first, last);
  int64_t v = 0, t = 0;
  for (const Item* it = first; it != last; ++it) {
    v += it->vit;
    t += it->llm;
  }
  totals.vit.push_back(v);
  totals.llm.push_back(t);
}

// Packs that best fit left with room for more samples, each formed within one chunk of the pool. With a
// capacity far above a chunk's total load every chunk leaves one such pack, where one pack would hold them
// all, so they are merged as parts: best fit decreasing, the parts by decreasing binding load (a stable
// counting sort on their bucket), each into the open merged pack of least room that holds it in both loads.
class Leftovers {
 public:
  // Room for `items` sample ids reserved up front: growing by copies would touch (and have the system zero)
  // about twice the memory; reserved pages that are never written cost nothing.
  explicit Leftovers(size_t items) { ids_.reserve(items); }

  void add(const Item* first, const Item* last) {
    int64_t v = 0, t = 0;
    for (const Item* it = first; it != last; ++it) {
      ids_.push_back(it->id);
      v += it->vit;
      t += it->llm;
    }
    offsets_.push_back(static_cast<Index>(ids_.size()));
    parts_.push_back(Part{v, t, static_cast<size_t>(last - first)});
  }

  void merge(Capacity cap, bool vit_binds, int64_t min_vit, int64_t min_llm, OpenPacks& open, Packs& packs,
             PackLoads& totals) {
    const size_t n = parts_.size();
    if (n == 0) return;
    std::vector<size_t> by_bucket(static_cast<size_t>(open.num_buckets()) + 1, 0);
    auto bucket = [&](const Part& part) {
      return static_cast<size_t>(open.bucket_of(vit_binds ? part.vit : part.llm));
    };
    for (const Part& part : parts_) ++by_bucket[bucket(part)];
    // Starts of the buckets in decreasing order: bucket b's parts come after those of every larger bucket.
    size_t at = 0;
    for (size_t b = by_bucket.size(); b-- > 0;) {
      const size_t count = by_bucket[b];
      by_bucket[b] = at;
      at += count;
    }
    std::vector<size_t> order(n);
    for (size_t u = 0; u < n; ++u) order[by_bucket[bucket(parts_[u])]++] = u;
    std::vector<Part> sorted(n);
    for (size_t k = 0; k < n; ++k) sorted[k] = parts_[order[k]];
    // Where each part's samples go: the merged packs in the order the pass opens them, each pack's parts in
    // the order they joined it. The samples are then copied in the order they were added, so that they are
    // read in sequence and written at random (a read at random waits for memory; a write does not).
    std::vector<size_t> dest(n);
    size_t end = packs.samples.size();
    // Pack numbers of one pass are int32: more parts than that are merged in blocks.
    constexpr size_t kBlock = static_cast<size_t>(std::numeric_limits<int32_t>::max() / 2);
    for (size_t from = 0; from < n; from += kBlock) {
      const size_t count = std::min(kBlock, n - from);
      const Part* block = sorted.data() + from;
      const BestFitPass pass = best_fit_pass(block, count, vit_binds, cap, vit_binds ? min_vit : min_llm,
                                             vit_binds ? min_llm : min_vit, open);
      const size_t num_packs = pass.num_packs();
      const size_t first_pack = totals.vit.size();
      std::vector<size_t> next(num_packs + 1, 0);
      totals.vit.resize(first_pack + num_packs, 0);
      totals.llm.resize(first_pack + num_packs, 0);
      for (size_t k = 0; k < count; ++k) {
        const size_t p = static_cast<size_t>(pass.pack_of[k]);
        next[p + 1] += block[k].items;
        totals.vit[first_pack + p] += block[k].vit;
        totals.llm[first_pack + p] += block[k].llm;
      }
      next[0] = end;
      for (size_t p = 0; p < num_packs; ++p) {
        next[p + 1] += next[p];
        packs.offsets.push_back(static_cast<Index>(next[p + 1]));
      }
      end = next[num_packs];
      for (size_t k = 0; k < count; ++k) {
        const size_t p = static_cast<size_t>(pass.pack_of[k]);
        dest[order[from + k]] = next[p];
        next[p] += block[k].items;
      }
    }
    packs.samples.resize(end);
    for (size_t u = 0; u < n; ++u) {
      std::copy(ids_.begin() + offsets_[u], ids_.begin() + offsets_[u + 1],
                packs.samples.begin() + static_cast<std::ptrdiff_t>(dest[u]));
    }
  }

 private:
  struct Part {
    int64_t vit, llm;
    size_t items;
  };
  LargeVector<Index> ids_;
  LargeVector<Index> offsets_{0};
  std::vector<Part> parts_;
};

}  // namespace

Packs best_fit_packs(const Loads& loads, ItemSet items, Capacity cap, int rounds, uint64_t seed, PackLoads& totals) {
  if (rounds < 1) throw std::invalid_argument("rounds must be >= 1, got " + std::to_string(rounds));
  Packs packs;
  packs.samples.reserve(static_cast<size_t>(items.count));
  // Every pack holds a sample: at most one pack per item (never-written reserved pages cost nothing).
  packs.offsets.reserve(static_cast<size_t>(items.count) + 1);
  totals.vit.reserve(static_cast<size_t>(items.count));
  totals.llm.reserve(static_cast<size_t>(items.count));
  if (items.count == 0) return packs;
  double vit_total = 0.0, llm_total = 0.0;
  int64_t min_vit = INT64_MAX, min_llm = INT64_MAX;
  for (Index k = 0; k < items.count; ++k) {
    const Index id = items.id(k);
    vit_total += static_cast<double>(loads.vit[id]);
    llm_total += static_cast<double>(loads.llm[id]);
    min_vit = std::min(min_vit, loads.vit[id]);
    min_llm = std::min(min_llm, loads.llm[id]);
  }
  // The binding dimension is the one whose total needs more packs.
  const bool vit_binds =
      cap.vit > 0 && vit_total * static_cast<double>(cap.llm) >= llm_total * static_cast<double>(cap.vit);
  ItemVector pool, scratch;  // scratch: shuffle and grouping buffer, reused by every round
  Leftovers leftovers(static_cast<size_t>(items.count));
  std::vector<size_t> fill;
  const int64_t primary_cap = vit_binds ? cap.vit : cap.llm;
  OpenPacks open(primary_cap);
  for (int r = 0; r < rounds && (r == 0 || !pool.empty()); ++r) {
    Rng rng(derive_seed(seed, kStreamBestFit, static_cast<uint64_t>(r)));
    if (r == 0) {
      pool = shuffled_items(loads, items, rng);
    } else {
      shuffle(pool, rng, scratch);
    }
    // The shuffled pool is cut into chunks packed independently: each chunk is a uniformly random subset,
    // small enough that packing and grouping it stay in cache; packs left open go back to the pool anyway.
    size_t pooled = 0;
    for (size_t chunk = 0; chunk < pool.size(); chunk += kBestFitChunk) {
      const size_t count = std::min(kBestFitChunk, pool.size() - chunk);
      const Item* chunk_items = pool.data() + chunk;
      const BestFitPass pass = best_fit_pass(chunk_items, count, vit_binds, cap, vit_binds ? min_vit : min_llm,
                                             vit_binds ? min_llm : min_vit, open);
      const size_t num_packs = pass.num_packs();
      // A pack no sample could join is final; the others go back to the pool or stay as leftovers (below).
      auto is_final = [&](size_t p) {
        const int64_t room_vit = vit_binds ? pass.room_primary[p] : pass.room_secondary[p];
        const int64_t room_llm = vit_binds ? pass.room_secondary[p] : pass.room_primary[p];
        return room_vit < min_vit || room_llm < min_llm;
      };
      // Group the chunk's items by pack into scratch, then keep each pack or return its items to the front
      // of the pool, which holds nothing unread before this chunk's end.
      const std::vector<size_t> start = pass.pack_starts();
      size_t final_items = 0;
      int64_t open_room = 0;  // in the binding dimension
      for (size_t p = 0; p < num_packs; ++p) {
        if (is_final(p)) {
          final_items += start[p + 1] - start[p];
        } else {
          open_room += pass.room_primary[p];
        }
      }
      // Packs kept while not final are leftovers, merged across chunks at the end (Leftovers::merge): in the
      // last round; in a chunk where under 1 / kMinFinalShare of the items are in final packs, since
      // re-packing such a chunk would shrink the pool by less than that share per round, each round a shuffle
      // and a pass over what is left (with this floor an item is packed about kMinFinalShare times at most);
      // and in a chunk whose open packs have room for under 1 / kMinOpenRoom of its packs' capacity, since
      // packing their samples again can save at most their room in whole packs. Data where few packs can
      // ever be final (text-only samples that fit beside any image), or where best fit leaves the open packs
      // all but full (short texts beside long ones), go to the merge after one pass.
      const bool keep_all = r + 1 == rounds || final_items * kMinFinalShare < count ||
                            static_cast<double>(open_room) * kMinOpenRoom <
                                static_cast<double>(primary_cap) * static_cast<double>(num_packs);
      scratch.resize(count);
      fill.assign(start.begin(), start.end() - 1);
      for (size_t k = 0; k < count; ++k) scratch[fill[static_cast<size_t>(pass.pack_of[k])]++] = chunk_items[k];
      for (size_t p = 0; p < num_packs; ++p) {
        const Item* first = scratch.data() + start[p];
        const Item* last = scratch.data() + start[p + 1];
        if (!is_final(p)) {
          if (keep_all) {
            leftovers.add(first, last);
          } else {
            for (const Item* it = first; it != last; ++it) pool[pooled++] = *it;
          }
          continue;
        }
        append_pack_with_totals(packs, first, last, totals);
      }
    }
    pool.resize(pooled);
  }
  leftovers.merge(cap, vit_binds, min_vit, min_llm, open, packs, totals);
  return packs;
}

Packs random_next_fit(const Loads& loads, ItemSet items, Capacity cap, uint64_t seed) {
  Rng rng(derive_seed(seed, kStreamNextFit));
  const ItemVector order = shuffled_items(loads, items, rng);
  const LargeVector<Index> offsets = next_fit_offsets(order, cap);
  Packs packs;
  packs.samples.reserve(order.size());
  for (size_t p = 0; p + 1 < offsets.size(); ++p) append_pack(packs, &order[offsets[p]], order.data() + offsets[p + 1]);
  return packs;
}

Packs isf(const Loads& loads, ItemSet items, Capacity cap, int64_t vit_threshold, int64_t llm_threshold, int iterations,
          uint64_t seed) {
  Packs out;
  out.samples.reserve(static_cast<size_t>(items.count));
  ItemVector round, pool;
  {
    Rng rng(derive_seed(seed, kStreamIsfRound, 0));
    round = shuffled_items(loads, items, rng);
  }
  LargeVector<Index> offsets = next_fit_offsets(round, cap);
  for (int r = 1; r < iterations; ++r) {
    pool.clear();
    for (size_t p = 0; p + 1 < offsets.size(); ++p) {
      const Item* first = round.data() + offsets[p];
      const Item* last = round.data() + offsets[p + 1];
      int64_t vit_sum = 0, llm_sum = 0;
      for (const Item* it = first; it != last; ++it) {
        vit_sum += it->vit;
        llm_sum += it->llm;
      }
      if (vit_sum >= vit_threshold || llm_sum >= llm_threshold) append_pack(out, first, last);
      else pool.insert(pool.end(), first, last);
    }
    round.swap(pool);
    if (round.empty()) {  // every pack was kept: nothing left to re-sample
      offsets.assign(1, 0);
      break;
    }
    Rng rng(derive_seed(seed, kStreamIsfRound, static_cast<uint64_t>(r)));
    shuffle(round, rng);
    offsets = next_fit_offsets(round, cap);
  }
  // The remainder, packed once more in the last round, is kept whole.
  for (size_t p = 0; p + 1 < offsets.size(); ++p) append_pack(out, &round[offsets[p]], round.data() + offsets[p + 1]);
  return out;
}

}  // namespace omnibal
