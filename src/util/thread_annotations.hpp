// Locking the compiler checks: Clang's thread-safety analysis (-Wthread-safety), as LevelDB and Abseil
// use it. A member written `GUARDED_BY(mutex_)` may be touched only with mutex_ held; a function marked
// `REQUIRES(mutex_)` is called only with it held, `EXCLUDES(mutex_)` only without. GCC ignores the
// macros; one CI build compiles with clang and -Werror=thread-safety so a slip fails the build.
//
// std::mutex carries no annotations in libstdc++, hence Mutex and MutexLock below: the same mutex and
// lock, declared as a capability and a scoped capability; and SharedMutex with ReaderLock and
// WriterLock for std::shared_mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

// Abseil's containers bring its own unprefixed GUARDED_BY & co. (the same attributes): included first,
// so that its include guard keeps it from coming back, and replaced by the definitions below.
#include <absl/base/thread_annotations.h>
#undef GUARDED_BY
#undef PT_GUARDED_BY
#undef ACQUIRED_BEFORE
#undef ACQUIRED_AFTER
#undef NO_THREAD_SAFETY_ANALYSIS

#if defined(__clang__)
#define CLAIRFS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CLAIRFS_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) CLAIRFS_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY CLAIRFS_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) CLAIRFS_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) CLAIRFS_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) CLAIRFS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) CLAIRFS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) CLAIRFS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) CLAIRFS_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define EXCLUDES(...) CLAIRFS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) CLAIRFS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) CLAIRFS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) CLAIRFS_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) CLAIRFS_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RETURN_CAPABILITY(x) CLAIRFS_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS CLAIRFS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace clairfs {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mutex_.lock(); }
  void unlock() RELEASE() { mutex_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

// Holds a Mutex for its scope. wait()/wait_for() release it while they sleep, as std::unique_lock's do
// (the analysis sees the mutex held throughout, which is what the code around the wait may assume).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : lock_(mutex.mutex_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  template <class Predicate>
  void wait(std::condition_variable& cv, Predicate done) {
    cv.wait(lock_, done);
  }
  void wait(std::condition_variable& cv) { cv.wait(lock_); }
  template <class Rep, class Period, class Predicate>
  bool wait_for(std::condition_variable& cv, std::chrono::duration<Rep, Period> d, Predicate done) {
    return cv.wait_for(lock_, d, done);
  }
  template <class Rep, class Period>
  void wait_for(std::condition_variable& cv, std::chrono::duration<Rep, Period> d) {
    cv.wait_for(lock_, d);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// A std::shared_mutex: many readers (ReaderLock) or one writer (WriterLock).
class CAPABILITY("shared mutex") SharedMutex {
 public:
  void lock() ACQUIRE() { mutex_.lock(); }
  void unlock() RELEASE() { mutex_.unlock(); }
  void lock_shared() ACQUIRE_SHARED() { mutex_.lock_shared(); }
  void unlock_shared() RELEASE_SHARED() { mutex_.unlock_shared(); }

 private:
  std::shared_mutex mutex_;
};

class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mutex) ACQUIRE_SHARED(mutex) : mutex_(mutex) { mutex_.lock_shared(); }
  ~ReaderLock() RELEASE() { mutex_.unlock_shared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mutex_;
};

class SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~WriterLock() RELEASE() { mutex_.unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mutex_;
};

}  // namespace clairfs
