// One pass of statistics over per-sample loads (Lengths.stats on the Python side).
#include "loads.hpp"

#include <algorithm>

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

}  // namespace omnibal
