// SourceTier: SOURCE as a store (clairfs/store.hpp), beside the other stores, and read directly: one
// descriptor per open file.
//
// Files are opened beneath the SOURCE descriptor taken at mount (no symlink followed, nothing outside
// SOURCE reachable), then checked against the manifest: a file whose type, size or mtime changed since
// the scan is refused with EIO and counted, so a reader never gets bytes that disagree with the sizes
// the kernel was told. Reads are plain preads on that descriptor.
//
// As a store, whole files are read and checked before and after (a file that changes while it is read
// may mix old and new bytes: refused), on the request threads or on the stager's IoLoop, where the open
// goes through io_uring beneath the same descriptor. A mount that stages nothing serves it through
// DirectEngine (engine/direct.hpp).
#pragma once

#include <atomic>
#include <string>

#include "clairfs/manifest.hpp"
#include "clairfs/stats.hpp"
#include "clairfs/store.hpp"
#include "util/fs.hpp"

namespace clairfs {

struct SourceCounters {
  std::atomic<uint64_t> opens{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> changed{0};  // files refused because SOURCE no longer matches the manifest
  std::atomic<uint64_t> errors{0};   // other open/read failures
};

class SourceTier final : public SourceStore {
 public:
  // REQUIRES: `manifest` outlives the reader. Throws std::runtime_error if SOURCE cannot be opened.
  SourceTier(const Manifest& manifest, const std::string& source);

  int open(EntryId id, pid_t pid, uint64_t* handle) override;
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset) override;
  void release(uint64_t handle) override;
  // Opens, reads and closes: a plain mount has no reason to run without opens, but it can.
  ssize_t read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset);

  // SourceStore.
  int fetch(EntryId id, const Buffer& buf) override;
  void start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) override;
  uint64_t changed() const override { return counters_.changed.load(); }

  // Opens `id` in SOURCE and checks it still matches the manifest. Returns the descriptor or -errno
  // (counted and logged like open()'s failures).
  int open_verified(EntryId id);
  // The check open_verified() makes, for a descriptor opened elsewhere (the stager's io_uring): 0 if `fd`
  // still matches the manifest's entry, else -EIO (counted and logged).
  int verify(EntryId id, int fd);

  int root_fd() const { return root_.get(); }
  const SourceCounters& counters() const { return counters_; }
  // The counters as JSON, for .clairfs/stats when no engine stages (ram= not given).
  EngineStats stats() const;

  // Checks up to `samples` files spread over the manifest against SOURCE (exists, same type and size).
  // Returns "" or a one-line description of the first mismatch.
  std::string spot_check(size_t samples) const;

 private:
  ssize_t read_at(EntryId id, int fd, char* buf, size_t size, off_t offset);
  // The stager's read of a file opened as `fd` (checked again after it).
  void start_read(IoLoop& io, EntryId id, std::shared_ptr<UniqueFd> fd, Buffer buf, Done done);

  const Manifest& manifest_;
  UniqueFd root_;
  SourceCounters counters_;
};

}  // namespace clairfs
