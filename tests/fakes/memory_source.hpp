// Fakes for engine tests (no kernel, no disk but an NVMe directory where a test wants one):
// MemoryTree, a data set held in memory with its manifest; MemorySource, SOURCE over it, which counts
// every byte read and can change a file, fail or stall on command, and can answer the stager's reads
// late (from a thread of its own, as a disk would), so that files stay in flight for a while.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "clairfs/store.hpp"
#include "io/io_loop.hpp"

namespace clairfs::fakes {

// One class folder "c" holding `sizes.size()` files f00000.jpg, ... with deterministic contents.
struct MemoryTree {
  explicit MemoryTree(const std::vector<uint64_t>& sizes) : manifest(build(sizes)) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::string bytes(sizes[i], '\0');
      for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<char>((i * 131 + k * 7 + k / 251) & 0xff);
      contents.push_back(std::move(bytes));
    }
  }
  // The i-th file's entry, and its bytes.
  EntryId file(size_t i) const { return static_cast<EntryId>(i + 2); }
  const std::string& bytes(EntryId id) const { return contents[id - 2]; }
  size_t files() const { return contents.size(); }
  uint64_t total() const {
    uint64_t t = 0;
    for (const auto& c : contents) t += c.size();
    return t;
  }

  Manifest manifest;
  std::vector<std::string> contents;

 private:
  static Manifest build(const std::vector<uint64_t>& sizes) {
    std::vector<Entry> entries(sizes.size() + 2);
    std::string names = "c";
    entries[0].mode = S_IFDIR | 0755;
    entries[0].first_child = 1;
    entries[0].child_count = 1;
    entries[0].subdir_count = 1;
    entries[1].mode = S_IFDIR | 0755;
    entries[1].name_len = 1;
    entries[1].first_child = 2;
    entries[1].child_count = static_cast<uint32_t>(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "f%05zu.jpg", i);
      Entry& e = entries[i + 2];
      e.mode = S_IFREG | 0644;
      e.size = sizes[i];
      e.parent = 1;
      e.name_off = names.size();
      e.name_len = static_cast<uint16_t>(std::strlen(name));
      names += name;
    }
    return Manifest::from_parts(std::move(entries), std::move(names), default_extensions(), "/");
  }
};

class MemorySource final : public SourceStore {
 public:
  explicit MemorySource(const MemoryTree& tree) : tree_(tree) {}
  ~MemorySource() override {
    {
      std::lock_guard<std::mutex> lock(late_mutex_);
      late_stop_ = true;
    }
    late_cv_.notify_all();
    if (late_thread_.joinable()) late_thread_.join();
  }

  // On command: the file no longer matches the manifest (refused, counted as changed); every read fails
  // with EIO; every read waits this long first.
  void change(EntryId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    changed_files_.insert(id);
  }
  void fail_all(bool on) { fail_ = on; }
  void stall(std::chrono::milliseconds d) { stall_ms_ = d.count(); }
  // The stager's reads (start_fetch) are answered this long after they were asked, one after another.
  // Call before the engine starts.
  void answer_late(std::chrono::milliseconds d) {
    late_ = d;
    late_thread_ = std::thread([this] { answer_loop(); });
  }

  uint64_t bytes_read() const { return bytes_; }
  // The most bytes the stager's reads asked for at once (asked, not yet answered).
  uint64_t peak_fetching() const { return peak_fetching_; }
  uint64_t fetching() const { return fetching_; }  // asked by the stager's reads, not yet answered
  // The files of those reads, in the order they were asked.
  std::vector<EntryId> fetching_files() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return fetching_files_;
  }
  uint64_t reads_of(EntryId id) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = reads_.find(id);
    return it == reads_.end() ? 0 : it->second;
  }

  int fetch(EntryId id, const Buffer& buf) override { return copy(id, buf->data(), buf->size(), 0, true); }
  void start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) override {
    // Answered through the loop like a real completion: on the loop's thread, at its next turn.
    auto post = io.external([done](int64_t rc) { done(static_cast<int>(rc)); });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fetching_files_.push_back(id);
    }
    const uint64_t now = fetching_ += buf->size();
    for (uint64_t peak = peak_fetching_; now > peak && !peak_fetching_.compare_exchange_weak(peak, now);) {
    }
    auto answer = [this, id, buf, post] {
      const int rc = copy(id, buf->data(), buf->size(), 0, true);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        fetching_files_.erase(std::find(fetching_files_.begin(), fetching_files_.end(), id));
      }
      fetching_ -= buf->size();
      post(rc);
    };
    if (late_.count() == 0) return answer();
    {
      std::lock_guard<std::mutex> lock(late_mutex_);
      late_queue_.push_back(std::move(answer));
    }
    late_cv_.notify_all();
  }
  int open(EntryId id, pid_t, uint64_t* handle) override {
    if (const int rc = check(id); rc < 0) return rc;
    *handle = id;
    return 0;
  }
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset) override {
    const EntryId id = static_cast<EntryId>(handle);
    const std::string& b = tree_.bytes(id);
    const size_t start = std::min(b.size(), static_cast<size_t>(offset));
    const size_t n = std::min(size, b.size() - start);
    const int rc = copy(id, buf, n, start, offset == 0);
    return rc < 0 ? rc : static_cast<ssize_t>(n);
  }
  void release(uint64_t) override {}
  uint64_t changed() const override { return changed_count_; }

 private:
  int check(EntryId id) {
    if (stall_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms_.load()));
    if (fail_) return -EIO;
    std::lock_guard<std::mutex> lock(mutex_);
    if (changed_files_.count(id)) {
      changed_count_++;
      return -EIO;
    }
    return 0;
  }
  int copy(EntryId id, char* out, size_t n, size_t offset, bool count_read) {
    if (const int rc = check(id); rc < 0) return rc;
    const std::string& b = tree_.bytes(id);
    if (offset + n > b.size()) return -EIO;
    std::memcpy(out, b.data() + offset, n);
    bytes_ += n;
    if (count_read) {
      std::lock_guard<std::mutex> lock(mutex_);
      reads_[id]++;
    }
    return 0;
  }

  void answer_loop() {
    std::unique_lock<std::mutex> lock(late_mutex_);
    for (;;) {
      late_cv_.wait(lock, [&] { return late_stop_ || !late_queue_.empty(); });
      if (late_stop_) return;
      auto answer = std::move(late_queue_.front());
      late_queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(late_);
      answer();
      lock.lock();
    }
  }

  const MemoryTree& tree_;
  std::chrono::milliseconds late_{0};
  std::mutex late_mutex_;
  std::condition_variable late_cv_;
  std::deque<std::function<void()>> late_queue_;
  bool late_stop_ = false;
  std::thread late_thread_;
  mutable std::mutex mutex_;
  std::unordered_set<EntryId> changed_files_;
  std::unordered_map<EntryId, uint64_t> reads_;
  std::vector<EntryId> fetching_files_;
  std::atomic<uint64_t> bytes_{0}, changed_count_{0}, fetching_{0}, peak_fetching_{0};
  std::atomic<bool> fail_{false};
  std::atomic<int64_t> stall_ms_{0};
};

}  // namespace clairfs::fakes
