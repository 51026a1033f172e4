// A whole file's bytes in memory, as every tier, store and peer hands them on.
//
// A vector of char whose elements are not zeroed when it is made `n` long: every such buffer is about to
// be filled whole by a read (SOURCE, an NVMe copy, a peer's answer), and zeroing it first was 5-7% of
// the stager thread's time reading ~100 KB copies back from NVMe (a `perf record`: the memset, besides
// the page faults of fresh memory, which the read now takes instead). A read that fills less than the
// whole buffer is a failed read: no store hands on a buffer it did not fill, so no reader is ever
// given what was in that memory before.
#pragma once

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace clairfs {

// std::allocator, but for a value made with no initialiser: default-initialised (left as it was for
// char), not value-initialised (zeroed).
template <typename T>
struct UnzeroedAllocator : std::allocator<T> {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = UnzeroedAllocator<U>;
  };
  UnzeroedAllocator() noexcept = default;
  template <typename U>
  UnzeroedAllocator(const UnzeroedAllocator<U>&) noexcept {}

  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <typename T, typename U>
bool operator==(const UnzeroedAllocator<T>&, const UnzeroedAllocator<U>&) noexcept {
  return true;
}

using Bytes = std::vector<char, UnzeroedAllocator<char>>;

}  // namespace clairfs
