// The NVMe tier: whole files kept in a directory on a local disk, each with a checksum.
//
// The tier owns one directory it creates inside the one the user names (`nvme=DIR`), so DIR may hold
// anything else: clairfs creates, reads and removes only what is inside its own directory, and removes
// that directory when the mount ends. Files are named by entry id. Capacity (`nvme_size`, default 90% of
// what DIR's file system has free at mount) is a hard limit on the bytes held plus those being written.
// The engine writes and reads the bytes (through its io_uring); the tier keeps the index: which files
// are held, their sizes and checksums. A write that fails for lack of space (ENOSPC, EDQUOT, a short
// write) or because the directory is no longer writable (EROFS, EACCES, EPERM) stops admission for the
// rest of the mount; everything else keeps working.
//
// Thread-safe: one mutex guards the index; it is never held across I/O but unlink().
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "clairfs/manifest.hpp"
#include "util/fs.hpp"

namespace clairfs {

// The NVMe directory cannot be used (a start-up error: the mount is refused).
struct NvmeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class NvmeTier {
 public:
  // Creates the tier's directory inside `dir`. Throws NvmeError with one line if `dir` is not a writable
  // directory.
  NvmeTier(const std::string& dir, uint64_t capacity);
  ~NvmeTier();  // removes its files and its directory
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  static uint64_t checksum(const char* data, size_t size);
  // The file's name inside dir_fd().
  static std::string name(EntryId id);

  int dir_fd() const { return dir_.get(); }
  const std::string& path() const { return path_; }

  struct Held {
    uint64_t size;
    uint64_t checksum;
  };
  std::optional<Held> find(EntryId id) const;

  // Admission. reserve() fails when admission has stopped or the bytes would pass the capacity.
  bool admitting() const;
  bool reserve(uint64_t bytes);
  void unreserve(uint64_t bytes);
  // Creates (or truncates) id's file for writing: an fd, or -errno.
  int create(EntryId id);
  // A write finished: the reservation becomes a held file.
  void commit(EntryId id, uint64_t size, uint64_t checksum);
  // A write failed: removes the file, gives back the reservation; `error` (-errno, or 0 for a short
  // write) stops admission when it means the disk is full or no longer writable. Returns true if
  // admission stopped now.
  bool abandon(EntryId id, uint64_t size, int error);
  // Removes a held file (evicted, or found corrupt). Returns the bytes freed.
  uint64_t erase(EntryId id);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const;  // held + reserved
  uint64_t files() const;

 private:
  std::string path_;
  UniqueFd dir_;
  uint64_t capacity_;
  mutable std::mutex mutex_;  // guards everything below
  std::unordered_map<EntryId, Held> held_;
  uint64_t held_bytes_ = 0;
  uint64_t reserved_ = 0;
  bool admitting_ = true;
};

}  // namespace clairfs
