// The NVMe tier: whole files kept in a directory on a local disk, each with a checksum.
//
// The tier owns one directory it creates inside the one the user names (`nvme=DIR`), so DIR may hold
// anything else: clairfs creates, reads and removes only what is inside its own directory, and removes
// that directory when the mount ends. Copies are packed end to end into slabs, files of up to
// kSlabBytes named by number: a copy starts where the one before it in its slab ends when that one is
// still held (the block they share is written once), else at the next block. A copy let go has the
// blocks it alone took punched out of its slab (fallocate), and a slab nothing is left in is removed.
// So a file's copy takes its bytes, not its size rounded up to blocks (a 600 B file took 4 KiB, a ~100 KB
// one 2% more than its bytes), and staging reads open one slab, not a file a copy. Where the file
// system cannot punch holes (found at start), each copy gets a slab of its own, removed when it goes.
// Capacity (`nvme_size`, default 90% of what DIR's file system has free at mount) is a hard limit on the
// disk the copies held and those being written take, counted in the blocks they cover, which is what
// `used` says; a copy's room is reserved as its size in whole blocks, which is never less than it takes.
// As a store (clairfs/store.hpp) the tier reads its copies — whole, synchronously for a miss or on the
// stager's IoLoop — and checks each against the checksum taken when it was written: a damaged copy is
// removed, counted and logged, and the caller goes on to the next store. It writes the copies the stager
// offers it (room reserved first, by the engine's next-use admission). A write that fails for lack of
// space (ENOSPC, EDQUOT, a short write: the disk holds less than the capacity said, others filled it)
// brings the capacity down to what is held, and admission goes on within it (next-use eviction makes
// room); one that fails because the directory is no longer writable (EROFS, EACCES, EPERM) stops
// admission for the rest of the mount. Everything else keeps working.
//
// Thread-safe: one mutex guards the index (a leaf lock: taken after the engine's, never held across I/O).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "clairfs/manifest.hpp"
#include "clairfs/store.hpp"
#include "util/fs.hpp"
#include "util/thread_annotations.hpp"

struct statvfs;

namespace clairfs {

// What an NVMe tier holds on a file system (`fs`: its statvfs, nullptr where it could not be read):
// `capacity` bytes (0 asked: 90% of what is free there) in blocks of the file system's size. The tier and
// the room a node tells the others (keeper_room) both take it from here.
struct NvmeSpace {
  uint64_t capacity = 0;
  uint64_t block = 4096;
};
NvmeSpace nvme_space(const struct statvfs* fs, uint64_t capacity);
// Whether a tier in `dir` packs its copies (its file system punches holes): tried in a folder of its own
// made there and removed. Then a copy takes its bytes, not whole blocks.
bool nvme_packs(const std::string& dir);

// The NVMe directory cannot be used (a start-up error: the mount is refused).
struct NvmeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The NVMe tier as the staging core admits copies to it (StagingCore::admit, make_nvme_room): room
// reserved for a copy, copies let go, whether one is held. NvmeTier keeps the copies; a simulation of
// the daemon counts them alone (bench/core_driver.hpp).
class StagedNvme {
 public:
  virtual ~StagedNvme() = default;
  virtual bool admitting() const = 0;  // admission has not stopped
  virtual uint64_t capacity() const = 0;
  // Fails when admission has stopped or the bytes would pass the capacity.
  virtual bool reserve(uint64_t bytes) = 0;
  virtual uint64_t erase(EntryId id) = 0;  // the bytes freed
  virtual bool may_hold(EntryId id) const = 0;
};

class NvmeTier final : public Store, public StagedNvme {
 public:
  // Copies packed where the file system can punch holes, or a slab each (as where it cannot).
  enum class Packing { kWhereItCan, kNever };
  // Creates the tier's directory inside `dir`. Throws NvmeError with one line if `dir` is not a writable
  // directory. REQUIRES: manifest outlives the tier (it names files in log lines).
  // `slab_bytes`: a slab's size at most (kSlabBytes; tests make it small).
  NvmeTier(const Manifest& manifest, const std::string& dir, uint64_t capacity, Packing packing = Packing::kWhereItCan,
           uint64_t slab_bytes = kSlabBytes);
  ~NvmeTier() override;  // removes its files and its directory
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  static uint64_t checksum(const char* data, size_t size);
  // Slab `number`'s name inside dir_fd().
  static std::string slab_name(uint32_t number);
  // A slab's size at most (it takes the copy that passes it, then the next copy starts a slab).
  static constexpr uint64_t kSlabBytes = uint64_t{1} << 30;

  int dir_fd() const { return dir_.get(); }
  const std::string& path() const { return path_; }

  // Store: copies held here, checked against their checksums.
  Origin origin() const override { return Origin::kNvme; }
  bool may_hold(EntryId id) const override { return copy_of(id).has_value(); }
  int fetch(EntryId id, const Buffer& buf) override;
  void start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) override;
  // Writes the copy to its file; its room must have been reserved (reserve()). 0 once it is held.
  void start_offer(IoLoop& io, EntryId id, FileBytes bytes, Done done) override;
  bool keeps_copies() const override { return admitting(); }

  static constexpr uint32_t kNoSlab = 0;  // an empty file's copy takes no slab
  struct Held {
    uint64_t size;
    uint64_t checksum;
    uint32_t slab = kNoSlab;
    uint64_t offset = 0;  // in its slab
  };
  std::optional<Held> copy_of(EntryId id) const;

  // Admission (StagedNvme).
  bool admitting() const override;
  bool reserve(uint64_t bytes) override;
  void unreserve(uint64_t bytes);
  // Where a copy of `size` bytes is written: its slab (opened for writing, for this write) and its place
  // there, which counts as taken from now on. -errno if the slab could not be made or opened.
  struct Place {
    uint32_t slab = kNoSlab;
    uint64_t offset = 0;
    std::shared_ptr<UniqueFd> fd;
  };
  int place(uint64_t size, Place* out);
  // A write finished: the reservation becomes a held copy at `at`.
  void commit(EntryId id, const Place& at, uint64_t size, uint64_t checksum);
  // A write failed: lets its place go, gives back the reservation; `error` (-errno, or 0 for a short
  // write) lowers the capacity to what is held when it means the disk is full, and stops admission when
  // the directory is no longer writable. Returns what it did, for the log.
  enum class Abandoned { kRetried, kLowered, kStopped };
  Abandoned abandon(const Place& at, uint64_t size, int error);
  // The room a copy of `size` bytes is reserved: whole blocks (what it takes on disk at most).
  uint64_t on_disk(uint64_t size) const { return (size + block_ - 1) / block_ * block_; }
  // Removes a held copy (evicted, or found corrupt). Returns the bytes of disk freed.
  uint64_t erase(EntryId id) override;
  // Copies are packed (holes can be punched here), not a slab each.
  bool packs() const { return packs_; }
  uint64_t slabs() const;

  uint64_t capacity() const override;
  uint64_t used() const;  // held + reserved
  uint64_t files() const;
  uint64_t writes() const { return writes_; }
  uint64_t write_failures() const { return write_failures_; }
  uint64_t checksum_failures() const { return checksum_failures_; }
  // Copies that could not be opened or read (gone from the disk, an I/O error): each is forgotten and
  // read elsewhere; the first is logged.
  uint64_t read_failures() const { return read_failures_; }

 private:
  // A copy found damaged (short, unreadable, or its checksum differs): removed, counted, logged.
  // Not when the copy was let go meanwhile (its blocks punched out under the read): then it is only gone.
  void damaged(EntryId id, const Held& read, const char* instead);
  // Before a read of `id`'s copy into `buf`: 1 and *held the copy to read; 0 if it is empty (nothing to
  // read); -ENOENT if there is none; -EIO if its size is not the file's (let go as damaged, `instead` said).
  int copy_to_read(EntryId id, const Buffer& buf, const char* instead, Held* held);
  // A copy still in the index that could not be opened: forgotten, counted, the first one logged.
  void unreadable(EntryId id, int error, const char* instead);
  // A write failed with `error` (-errno, or 0 for a short write).
  void write_failed(const Place& at, uint64_t size, int error);

  // A slab: the copies in it (and those being written), by offset, and the blocks they cover.
  struct Slab {
    std::map<uint64_t, uint64_t> extents;  // offset -> size
    uint64_t tail = 0;                     // where its last copy ends
    uint64_t blocks = 0;
  };
  // Takes `size` bytes at the end of `slab`: the offset. REQUIRES: size > 0.
  uint64_t append(Slab& slab, uint64_t size) REQUIRES(mutex_);
  // Lets the extent at `offset` of slab `number` go: the blocks it alone covered, [*first, *end) (in
  // blocks), and whether the slab is left empty and removed (then nothing is to be punched).
  bool release(uint32_t number, uint64_t offset, uint64_t* first, uint64_t* end) REQUIRES(mutex_);
  // Gives the disk of a released extent back to the file system (outside the lock).
  void give_back(uint32_t number, bool removed, uint64_t first, uint64_t end);
  // A descriptor slab `number` is read through, opened once (nullptr: none yet, or the slab was removed
  // from the disk by someone else since), and one kept for it. A packed slab holds many copies, and each
  // read of one opened it again: an open and a close a file. Not kept where copies are not packed (a slab
  // a copy, each read once an epoch), nor beyond kReaders slabs, nor for a slab the tier removed meanwhile.
  std::shared_ptr<UniqueFd> reader(uint32_t number) EXCLUDES(mutex_);
  void keep_reader(uint32_t number, const std::shared_ptr<UniqueFd>& fd) EXCLUDES(mutex_);
  static constexpr size_t kReaders = 256;

  const Manifest& manifest_;
  std::string path_;
  UniqueFd dir_;
  uint64_t block_ = 4096;  // the file system's block size (statvfs f_bsize)
  bool packs_ = true;      // holes can be punched
  const uint64_t slab_bytes_;
  uint64_t capacity_ GUARDED_BY(mutex_);
  std::atomic<uint64_t> writes_{0}, write_failures_{0}, checksum_failures_{0}, read_failures_{0};
  std::atomic<bool> unreadable_logged_{false};
  mutable Mutex mutex_;
  std::unordered_map<EntryId, Held> held_ GUARDED_BY(mutex_);
  std::unordered_map<uint32_t, Slab> slabs_ GUARDED_BY(mutex_);
  // Dropped before its slab is removed (an open descriptor would keep the file's blocks).
  std::unordered_map<uint32_t, std::shared_ptr<UniqueFd>> readers_ GUARDED_BY(mutex_);
  uint32_t next_slab_ GUARDED_BY(mutex_) = 1;
  uint32_t current_ GUARDED_BY(mutex_) = kNoSlab;  // the slab copies are appended to
  uint64_t held_bytes_ GUARDED_BY(mutex_) = 0;     // the blocks the slabs' extents cover, in bytes
  uint64_t reserved_ GUARDED_BY(mutex_) = 0;
  bool admitting_ GUARDED_BY(mutex_) = true;
};

}  // namespace clairfs
