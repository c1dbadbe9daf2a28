// Vectors for large per-plan buffers (millions of entries).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace omnibal {

// Allocator for the large per-plan buffers: on Linux it asks for transparent huge pages, so that first
// touching a buffer of many megabytes costs a few page faults instead of thousands (the planning part of
// benchmarks/bench_balance.py measures million-sample plans).
template <typename T>
struct LargeBufferAllocator {
  using value_type = T;
  LargeBufferAllocator() = default;
  template <typename U>
  LargeBufferAllocator(const LargeBufferAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    constexpr size_t kHuge = size_t{2} << 20;
    if (bytes >= kHuge) {
      void* p = std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
      if (p == nullptr) throw std::bad_alloc();
      madvise(p, bytes, MADV_HUGEPAGE);
      return static_cast<T*>(p);
    }
#endif
    void* p = std::malloc(bytes);
    if (p == nullptr && bytes > 0) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const LargeBufferAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const LargeBufferAllocator<U>&) const {
    return false;
  }
};

template <typename T>
using LargeVector = std::vector<T, LargeBufferAllocator<T>>;

}  // namespace omnibal
