// The .clairfs control tree: virtual files that let any loader see what clairfs predicts.
//
//   MOUNTPOINT/.clairfs/README                   what these files are
//   MOUNTPOINT/.clairfs/stats                    the engine's counters (JSON), made afresh when asked
//   MOUNTPOINT/.clairfs/metrics                  the same in Prometheus text (control/metrics.hpp)
//   MOUNTPOINT/.clairfs/order/epoch-E/rank-R     rank R's samples in epoch E, in the order its DataLoader
//                                                loads them: one path relative to the mount root a line
//
// `.clairfs` never appears in a listing of the root (ImageFolder would take it for a class) but opens by
// name. Its inode numbers live far above the manifest's (bit 62 set), so the two never meet. A rank
// file is its rank's sample numbers (4 bytes a line, not the ~30-60 of its text) and the byte offset of
// every kMarkEvery-th line: a read renders only the lines it covers. Its size costs one rendering pass when
// first needed; rank files are kept, newest first, within kCachedBytes, since the kernel asks for the
// size (getattr) before it reads. (Kept whole as text, eight ranks' files of 14.2 M samples held 0.5 GB.)
//
// The live files (stats, metrics) keep one length from one rendering to the next, because they are read
// without opens by default (FUSE no-open mode), where the kernel caches their pages like any file's: their
// attributes are never cached, each read asks for them, a new modification time makes the kernel drop
// its pages — and a reader whose next read comes after a size change would get another rendering's
// bytes, or zeros, after the first one's (a JSON reader saw "Extra data"). So every rendering is padded
// (spaces: after the JSON, at the end of the first HELP line of the metrics) to a multiple of
// kLivePage, never shorter than the last one (nor than ControlConfig::live_reserve, which a mount whose
// ranks appear later — seed=auto learning — starts at); it grows only when the content outgrows it, once
// in a mount's life or a few times. stats prints every
// number right-aligned in a field of kStatsWidth, so its size rarely has a reason to grow. Made afresh
// at most every kLiveRefresh (1 ms), or four times the last rendering's time if that is longer.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/oracle.hpp"

namespace clairfs {

struct ControlAttr {
  uint64_t ino = 0;
  mode_t mode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // 0: the root's
};

// A control file's bytes: a text held whole (README, stats, metrics) or a rank's order, rendered as read.
class ControlFile {
 public:
  virtual ~ControlFile() = default;
  virtual uint64_t size() const = 0;
  // The bytes [off, off + len), cut at the end: a view into the file's own text or into `scratch`.
  virtual std::string_view read(uint64_t off, size_t len, std::string& scratch) const = 0;
  virtual size_t memory_bytes() const = 0;
};

struct ControlConfig {
  uint64_t start_epoch = 0;
  std::optional<uint64_t> epochs;
  std::vector<uint64_t> ranks;  // the ranks this mount serves (listed first)
  uid_t uid = 0;                // owner shown for the virtual files (SOURCE's root owner)
  gid_t gid = 0;
  std::function<std::string()> stats;    // .clairfs/stats (JSON)
  std::function<std::string()> metrics;  // .clairfs/metrics (Prometheus text)
  // seed=auto: the oracle of the seed learned, nullptr until then (no order files meanwhile). Unset: the
  // tree's own oracle.
  std::function<const Oracle*()> learned;
  // True when SOURCE's directory `id` has an ACL beyond its mode bits (named users or groups). Unset: no
  // ACLs are enforced (the mount does not check permissions, or the kernel cannot check ACLs).
  std::function<bool(EntryId)> extended_acl;
  // The length the live files keep from their first rendering on, at least: a mount whose stats gain
  // their ranks later (seed=auto learning, a plan made again for more ranks) starts at the length they
  // will have, so that no reader ever meets the one change of length.
  size_t live_reserve = 0;
};

class ControlTree {
 public:
  static constexpr const char* kName = ".clairfs";

  // Who asks: the mount's owner (and root) see live files made afresh; any other user a rendering up to
  // kOthersRefresh old, so that a user's processes reading them in a loop cannot keep the daemon busy.
  enum class Reader { kOwner, kOther };

  // REQUIRES: manifest and oracle outlive the tree.
  ControlTree(const Manifest& manifest, const Oracle& oracle, ControlConfig config);

  static bool owns(uint64_t ino) { return (ino >> 62) == 1; }
  static uint64_t root_ino();

  // The child `name` of control directory `dir`; nullopt if there is none.
  std::optional<ControlAttr> lookup(uint64_t dir, std::string_view name, Reader who = Reader::kOwner) const;
  std::optional<ControlAttr> getattr(uint64_t ino, Reader who = Reader::kOwner) const;
  // A directory's entries (without "." and ".."), or nullopt if `ino` is no control directory.
  std::optional<std::vector<std::pair<std::string, ControlAttr>>> list(uint64_t dir) const;
  // True for files whose contents change (stats): served uncached when opened, attributes never cached.
  static bool is_live(uint64_t ino);
  // A file's contents; nullptr if `ino` is no control file. A live file's are made afresh (if older than
  // kLiveRefresh, or kOthersRefresh for another user).
  std::shared_ptr<const ControlFile> content(uint64_t ino, Reader who = Reader::kOwner) const;
  // The contents the last getattr or content() described, for reads without a handle.
  std::shared_ptr<const ControlFile> current(uint64_t ino) const;
  // Bytes held by the rank files kept (open ones may hold more).
  size_t cached_bytes() const;

  const ControlConfig& config() const { return config_; }

 private:
  std::shared_ptr<const ControlFile> rank_file(uint64_t epoch, uint64_t rank) const;
  // The oracle the order files follow: the learned one (nullptr until then) or the tree's own.
  const Oracle* order() const { return config_.learned ? config_.learned() : &oracle_; }
  std::optional<ControlAttr> file_attr(uint64_t ino, Reader who = Reader::kOwner) const;

  const Manifest& manifest_;
  const Oracle& oracle_;
  ControlConfig config_;
  std::shared_ptr<const ControlFile> readme_;
  const mode_t order_who_;  // the permission classes that may read order/ (who could list all of SOURCE)

  // Recently built rank files. Guards cache_; never held while the oracle computes.
  mutable std::mutex mutex_;
  mutable std::list<std::pair<uint64_t, std::shared_ptr<const ControlFile>>> cache_;  // most recent first

  // The latest rendering of a live file. live_mutex_ guards both, and is held while they render.
  struct Live {
    std::shared_ptr<const ControlFile> text;
    int64_t made_ns = 0;  // wall clock, strictly increasing: the file's mtime
    std::chrono::steady_clock::time_point at{};
    std::chrono::steady_clock::duration every{};  // made afresh no sooner than this after `at`
  };
  Live live(uint64_t ino, bool refresh, Reader who) const;
  mutable std::mutex live_mutex_;
  mutable Live live_stats_;
  mutable Live live_metrics_;
};

}  // namespace clairfs
