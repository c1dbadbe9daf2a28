// Python module omnibal_kernels._C: thin pybind11 bindings over numpy buffers; no logic lives here.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <type_traits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "grouping.hpp"
#include "length_records.hpp"
#include "rng.hpp"

namespace py = pybind11;
using omnibal::Capacity;
using omnibal::Loads;
using omnibal::Packs;

namespace {

using IntArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// Hands a vector to numpy without copying: the array owns the vector through a capsule.
template <typename Vector>
py::array_t<int64_t> to_numpy(Vector&& v, std::vector<py::ssize_t> shape = {}) {
  using Owned = std::decay_t<Vector>;
  auto* owned = new Owned(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<Owned*>(p); });
  if (shape.empty()) shape = {static_cast<py::ssize_t>(owned->size())};
  return py::array_t<int64_t>(shape, owned->data(), free_when_done);
}

Loads as_loads(const IntArray& vit, const IntArray& llm) {
  if (vit.ndim() != 1 || llm.ndim() != 1 || vit.shape(0) != llm.shape(0)) {
    throw std::invalid_argument("vit and llm must be 1-D arrays of the same length");
  }
  return Loads{vit.data(), llm.data()};
}

// The sample ids to pack, checked in place; None means every sample, in order (no index array).
// `keep` holds the converted array alive while the ItemSet points into it.
omnibal::ItemSet as_items(const py::object& items_obj, py::ssize_t num_samples, IntArray& keep) {
  if (items_obj.is_none()) return omnibal::ItemSet{nullptr, static_cast<int64_t>(num_samples)};
  keep = items_obj.cast<IntArray>();
  if (keep.ndim() != 1) throw std::invalid_argument("items must be a 1-D array");
  const int64_t* ids = keep.data();
  int64_t bad = -1;
  if (!omnibal::ids_in_range(ids, keep.shape(0), num_samples, bad)) {
    throw std::out_of_range("item id out of range: " + std::to_string(ids[bad]));
  }
  return omnibal::ItemSet{ids, static_cast<int64_t>(keep.shape(0))};
}

omnibal::CostModel as_cost(const std::vector<double>& terms) {
  if (terms.size() != 4) throw std::invalid_argument("cost_terms must have 4 entries");
  return omnibal::CostModel{terms[0], terms[1], terms[2], terms[3]};
}

py::tuple packs_to_python(Packs&& packs) {
  return py::make_tuple(to_numpy(std::move(packs.offsets)), to_numpy(std::move(packs.samples)));
}

py::tuple assignment_to_python(omnibal::Assignment&& a, int64_t world_size) {
  return py::make_tuple(to_numpy(std::move(a.step_packs), {static_cast<py::ssize_t>(a.num_steps),
                                                           static_cast<py::ssize_t>(world_size)}),
                        a.duplicated_slots, to_numpy(std::move(a.dropped_packs)));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "omnibal_kernels C++ balance engine (grouping and assignment; deterministic from a seed)";

  m.def(
      "random_next_fit",
      [](const IntArray& vit, const IntArray& llm, const py::object& items, int64_t vit_capacity,
         int64_t llm_capacity, uint64_t seed) {
        const Loads loads = as_loads(vit, llm);
        IntArray keep;
        const omnibal::ItemSet ids = as_items(items, vit.shape(0), keep);
        Packs packs;
        {
          py::gil_scoped_release release;
          packs = omnibal::random_next_fit(loads, ids, Capacity{vit_capacity, llm_capacity}, seed);
        }
        return packs_to_python(std::move(packs));
      },
      py::arg("vit"), py::arg("llm"), py::arg("items"), py::arg("vit_capacity"), py::arg("llm_capacity"),
      py::arg("seed"), "Random next-fit packing; returns (offsets, samples).");

  m.def(
      "isf",
      [](const IntArray& vit, const IntArray& llm, const py::object& items, int64_t vit_capacity,
         int64_t llm_capacity, int64_t vit_threshold, int64_t llm_threshold, int iterations, uint64_t seed) {
        const Loads loads = as_loads(vit, llm);
        IntArray keep;
        const omnibal::ItemSet ids = as_items(items, vit.shape(0), keep);
        Packs packs;
        {
          py::gil_scoped_release release;
          packs = omnibal::isf(loads, ids, Capacity{vit_capacity, llm_capacity}, vit_threshold, llm_threshold,
                               iterations, seed);
        }
        return packs_to_python(std::move(packs));
      },
      py::arg("vit"), py::arg("llm"), py::arg("items"), py::arg("vit_capacity"), py::arg("llm_capacity"),
      py::arg("vit_threshold"), py::arg("llm_threshold"), py::arg("iterations"), py::arg("seed"),
      "Iterative sampling and filtering (OmniBal); returns (offsets, samples).");

  m.def(
      "best_fit_packs",
      [](const IntArray& vit, const IntArray& llm, const py::object& items, int64_t vit_capacity,
         int64_t llm_capacity, int rounds, uint64_t seed) {
        const Loads loads = as_loads(vit, llm);
        IntArray keep;
        const omnibal::ItemSet ids = as_items(items, vit.shape(0), keep);
        Packs packs;
        {
          py::gil_scoped_release release;
          packs = omnibal::best_fit_packs(loads, ids, Capacity{vit_capacity, llm_capacity}, rounds, seed);
        }
        return packs_to_python(std::move(packs));
      },
      py::arg("vit"), py::arg("llm"), py::arg("items"), py::arg("vit_capacity"), py::arg("llm_capacity"),
      py::arg("rounds"), py::arg("seed"), "Randomized 2-D best fit in rounds; returns (offsets, samples).");

  m.def(
      "assign_random",
      [](int64_t num_packs, int64_t world_size, bool drop_last, uint64_t seed) {
        if (num_packs < 0 || world_size < 1) throw std::invalid_argument("num_packs >= 0 and world_size >= 1");
        omnibal::Assignment a;
        {
          py::gil_scoped_release release;
          a = omnibal::assign_random(num_packs, world_size, drop_last, seed);
        }
        return assignment_to_python(std::move(a), world_size);
      },
      py::arg("num_packs"), py::arg("world_size"), py::arg("drop_last"), py::arg("seed"),
      "Packs to (step, rank) slots in random order; returns (step_packs, duplicated_slots, dropped_packs).");

  m.def(
      "assign_balanced",
      [](const IntArray& offsets, const IntArray& samples, const IntArray& vit, const IntArray& llm,
         int64_t vit_capacity, int64_t llm_capacity, std::vector<double> cost_terms, int64_t world_size,
         bool drop_last, uint64_t seed) {
        const Loads loads = as_loads(vit, llm);
        const omnibal::CostModel cost = as_cost(cost_terms);
        if (world_size < 1) throw std::invalid_argument("world_size must be >= 1");
        Packs packs;
        packs.offsets.assign(offsets.data(), offsets.data() + offsets.shape(0));
        packs.samples.assign(samples.data(), samples.data() + samples.shape(0));
        omnibal::Assignment a;
        {
          py::gil_scoped_release release;
          a = omnibal::assign_balanced(packs, loads, cost, Capacity{vit_capacity, llm_capacity}, world_size,
                                       drop_last, seed);
        }
        py::tuple assigned = assignment_to_python(std::move(a), world_size);
        return py::make_tuple(to_numpy(std::move(packs.samples)), assigned[0], assigned[1], assigned[2]);
      },
      py::arg("offsets"), py::arg("samples"), py::arg("vit"), py::arg("llm"), py::arg("vit_capacity"),
      py::arg("llm_capacity"), py::arg("cost_terms"), py::arg("world_size"), py::arg("drop_last"),
      py::arg("seed"),
      "Balanced assignment of packs to (step, rank) slots, swapping samples between the packs of a step "
      "(pack sizes stay); returns (samples, step_packs, duplicated_slots, dropped_packs).");

  m.def(
      "plan_balanced",
      [](const IntArray& vit, const IntArray& llm, const py::object& items, const py::object& singles,
         int64_t vit_capacity, int64_t llm_capacity, std::vector<double> cost_terms, int rounds,
         int64_t world_size, bool drop_last, uint64_t seed) {
        const Loads loads = as_loads(vit, llm);
        IntArray keep, keep_singles;
        const omnibal::ItemSet ids = as_items(items, vit.shape(0), keep);
        const omnibal::ItemSet single_ids = singles.is_none() ? omnibal::ItemSet{nullptr, 0}
                                                              : as_items(singles, vit.shape(0), keep_singles);
        const omnibal::CostModel cost = as_cost(cost_terms);
        if (world_size < 1) throw std::invalid_argument("world_size must be >= 1");
        omnibal::BalancedPlan plan;
        {
          py::gil_scoped_release release;
          plan = omnibal::plan_balanced(loads, ids, single_ids, Capacity{vit_capacity, llm_capacity}, cost,
                                        rounds, world_size, drop_last, seed);
        }
        py::tuple assigned = assignment_to_python(std::move(plan.assignment), world_size);
        return py::make_tuple(to_numpy(std::move(plan.packs.offsets)), to_numpy(std::move(plan.packs.samples)),
                              assigned[0], assigned[1], assigned[2]);
      },
      py::arg("vit"), py::arg("llm"), py::arg("items"), py::arg("singles"), py::arg("vit_capacity"),
      py::arg("llm_capacity"), py::arg("cost_terms"), py::arg("rounds"), py::arg("world_size"),
      py::arg("drop_last"), py::arg("seed"),
      "Best-fit packs (plus one pack per sample of `singles`, or None) and balanced assignment; returns "
      "(offsets, samples, step_packs, duplicated_slots, dropped_packs).");

  m.def(
      "parse_length_records",
      [](const py::buffer& data, const std::string& vit_key, const std::string& llm_key) {
        const py::buffer_info info = data.request();
        omnibal::LengthRecords rec;
        {
          py::gil_scoped_release release;
          rec = omnibal::parse_length_records(static_cast<const char*>(info.ptr),
                                              static_cast<size_t>(info.size * info.itemsize), vit_key, llm_key);
        }
        return py::make_tuple(to_numpy(std::move(rec.vit)), to_numpy(std::move(rec.llm)), rec.error,
                              rec.error_sample);
      },
      py::arg("data"), py::arg("vit_key"), py::arg("llm_key"),
      "Reads per-sample length records (JSON list or JSON Lines); returns (vit, llm, error, error_sample).");

  py::dict streams;
  streams["isf_round"] = static_cast<uint64_t>(omnibal::kStreamIsfRound);
  streams["next_fit"] = static_cast<uint64_t>(omnibal::kStreamNextFit);
  streams["best_fit"] = static_cast<uint64_t>(omnibal::kStreamBestFit);
  streams["assign"] = static_cast<uint64_t>(omnibal::kStreamAssign);
  streams["ragged"] = static_cast<uint64_t>(omnibal::kStreamRagged);
  streams["group_steps"] = static_cast<uint64_t>(omnibal::kStreamGroupSteps);
  m.attr("STREAMS") = streams;

  m.def(
      "derive_seed", [](uint64_t seed, uint64_t a, uint64_t b) { return omnibal::derive_seed(seed, a, b); },
      py::arg("seed"), py::arg("a"), py::arg("b") = 0, "The seed of one random stream: derive_seed(seed, STREAMS[name], index).");

  m.def(
      "splitmix64", [](uint64_t state) { return omnibal::splitmix64(state); }, py::arg("state"),
      "The output of one SplitMix64 step from `state` (the engine's seed expander).");

  m.def(
      "shuffle",
      [](const IntArray& values, uint64_t seed) {
        std::vector<int64_t> v(values.data(), values.data() + values.size());
        omnibal::Rng rng(seed);
        omnibal::shuffle(v, rng);
        return to_numpy(std::move(v));
      },
      py::arg("values"), py::arg("seed"),
      "The engine's shuffle of `values` with Rng(seed).");

  m.def(
      "load_stats",
      [](const IntArray& vit, const IntArray& llm, int64_t llm_bin) {
        const Loads loads = as_loads(vit, llm);
        if (llm_bin < 1) throw std::invalid_argument("llm_bin must be >= 1");
        omnibal::LoadStats s;
        {
          py::gil_scoped_release release;
          s = omnibal::load_stats(loads.vit, loads.llm, vit.shape(0), llm_bin);
        }
        return py::make_tuple(s.vit_sum, s.llm_sum, s.vit_max, s.llm_max, s.llm_sum_binned);
      },
      py::arg("vit"), py::arg("llm"), py::arg("llm_bin"),
      "One pass over the loads: (vit_sum, llm_sum, vit_max, llm_max, sum of llm rounded up to llm_bin).");
}
