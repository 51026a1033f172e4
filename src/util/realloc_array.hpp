// A growable array of trivially copyable values in one malloc'd block, grown and shrunk with realloc.
//
// For the tables a scan builds without knowing their size (at 14.2 M files, 450 MB of entries and 300 MB
// of names). A std::vector grows by allocating twice the size and copying, and shrink_to_fit copies once
// more: the copies cost seconds and hold old and new at once. glibc serves a block past its mmap
// threshold (return_large_buffers) from a mapping of its own, and realloc moves such a block with
// mremap: page tables move, no byte is copied, and the capacity not yet written costs no memory. A
// block sized at once (reserve, resize) asks for huge pages (advise_huge_pages).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>

#include "util/memory.hpp"

namespace clairfs {

template <typename T>
class ReallocArray {
  static_assert(std::is_trivially_copyable_v<T>, "moved by realloc");

 public:
  ReallocArray() = default;
  ReallocArray(const T* from, size_t n) { append(from, n); }
  ~ReallocArray() { std::free(data_); }
  ReallocArray(ReallocArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  ReallocArray& operator=(ReallocArray&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  ReallocArray(const ReallocArray&) = delete;
  ReallocArray& operator=(const ReallocArray&) = delete;

  void push_back(const T& v) {
    if (size_ == cap_) grow(size_ + 1);
    data_[size_++] = v;
  }
  void append(const T* from, size_t n) {
    if (n == 0) return;
    if (cap_ - size_ < n) grow(size_ + n);
    std::memcpy(data_ + size_, from, n * sizeof(T));
    size_ += n;
  }
  // New values are zero bytes.
  void resize(size_t n) {
    reserve(n);
    if (n > size_) std::memset(static_cast<void*>(data_ + size_), 0, (n - size_) * sizeof(T));
    size_ = n;
  }
  void reserve(size_t n) {
    if (n > cap_) {
      set_capacity(n);
      advise();
    }
  }
  void clear() { size_ = 0; }
  void shrink_to_fit() {
    if (cap_ > size_) set_capacity(size_);
  }

  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  // Never null (as std::string's): an empty array's bytes may be passed to memcpy and read(2).
  T* data() { return data_ ? data_ : none(); }
  const T* data() const { return data_ ? data_ : none(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }
  bool empty() const { return size_ == 0; }

 private:
  static T* none() {
    alignas(T) static unsigned char nothing[sizeof(T)];
    return reinterpret_cast<T*>(nothing);
  }
  // Doubling: realloc of a mapped block costs a system call, so not one per value.
  void grow(size_t need) { set_capacity(std::max(need, cap_ < 16 ? 16 : cap_ * 2)); }
  void set_capacity(size_t n) {
    if (n == 0) {
      std::free(data_);
      data_ = nullptr;
      cap_ = 0;
      return;
    }
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    void* p = std::realloc(data_, n * sizeof(T));
    if (!p) throw std::bad_alloc();
    data_ = static_cast<T*>(p);
    cap_ = n;
  }
  // A block sized at once (reserve, resize: a size known ahead) is filled soon after: huge pages spare
  // most of its faults. Not for one grown value by value: measured, a walk of 1.28 M files took 0.1-0.5 s
  // longer (three runs each) with its growing tables advised.
  void advise() { advise_huge_pages(data_, cap_ * sizeof(T)); }

  T* data_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

// Bytes seen as text.
inline std::string_view view(const ReallocArray<char>& a) { return std::string_view(a.data(), a.size()); }

}  // namespace clairfs
