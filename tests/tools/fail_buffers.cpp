// A fault for test_hostile, preloaded into a daemon (LD_PRELOAD): of the allocations of exactly
// CLAIRFS_FAIL_SIZE bytes (libfuse's request buffer), the first CLAIRFS_FAIL_AFTER succeed and the next
// CLAIRFS_FAIL_COUNT fail, as they would near an address-space limit. Everything else is glibc's.
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>

extern "C" void* __libc_malloc(size_t size);

namespace {

long env_long(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atol(v) : 0;
}

std::atomic<long> seen{0};

}  // namespace

extern "C" void* malloc(size_t size) {
  static const long fail_size = env_long("CLAIRFS_FAIL_SIZE");
  if (size != 0 && static_cast<long>(size) == fail_size) {
    const long n = seen.fetch_add(1);
    const long after = env_long("CLAIRFS_FAIL_AFTER");
    if (n >= after && n < after + env_long("CLAIRFS_FAIL_COUNT")) {
      errno = ENOMEM;
      return nullptr;
    }
  }
  return __libc_malloc(size);
}
