// Fakes for engine tests: LoopbackNet joins several engines in one process as peer nodes (answers come
// on the net's own thread, as a real transport's do), and each node can refuse everything or vanish on
// command; PageCacheDouble stands for the kernel's page cache, recording pushes and drops and answering
// whether it holds a file (what was pushed and not dropped, or everything while told it holds all).
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

#include "clairfs/peer.hpp"
#include "tiers/page_cache.hpp"

namespace clairfs::fakes {

class LoopbackNet {
 public:
  explicit LoopbackNet(int nodes) : lookups_(nodes), refusing_(nodes), gone_(nodes) {
    for (int n = 0; n < nodes; ++n) refusing_[n] = gone_[n] = false;
    thread_ = std::thread([this] { run(); });
  }
  ~LoopbackNet() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  int nodes() const { return static_cast<int>(lookups_.size()); }
  void refuse(int node, bool on) { refusing_[node] = on; }
  void vanish(int node) { gone_[node] = true; }
  bool gone(int node) const { return gone_[node]; }

  void set_lookup(int node, PeerTransport::Lookup lookup) {
    std::lock_guard<std::mutex> lock(mutex_);
    lookups_[node] = std::move(lookup);
  }
  void send(int owner, EntryId id, std::shared_ptr<Bytes> buf, PeerTransport::Done done) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Request{owner, id, std::move(buf), std::move(done)});
    }
    cv_.notify_all();
  }
  std::atomic<uint64_t> served{0}, refused{0};

 private:
  struct Request {
    int owner;
    EntryId id;
    std::shared_ptr<Bytes> buf;
    PeerTransport::Done done;
  };
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Request r = std::move(queue_.front());
      queue_.pop_front();
      PeerTransport::Lookup lookup = lookups_[r.owner];
      lock.unlock();
      int64_t result = -EHOSTDOWN;
      if (!gone_[r.owner]) {
        PeerBytes bytes = refusing_[r.owner] || !lookup ? nullptr : lookup(r.id);
        result = -ENOENT;
        if (bytes && bytes->size() == r.buf->size()) {
          std::memcpy(r.buf->data(), bytes->data(), bytes->size());
          result = static_cast<int64_t>(bytes->size());
          served++;
        } else {
          refused++;
        }
      }
      r.done(result);
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<PeerTransport::Lookup> lookups_;
  std::vector<std::atomic<bool>> refusing_, gone_;
  std::deque<Request> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class LoopbackPeer final : public PeerTransport {
 public:
  LoopbackPeer(LoopbackNet& net, int node) : net_(net), node_(node) {}
  int node() const override { return node_; }
  int nodes() const override { return net_.nodes(); }
  void start(Lookup lookup) override { net_.set_lookup(node_, std::move(lookup)); }
  void fetch(int owner, EntryId id, std::shared_ptr<Bytes> buf, Done done) override {
    requests_++;
    net_.send(owner, id, std::move(buf), std::move(done));
  }
  bool usable(int owner) const override { return !net_.gone(owner); }
  Counters counters() const override {
    Counters c;
    c.requests = requests_;
    return c;
  }
  void stop() override { net_.set_lookup(node_, nullptr); }

 private:
  LoopbackNet& net_;
  const int node_;
  std::atomic<uint64_t> requests_{0};
};

class PageCacheDouble final : public PageCache {
 public:
  // Like the kernel, a push or a drop of a file waits while a read of it holds its pages locked (the
  // test says when: lock() before the read, unlock() after).
  int push(EntryId id, const char*, size_t) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_unlocked(lock, id);
    if (refuse_ || (only_known_ && !known_.count(id))) {
      refused_++;
      return -ENOENT;
    }
    pushed_.insert(id);
    pushes_++;
    peak_held_ = std::max(peak_held_, pushed_.size());
    if (push_time_.count() > 0) {  // the copy into the kernel takes a while
      lock.unlock();
      std::this_thread::sleep_for(push_time_);
    }
    return 0;
  }
  int drop(EntryId id) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_unlocked(lock, id);
    pushed_.erase(id);
    if (hold_all_) dropped_.insert(id);
    drops_++;
    return 0;
  }
  int probe(EntryId id, uint64_t, std::function<void(int64_t)> answer) override {
    bool held = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held = holds_locked(id);
      probes_++;
    }
    answer(held ? 1 : 0);
    return 0;
  }
  // Like the kernel: only files given an inode (introduce(), as a lookup or a listing does) take pushes.
  void only_known(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    only_known_ = on;
  }
  void introduce(EntryId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (known_.insert(id).second) introductions_++;
  }
  bool knows(EntryId id) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return !only_known_ || known_.count(id);
  }
  uint64_t introductions() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return introductions_;
  }
  uint64_t refused() {
    std::lock_guard<std::mutex> lock(mutex_);
    return refused_;
  }
  // From now on every file's pages are held but those dropped since (true), or none but those pushed
  // (false: the kernel took back what the readers read).
  void hold_all(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    hold_all_ = on;
    dropped_.clear();
    if (!on) pushed_.clear();
  }
  // Whether a read of the file would be served from its pages (reaching no daemon).
  bool holds(EntryId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return holds_locked(id);
  }
  // The file was read through the daemon: its pages are held again.
  void read_through(EntryId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped_.erase(id);
  }
  uint64_t probes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return probes_;
  }
  void lock(EntryId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    locked_.insert(id);
  }
  void unlock(EntryId id) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      locked_.erase(id);
    }
    unlocked_.notify_all();
  }
  // Pushes and drops waiting for a lock now.
  unsigned waiting() {
    std::lock_guard<std::mutex> lock(mutex_);
    return waiting_;
  }
  void refuse(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    refuse_ = on;
  }
  void push_takes(std::chrono::milliseconds t) {
    std::lock_guard<std::mutex> lock(mutex_);
    push_time_ = t;
  }
  uint64_t pushes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pushes_;
  }
  uint64_t drops() {
    std::lock_guard<std::mutex> lock(mutex_);
    return drops_;
  }
  size_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pushed_.size();
  }
  // The most files held pushed at once.
  size_t peak_held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_held_;
  }

 private:
  bool holds_locked(EntryId id) const { return (hold_all_ && !dropped_.count(id)) || pushed_.count(id); }
  void wait_unlocked(std::unique_lock<std::mutex>& lock, EntryId id) {
    waiting_++;
    unlocked_.wait(lock, [&] { return !locked_.count(id); });
    waiting_--;
  }

  mutable std::mutex mutex_;
  bool only_known_ = false;
  std::set<EntryId> known_;
  uint64_t introductions_ = 0;
  uint64_t refused_ = 0;
  std::condition_variable unlocked_;
  unsigned waiting_ = 0;
  bool refuse_ = false;
  bool hold_all_ = false;
  std::chrono::milliseconds push_time_{0};
  std::unordered_set<EntryId> pushed_, locked_, dropped_;
  size_t peak_held_ = 0;
  uint64_t pushes_ = 0, drops_ = 0, probes_ = 0;
};

}  // namespace clairfs::fakes
