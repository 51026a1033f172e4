// FaultyStore: a store that serves another store's bytes as if it were a store of another origin (an
// NVMe tier, a peer) and, on command, fails, corrupts what it returns, or stalls. For tests of what is
// built on stores: the chain, and whatever is given one.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "clairfs/store.hpp"
#include "io/io_loop.hpp"

namespace clairfs::fakes {

class FaultyStore final : public Store {
 public:
  enum class Fault { kNone, kFail, kCorrupt, kStall };

  // REQUIRES: `inner` outlives this store.
  FaultyStore(Store& inner, Origin as) : inner_(inner), origin_(as) {}
  ~FaultyStore() override {
    while (stalled_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  // From now on: kFail answers `error`; kCorrupt flips the first byte of what it returns; kStall answers
  // `stall` later (the asking thread blocks in fetch; start_fetch returns at once).
  void set(Fault fault, int error = -EIO, std::chrono::milliseconds stall = std::chrono::milliseconds(200)) {
    error_ = error;
    stall_ms_ = stall.count();
    fault_ = fault;
  }
  uint64_t asked() const { return asked_; }

  Origin origin() const override { return origin_; }
  bool may_hold(EntryId id) const override { return inner_.may_hold(id); }

  int fetch(EntryId id, const Buffer& buf) override {
    asked_++;
    const Fault fault = fault_;
    if (fault == Fault::kStall) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms_.load()));
    return finish(fault, inner_.fetch(id, buf), buf);
  }

  void start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) override {
    asked_++;
    const Fault fault = fault_;
    auto post = io.external([done](int64_t rc) { done(static_cast<int>(rc)); });
    const int rc = finish(fault, inner_.fetch(id, buf), buf);
    if (fault != Fault::kStall) return post(rc);
    stalled_++;
    std::thread([this, post, rc] {
      std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms_.load()));
      post(rc);
      stalled_--;
    }).detach();
  }

 private:
  int finish(Fault fault, int rc, const Buffer& buf) const {
    if (fault == Fault::kFail) return error_;
    if (fault == Fault::kCorrupt && rc == 0 && !buf->empty()) (*buf)[0] = static_cast<char>((*buf)[0] ^ 0x5a);
    return rc;
  }

  Store& inner_;
  const Origin origin_;
  std::atomic<Fault> fault_{Fault::kNone};
  std::atomic<int> error_{-EIO};
  std::atomic<int64_t> stall_ms_{200};
  std::atomic<uint64_t> asked_{0};
  std::atomic<int> stalled_{0};
};

}  // namespace clairfs::fakes
