// One pass of statistics over per-sample loads (Lengths.stats on the Python side), and the per-sample sums
// of squared ViT sequence lengths that cost models read.
#include "loads.hpp"

#include <algorithm>
#include <cstdint>

namespace omnibal {

LoadStats load_stats(const int64_t* vit, const int64_t* llm, Index n, int64_t llm_bin) {
  LoadStats s;
  for (Index i = 0; i < n; ++i) {
    s.vit_sum += vit[i];
    s.llm_sum += llm[i];
    s.vit_max = std::max(s.vit_max, vit[i]);
    s.llm_max = std::max(s.llm_max, llm[i]);
    s.llm_sum_binned += (llm[i] + llm_bin - 1) / llm_bin;
  }
  s.llm_sum_binned *= llm_bin;
  return s;
}

namespace {

double square_sum(const int64_t* values, int64_t from, int64_t to) {
  double sum = 0.0;
  for (int64_t j = from; j < to; ++j) {
    const double v = static_cast<double>(values[j]);
    sum += v * v;
  }
  return sum;
}

}  // namespace

void row_square_sums(const int64_t* offsets, Index rows, const int64_t* values, double* out) {
  for (Index i = 0; i < rows; ++i) out[i] = square_sum(values, offsets[i], offsets[i + 1]);
}

void sample_costs(const int64_t* vit, const int64_t* llm, Index n, const double* square_sums, const CostTerms& terms,
                  double* out) {
  for (Index i = 0; i < n; ++i) {
    const double v = static_cast<double>(vit[i]), t = static_cast<double>(llm[i]);
    double c = 0.0;
    if (terms.vit_linear != 0.0) c += v * terms.vit_linear;
    if (terms.vit_quadratic != 0.0) {
      c += (square_sums != nullptr ? square_sums[i] : v * v) * terms.vit_quadratic;
    }
    if (terms.llm_linear != 0.0) c += t * terms.llm_linear;
    if (terms.llm_quadratic != 0.0) c += t * t * terms.llm_quadratic;
    if (terms.per_sample != 0.0) c += terms.per_sample;
    out[i] = c;
  }
}

}  // namespace omnibal
