// The Python module omnibal_kernels._C: argument conversion and checks over numpy buffers, the engine's calls
// (without the GIL), and its results as small classes with read-only named attributes. No planning logic.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "assignment.hpp"
#include "grouping.hpp"
#include "index.hpp"
#include "length_records.hpp"
#include "loads.hpp"
#include "plan.hpp"
#include "rng.hpp"
#include "step_balance.hpp"

namespace py = pybind11;
using omnibal::Capacity;
using omnibal::Index;

namespace {

using IntArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// Named results. Attributes, not tuple positions, so that a field added later breaks no caller.
struct PacksResult {
  py::array offsets, samples;
};
struct AssignmentResult {
  py::array step_packs;
  Index duplicated_slots;
  py::array dropped_packs;
};
struct BalancedPlanResult {
  PacksResult packs;
  AssignmentResult assignment;
};
struct LengthRecordsResult {
  py::array vit, llm;
  // None where no record has the key.
  py::object vit_seqlens = py::none(), vit_seqlens_offsets = py::none(), vit_seqlens_given = py::none();
  py::object label = py::none();
  std::string error;
  Index error_sample;
};

// Hands a vector to numpy without copying: the array owns the vector through a capsule.
template <typename Vector>
py::array_t<typename std::decay_t<Vector>::value_type> to_numpy(Vector&& v, std::vector<py::ssize_t> shape = {}) {
  using Owned = std::decay_t<Vector>;
  auto* owned = new Owned(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<Owned*>(p); });
  if (shape.empty()) shape = {static_cast<py::ssize_t>(owned->size())};
  return py::array_t<typename Owned::value_type>(shape, owned->data(), free_when_done);
}

// `obj` (an array or a sequence) as a C-contiguous int64 array. Integer arrays of any width are converted;
// anything else (floats, bools, objects) is a TypeError naming `name`: a cast would truncate silently. A
// sequence that numpy reads as empty (dtype float64) is an empty int64 array: it has no value to truncate.
IntArray as_int64(const py::handle& obj, const char* name) {
  const py::array arr = py::array::ensure(obj);
  if (!arr) {
    throw py::type_error(std::string(name) + " must be an integer array, got " +
                         std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  if (arr.size() == 0 && !py::isinstance<py::array>(obj)) return IntArray(0);
  const char kind = arr.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw py::type_error(std::string(name) + " must be an integer array, got dtype " +
                         std::string(py::str(arr.dtype())) + " (convert it explicitly: a cast would truncate)");
  }
  IntArray out = IntArray::ensure(arr);
  if (!out) throw py::error_already_set();
  if (kind == 'u' && arr.itemsize() >= 8) {  // uint64 above 2**63 - 1 wraps to a negative int64
    const int64_t* v = out.data();
    for (py::ssize_t k = 0; k < out.size(); ++k) {
      if (v[k] < 0) throw std::invalid_argument(std::string(name) + " holds a value above 2**63 - 1");
    }
  }
  return out;
}

IntArray as_1d_int64(const py::handle& obj, const char* name) {
  IntArray out = as_int64(obj, name);
  if (out.ndim() != 1) {
    throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(out.ndim()) + " dimensions");
  }
  return out;
}

// CSR offsets over `values` values: from 0, non-decreasing, ending at the number of values.
void check_csr(const IntArray& offsets, py::ssize_t values) {
  const int64_t* off = offsets.data();
  if (offsets.size() < 1 || off[0] != 0) throw std::invalid_argument("offsets must start at 0");
  for (py::ssize_t i = 1; i < offsets.size(); ++i) {
    if (off[i] < off[i - 1]) {
      throw std::invalid_argument("offsets must be non-decreasing, at row " + std::to_string(i - 1));
    }
  }
  if (off[offsets.size() - 1] != static_cast<int64_t>(values)) {
    throw std::invalid_argument("offsets must end at the number of values (" + std::to_string(values) + ")");
  }
}

// The per-sample loads: two 1-D integer arrays of one length, kept alive while the engine reads them.
struct LoadArrays {
  IntArray vit, llm;

  LoadArrays(const py::handle& vit_obj, const py::handle& llm_obj)
      : vit(as_1d_int64(vit_obj, "vit")), llm(as_1d_int64(llm_obj, "llm")) {
    if (vit.shape(0) != llm.shape(0)) {
      throw std::invalid_argument("vit and llm must have the same length, got " + std::to_string(vit.shape(0)) +
                                  " and " + std::to_string(llm.shape(0)));
    }
  }
  Index size() const { return static_cast<Index>(vit.shape(0)); }
  omnibal::Loads view() const { return omnibal::Loads{vit.data(), llm.data()}; }
};

// Sample ids into loads of `num_samples` samples, each in [0, num_samples). None stands for every sample in
// order (no index array) where `none_is_all`, else for no sample.
struct IdArray {
  IntArray ids;
  omnibal::ItemSet set{nullptr, 0};

  IdArray(const py::object& obj, const char* name, Index num_samples, bool none_is_all) {
    if (obj.is_none()) {
      set = omnibal::ItemSet{nullptr, none_is_all ? num_samples : 0};
      return;
    }
    ids = as_1d_int64(obj, name);
    const int64_t* v = ids.data();
    const Index count = static_cast<Index>(ids.shape(0));
    for (Index k = 0; k < count; ++k) {
      if (v[k] < 0 || v[k] >= num_samples) {
        throw std::invalid_argument(std::string(name) + "[" + std::to_string(k) + "] = " + std::to_string(v[k]) +
                                    " is not a sample id in [0, " + std::to_string(num_samples) + ")");
      }
    }
    set = omnibal::ItemSet{v, count};
  }
};

Capacity as_capacity(int64_t vit_capacity, int64_t llm_capacity) {
  for (const auto& [name, cap] : {std::pair<const char*, int64_t>{"vit_capacity", vit_capacity},
                                  std::pair<const char*, int64_t>{"llm_capacity", llm_capacity}}) {
    if (cap < 0 || cap > omnibal::kMaxCapacity) {
      throw std::invalid_argument(std::string(name) + " must be in [0, 2**48], got " + std::to_string(cap));
    }
  }
  return Capacity{vit_capacity, llm_capacity};
}

// The per-sample costs: a float64 array, (N,) (one cost per sample) or (N, 2) (its ViT and its LLM cost),
// every entry finite and >= 0 (a cast would hide an integer or float32 array computed elsewhere), kept alive
// while the engine reads it.
struct CostArray {
  py::array_t<double, py::array::c_style> cost;
  int dims = 1;

  CostArray(const py::handle& obj, Index num_samples) {
    const py::array arr = py::array::ensure(obj);
    if (!arr || arr.dtype().kind() != 'f' || arr.itemsize() != 8) {
      throw py::type_error("sample_costs must be a float64 array");
    }
    cost = py::array_t<double, py::array::c_style>::ensure(arr);
    if (!cost) throw py::error_already_set();
    const bool two = cost.ndim() == 2 && cost.shape(1) == 2;
    if (!(cost.ndim() == 1 || two) || cost.shape(0) != num_samples) {
      throw std::invalid_argument(
          "sample_costs must be (N,) or (N, 2) with one row per sample (N = " + std::to_string(num_samples) + ")");
    }
    dims = two ? 2 : 1;
    const double* c = cost.data();
    for (Index k = 0; k < num_samples * dims; ++k) {
      if (!(std::isfinite(c[k]) && c[k] >= 0.0)) {
        throw std::invalid_argument("sample_costs[" + std::to_string(k / dims) + "] = " + std::to_string(c[k]) +
                                    " is not a finite cost >= 0");
      }
    }
  }
};

void check_world_size(Index world_size) {
  if (world_size < 1) throw std::invalid_argument("world_size must be >= 1, got " + std::to_string(world_size));
}

PacksResult packs_result(omnibal::Packs&& packs) {
  return PacksResult{to_numpy(std::move(packs.offsets)), to_numpy(std::move(packs.samples))};
}

AssignmentResult assignment_result(omnibal::Assignment&& a, Index world_size) {
  return AssignmentResult{
      to_numpy(std::move(a.step_packs), {static_cast<py::ssize_t>(a.num_steps), static_cast<py::ssize_t>(world_size)}),
      a.duplicated_slots, to_numpy(std::move(a.dropped_packs))};
}

void bind_results(py::module_& m) {
  py::class_<PacksResult>(m, "Packs",
                          "Packs in CSR form: the samples of pack p are samples[offsets[p]:offsets[p + 1]].")
      .def_readonly("offsets", &PacksResult::offsets, "int64 (num_packs + 1,), starts at 0")
      .def_readonly("samples", &PacksResult::samples, "int64 (num_samples,), sample ids pack after pack")
      .def("__repr__", [](const PacksResult& r) {
        return "Packs(num_packs=" + std::to_string(r.offsets.size() - 1) +
               ", num_samples=" + std::to_string(r.samples.size()) + ")";
      });
  py::class_<AssignmentResult>(m, "Assignment", "Packs to (step, rank) slots.")
      .def_readonly("step_packs", &AssignmentResult::step_packs, "int64 (num_steps, world_size), pack ids")
      .def_readonly("duplicated_slots", &AssignmentResult::duplicated_slots,
                    "slots of the ragged last step filled by reusing packs")
      .def_readonly("dropped_packs", &AssignmentResult::dropped_packs, "int64 (k,), packs left out by drop_last")
      .def("__repr__", [](const AssignmentResult& r) {
        return "Assignment(num_steps=" + std::to_string(r.step_packs.shape(0)) +
               ", duplicated_slots=" + std::to_string(r.duplicated_slots) +
               ", dropped_packs=" + std::to_string(r.dropped_packs.size()) + ")";
      });
  py::class_<BalancedPlanResult>(m, "BalancedPlan", "The balanced method's packs and their assignment.")
      .def_readonly("packs", &BalancedPlanResult::packs)
      .def_readonly("assignment", &BalancedPlanResult::assignment);
  py::class_<LengthRecordsResult>(m, "LengthRecords", "Per-sample loads read from length records.")
      .def_readonly("vit", &LengthRecordsResult::vit, "int64 (num_records,)")
      .def_readonly("llm", &LengthRecordsResult::llm, "int64 (num_records,)")
      .def_readonly("vit_seqlens", &LengthRecordsResult::vit_seqlens,
                    "int64 (total,): every record's ViT sequence lengths, one run after another; None if no "
                    "record has the key")
      .def_readonly("vit_seqlens_offsets", &LengthRecordsResult::vit_seqlens_offsets,
                    "int64 (num_records + 1,) from 0: record i's run starts at [i] and ends at [i + 1]; or None")
      .def_readonly("vit_seqlens_given", &LengthRecordsResult::vit_seqlens_given,
                    "bool (num_records,): whether record i has the key (else its run is empty); or None")
      .def_readonly("label", &LengthRecordsResult::label,
                    "int64 (num_records,): label token counts, -1 where a record has none; None if no record has "
                    "the key")
      .def_readonly("error", &LengthRecordsResult::error, "empty on success, else what went wrong and where")
      .def_readonly("error_sample", &LengthRecordsResult::error_sample, "the failing sample's index, or -1");
  py::class_<omnibal::LoadStats>(m, "LoadStats", "Totals and maxima of both loads in one pass.")
      .def_readonly("vit_sum", &omnibal::LoadStats::vit_sum)
      .def_readonly("llm_sum", &omnibal::LoadStats::llm_sum)
      .def_readonly("vit_max", &omnibal::LoadStats::vit_max)
      .def_readonly("llm_max", &omnibal::LoadStats::llm_max)
      .def_readonly("llm_sum_binned", &omnibal::LoadStats::llm_sum_binned,
                    "the LLM total with every sample rounded up to llm_bin tokens");
}

// The packs, their totals and the steps of a pass run alone on packs given (spill_to_room, raise_stuck_steps),
// checked; `run(packs, totals, loads, costs, cap, steps)` runs without the GIL and returns the pass's count.
template <typename Run>
std::pair<omnibal::Packs, int64_t> run_step_pass(const py::object& vit, const py::object& llm,
                                                 const py::object& offsets, const py::object& samples,
                                                 const py::object& sample_costs, double per_pack, int64_t vit_capacity,
                                                 int64_t llm_capacity, const py::object& order, Index world_size,
                                                 Run&& run) {
  const LoadArrays loads(vit, llm);
  const Capacity cap = as_capacity(vit_capacity, llm_capacity);
  const CostArray costs(sample_costs, loads.size());
  if (costs.dims != 1) throw std::invalid_argument("sample_costs must be (N,): one cost part");
  check_world_size(world_size);
  const IntArray off = as_1d_int64(offsets, "offsets"), smp = as_1d_int64(samples, "samples");
  const IntArray ord = as_1d_int64(order, "order");
  check_csr(off, smp.size());
  omnibal::Packs packs;
  packs.offsets.assign(off.data(), off.data() + off.size());
  packs.samples.assign(smp.data(), smp.data() + smp.size());
  for (const Index i : packs.samples) {
    if (i < 0 || i >= loads.size()) throw std::invalid_argument("samples: id " + std::to_string(i) + " out of range");
  }
  omnibal::LargeVector<Index> steps(ord.data(), ord.data() + ord.size());
  for (const Index p : steps) {
    if (p < 0 || p >= packs.size()) throw std::invalid_argument("order: pack " + std::to_string(p) + " out of range");
  }
  if (steps.size() % static_cast<size_t>(world_size) != 0) {
    throw std::invalid_argument("order: its length must be a multiple of world_size");
  }
  const omnibal::SampleCosts view{costs.cost.data(), 1, per_pack};
  const omnibal::Loads l = loads.view();
  omnibal::PackLoads totals;
  totals.vit.assign(static_cast<size_t>(packs.size()), 0);
  totals.llm.assign(static_cast<size_t>(packs.size()), 0);
  for (Index p = 0; p < packs.size(); ++p) {
    for (Index k = packs.offsets[static_cast<size_t>(p)]; k < packs.offsets[static_cast<size_t>(p) + 1]; ++k) {
      totals.vit[static_cast<size_t>(p)] += l.vit[packs.samples[static_cast<size_t>(k)]];
      totals.llm[static_cast<size_t>(p)] += l.llm[packs.samples[static_cast<size_t>(k)]];
    }
  }
  int64_t count = 0;
  {
    py::gil_scoped_release release;
    omnibal::fill_pack_costs(packs, view, totals);
    count = run(packs, totals, l, view, cap, steps);
  }
  return {std::move(packs), count};
}

void bind_grouping(py::module_& m) {
  m.attr("BEST_FIT_CHUNK") = omnibal::kBestFitChunk;
  m.def(
      "random_next_fit",
      [](const py::object& vit, const py::object& llm, const py::object& items, int64_t vit_capacity,
         int64_t llm_capacity, uint64_t seed) {
        const LoadArrays loads(vit, llm);
        const IdArray ids(items, "items", loads.size(), true);
        const Capacity cap = as_capacity(vit_capacity, llm_capacity);
        omnibal::Packs packs;
        {
          py::gil_scoped_release release;
          packs = omnibal::random_next_fit(loads.view(), ids.set, cap, seed);
        }
        return packs_result(std::move(packs));
      },
      py::arg("vit"), py::arg("llm"), py::arg("items"), py::arg("vit_capacity"), py::arg("llm_capacity"),
      py::arg("seed"), "Random next-fit packing of `items` (None: every sample); returns Packs.");

  m.def(
      "isf",
      [](const py::object& vit, const py::object& llm, const py::object& items, int64_t vit_capacity,
         int64_t llm_capacity, int64_t vit_threshold, int64_t llm_threshold, int iterations, uint64_t seed) {
        const LoadArrays loads(vit, llm);
        const IdArray ids(items, "items", loads.size(), true);
        const Capacity cap = as_capacity(vit_capacity, llm_capacity);
        omnibal::Packs packs;
        {
          py::gil_scoped_release release;
          packs = omnibal::isf(loads.view(), ids.set, cap, vit_threshold, llm_threshold, iterations, seed);
        }
        return packs_result(std::move(packs));
      },
      py::arg("vit"), py::arg("llm"), py::arg("items"), py::arg("vit_capacity"), py::arg("llm_capacity"),
      py::arg("vit_threshold"), py::arg("llm_threshold"), py::arg("iterations"), py::arg("seed"),
      "Iterative sampling and filtering (OmniBal) of `items` (None: every sample); returns Packs.");

  m.def(
      "spill_to_room",
      [](const py::object& vit, const py::object& llm, const py::object& offsets, const py::object& samples,
         const py::object& sample_costs, double per_pack, int64_t vit_capacity, int64_t llm_capacity,
         const py::object& order, Index world_size) {
        auto [packs, moved] = run_step_pass(
            vit, llm, offsets, samples, sample_costs, per_pack, vit_capacity, llm_capacity, order, world_size,
            [&](omnibal::Packs& p, omnibal::PackLoads& t, const omnibal::Loads& l, const omnibal::SampleCosts& c,
                Capacity cap, const omnibal::LargeVector<Index>& steps) {
              return omnibal::spill_to_room(p, t, l, c, cap, steps, world_size);
            });
        return py::make_tuple(packs_result(std::move(packs)), moved);
      },
      py::arg("vit"), py::arg("llm"), py::arg("offsets"), py::arg("samples"), py::arg("sample_costs"),
      py::arg("per_pack"), py::arg("vit_capacity"), py::arg("llm_capacity"), py::arg("order"), py::arg("world_size"),
      "The balanced method's spill pass alone on the given packs, cut into steps of world_size in `order`: "
      "returns (Packs, samples moved).");

  m.def(
      "raise_stuck_steps",
      [](const py::object& vit, const py::object& llm, const py::object& offsets, const py::object& samples,
         const py::object& sample_costs, double per_pack, int64_t vit_capacity, int64_t llm_capacity,
         const py::object& order, Index world_size) {
        std::vector<char> gave;
        auto [packs, swaps] = run_step_pass(
            vit, llm, offsets, samples, sample_costs, per_pack, vit_capacity, llm_capacity, order, world_size,
            [&](omnibal::Packs& p, omnibal::PackLoads& t, const omnibal::Loads& l, const omnibal::SampleCosts& c,
                Capacity cap, const omnibal::LargeVector<Index>& steps) {
              return omnibal::raise_stuck_steps(p, t, l, c, cap, steps, world_size, gave);
            });
        std::vector<bool> gave_steps(gave.begin(), gave.end());
        return py::make_tuple(packs_result(std::move(packs)), swaps, py::array(py::cast(gave_steps)));
      },
      py::arg("vit"), py::arg("llm"), py::arg("offsets"), py::arg("samples"), py::arg("sample_costs"),
      py::arg("per_pack"), py::arg("vit_capacity"), py::arg("llm_capacity"), py::arg("order"), py::arg("world_size"),
      "The balanced method's raise pass alone on the given packs, cut into steps of world_size in `order` (without "
      "the refinement of the steps that gave): returns (Packs, swaps made, bool array: which steps gave).");

  m.def(
      "assign_random",
      [](Index num_packs, Index world_size, bool drop_last, uint64_t seed) {
        if (num_packs < 0) throw std::invalid_argument("num_packs must be >= 0, got " + std::to_string(num_packs));
        check_world_size(world_size);
        omnibal::Assignment a;
        {
          py::gil_scoped_release release;
          a = omnibal::assign_random(num_packs, world_size, drop_last, seed);
        }
        return assignment_result(std::move(a), world_size);
      },
      py::arg("num_packs"), py::arg("world_size"), py::arg("drop_last"), py::arg("seed"),
      "Packs to (step, rank) slots in random order; returns Assignment.");

  m.def(
      "plan_balanced",
      [](const py::object& vit, const py::object& llm, const py::object& items, const py::object& singles,
         int64_t vit_capacity, int64_t llm_capacity, const py::object& sample_costs, double per_pack, int rounds,
         Index world_size, bool drop_last, uint64_t seed, int64_t work_per_sample) {
        const LoadArrays loads(vit, llm);
        const IdArray ids(items, "items", loads.size(), true);
        const IdArray single_ids(singles, "singles", loads.size(), false);
        const Capacity cap = as_capacity(vit_capacity, llm_capacity);
        const CostArray costs(sample_costs, loads.size());
        if (!(std::isfinite(per_pack) && per_pack >= 0.0)) {
          throw std::invalid_argument("per_pack must be a finite cost >= 0, got " + std::to_string(per_pack));
        }
        if (work_per_sample < 0) {
          throw std::invalid_argument("work_per_sample must be >= 0, got " + std::to_string(work_per_sample));
        }
        check_world_size(world_size);
        omnibal::BalancedPlan plan;
        {
          py::gil_scoped_release release;
          const omnibal::SampleCosts sample_costs_view{costs.cost.data(), costs.dims, per_pack};
          plan = omnibal::plan_balanced(loads.view(), ids.set, single_ids.set, cap, sample_costs_view, rounds,
                                        world_size, drop_last, seed, work_per_sample);
        }
        return BalancedPlanResult{packs_result(std::move(plan.packs)),
                                  assignment_result(std::move(plan.assignment), world_size)};
      },
      py::arg("vit"), py::arg("llm"), py::arg("items"), py::arg("singles"), py::arg("vit_capacity"),
      py::arg("llm_capacity"), py::arg("sample_costs"), py::arg("per_pack"), py::arg("rounds"), py::arg("world_size"),
      py::arg("drop_last"), py::arg("seed"), py::arg("work_per_sample"),
      "Best-fit packs of `items` (None: every sample), plus one pack per sample of `singles` (or None), and "
      "their balanced assignment on the float64 per-sample costs, (N,) or (N, 2) for a ViT and an LLM part (a "
      "pack costs its samples' plus per_pack, in the last part; "
      "work_per_sample bounds the step refinement, 0: none); returns BalancedPlan.");
}

void bind_lengths(py::module_& m) {
  m.def(
      "parse_length_records",
      [](const py::buffer& data, const std::string& vit_key, const std::string& llm_key,
         const std::string& vit_seqlens_key, const std::string& label_key) {
        const py::buffer_info info = data.request();
        const omnibal::RecordKeys keys{vit_key, llm_key, vit_seqlens_key, label_key};
        omnibal::LengthRecords rec;
        {
          py::gil_scoped_release release;
          rec = omnibal::parse_length_records(static_cast<const char*>(info.ptr),
                                              static_cast<size_t>(info.size * info.itemsize), keys);
        }
        LengthRecordsResult out;
        out.vit = to_numpy(std::move(rec.vit));
        out.llm = to_numpy(std::move(rec.llm));
        out.error = std::move(rec.error);
        out.error_sample = rec.error_sample;
        if (rec.has_vit_seqlens) {
          out.vit_seqlens = to_numpy(std::move(rec.vit_seqlens));
          out.vit_seqlens_offsets = to_numpy(std::move(rec.vit_seqlens_offsets));
          // One byte per record, shown to numpy as its bool.
          out.vit_seqlens_given = to_numpy(std::move(rec.vit_seqlens_given)).attr("view")("bool");
        }
        if (rec.has_label) out.label = to_numpy(std::move(rec.label));
        return out;
      },
      py::arg("data"), py::arg("vit_key"), py::arg("llm_key"), py::arg("vit_seqlens_key") = "vit_seqlens",
      py::arg("label_key") = "label_num",
      "Reads per-sample length records (JSON list or JSON Lines, strict UTF-8); returns LengthRecords.");

  m.def(
      "load_stats",
      [](const py::object& vit, const py::object& llm, int64_t llm_bin) {
        const LoadArrays loads(vit, llm);
        if (llm_bin < 1) throw std::invalid_argument("llm_bin must be >= 1, got " + std::to_string(llm_bin));
        omnibal::LoadStats s;
        {
          py::gil_scoped_release release;
          s = omnibal::load_stats(loads.vit.data(), loads.llm.data(), loads.size(), llm_bin);
        }
        return s;
      },
      py::arg("vit"), py::arg("llm"), py::arg("llm_bin"), "One pass over the loads; returns LoadStats.");

  m.def(
      "row_square_sums",
      [](const py::object& offsets, const py::object& values) {
        const IntArray o = as_1d_int64(offsets, "offsets");
        const IntArray v = as_1d_int64(values, "values");
        check_csr(o, v.size());
        const Index rows = static_cast<Index>(o.size()) - 1;
        std::vector<double> out(static_cast<size_t>(rows));
        {
          py::gil_scoped_release release;
          omnibal::row_square_sums(o.data(), rows, v.data(), out.data());
        }
        return to_numpy(std::move(out));
      },
      py::arg("offsets"), py::arg("values"),
      "(rows,) float64: every row's sum of squared values (as doubles, added in row order), rows given by CSR "
      "offsets.");

  m.def(
      "sample_costs",
      [](const py::object& vit, const py::object& llm, const py::object& square_sums,
         const std::vector<double>& terms) {
        const LoadArrays loads(vit, llm);
        if (terms.size() != 5) throw std::invalid_argument("terms must have 5 entries");
        const omnibal::CostTerms t{terms[0], terms[1], terms[2], terms[3], terms[4]};
        py::array_t<double, py::array::c_style> squares;
        if (!square_sums.is_none()) {
          squares = py::array_t<double, py::array::c_style>::ensure(square_sums);
          if (!squares || squares.ndim() != 1 || squares.shape(0) != loads.size()) {
            throw std::invalid_argument("square_sums must be a 1-D float64 array with one entry per sample");
          }
        }
        std::vector<double> out(static_cast<size_t>(loads.size()));
        {
          py::gil_scoped_release release;
          omnibal::sample_costs(loads.vit.data(), loads.llm.data(), loads.size(),
                                square_sums.is_none() ? nullptr : squares.data(), t, out.data());
        }
        return to_numpy(std::move(out));
      },
      py::arg("vit"), py::arg("llm"), py::arg("square_sums"), py::arg("terms"),
      "(N,) float64 sample costs under terms [vit_linear, vit_quadratic, llm_linear, llm_quadratic, per_sample] "
      "(CostModel.sample_costs); square_sums: every sample's sum of squared ViT sequence lengths "
      "(Lengths.vit_square_sums), or None for one sequence per sample.");
}

void bind_random(py::module_& m) {
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
      py::arg("seed"), py::arg("a"), py::arg("b") = 0,
      "The seed of one random stream: derive_seed(seed, STREAMS[name], index).");

  m.def(
      "splitmix64", [](uint64_t state) { return omnibal::splitmix64(state); }, py::arg("state"),
      "The output of one SplitMix64 step from `state` (the engine's seed expander).");

  m.def(
      "shuffle",
      [](const py::object& values, uint64_t seed) {
        const IntArray v = as_1d_int64(values, "values");
        std::vector<int64_t> out(v.data(), v.data() + v.size());
        omnibal::Rng rng(seed);
        omnibal::shuffle(out, rng);
        return to_numpy(std::move(out));
      },
      py::arg("values"), py::arg("seed"), "The engine's shuffle of the 1-D integer array `values` with Rng(seed).");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "omnibal_kernels C++ balance engine (grouping and assignment; deterministic from a seed)";
  bind_results(m);
  bind_grouping(m);
  bind_lengths(m);
  bind_random(m);
}
