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
// The live files (stats, metrics) change while they are read, and are read without opens by default
// (FUSE no-open mode), where nothing is kept per open: the kernel holds one size and one set of pages
// per inode for all its readers, and a reader whose read came after another reader's newer size got
// that rendering's bytes after its own. So each rendering is an inode of its own that never changes:
// the names' entries are never cached (every path walk asks, and is given the latest rendering), while
// a rendering's attributes and pages are cached like any file's. A reader reads the rendering it opened
// to its end, whatever anyone reads meanwhile — as an open of a /proc file does — and no read mixes two.
// A rendering is kept while the kernel holds its inode (lookups counted, forgets subtracted) or while it
// is the latest; past kHeldRenderings or kHeldRenderingBytes held, the latest is given again rather than
// a new one. Made afresh at most every kLiveRefresh (1 ms), or four times the last rendering's time if
// that is longer.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/oracle.hpp"
#include "util/thread_annotations.hpp"

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
  // A live file's name gives its latest rendering, and that rendering counts one lookup more: the caller
  // forgets it again (forget) if the kernel did not get the reply.
  std::optional<ControlAttr> lookup(uint64_t dir, std::string_view name, Reader who = Reader::kOwner) const;
  std::optional<ControlAttr> getattr(uint64_t ino) const EXCLUDES(live_mutex_);
  // A directory's entries (without "." and ".."), or nullopt if `ino` is no control directory.
  std::optional<std::vector<std::pair<std::string, ControlAttr>>> list(uint64_t dir) const;
  // True for a rendering of a live file (stats, metrics): its name's entry is never cached.
  static bool is_live(uint64_t ino);
  // The kernel let go of `n` lookups of `ino`: a rendering no longer held, and not the latest, is gone.
  void forget(uint64_t ino, uint64_t n) const EXCLUDES(live_mutex_);
  // A file's contents; nullptr if `ino` is no control file (or a rendering gone).
  std::shared_ptr<const ControlFile> content(uint64_t ino) const EXCLUDES(live_mutex_, mutex_);
  // Bytes held by the rank files kept (open ones may hold more) and by the renderings held.
  size_t cached_bytes() const EXCLUDES(mutex_);
  // Renderings of the live files held (the latest ones included), and their bytes. Never waits: the
  // stats (rendered under the live files' lock) tell them.
  size_t renderings() const { return renderings_held_.load(std::memory_order_relaxed); }
  size_t rendering_bytes() const { return rendering_bytes_.load(std::memory_order_relaxed); }

  const ControlConfig& config() const { return config_; }

 private:
  std::shared_ptr<const ControlFile> rank_file(uint64_t epoch, uint64_t rank) const EXCLUDES(mutex_);
  // The oracle the order files follow: the learned one (nullptr until then) or the tree's own.
  const Oracle* order() const { return config_.learned ? config_.learned() : &oracle_; }
  std::optional<ControlAttr> file_attr(uint64_t ino) const;

  const Manifest& manifest_;
  const Oracle& oracle_;
  ControlConfig config_;
  std::shared_ptr<const ControlFile> readme_;
  const mode_t order_who_;  // the permission classes that may read order/ (who could list all of SOURCE)

  // Recently built rank files; never held while the oracle computes.
  mutable Mutex mutex_;
  mutable std::list<std::pair<uint64_t, std::shared_ptr<const ControlFile>>> cache_
      GUARDED_BY(mutex_);  // most recent first

  // A live file's renderings. live_mutex_ is held while they render (neither mutex is taken under the other).
  struct Rendering {
    std::shared_ptr<const ControlFile> text;
    int64_t made_ns = 0;   // wall clock, strictly increasing: the rendering's mtime
    uint64_t lookups = 0;  // the kernel's references to its inode
  };
  struct Live {
    uint64_t latest = 0;  // the latest rendering's inode; 0 before the first
    std::chrono::steady_clock::time_point at{};
    std::chrono::steady_clock::duration every{};  // made afresh no sooner than this after `at`
  };
  // The latest rendering of live file `which` (0 stats, 1 metrics), made afresh if it is old enough for
  // `who`, with one lookup more.
  ControlAttr look_up_live(uint64_t which, Reader who) const EXCLUDES(live_mutex_);
  ControlAttr rendering_attr(uint64_t ino, const Rendering& r) const;
  void drop(std::unordered_map<uint64_t, Rendering>::iterator it) const REQUIRES(live_mutex_);
  mutable Mutex live_mutex_;
  mutable Live live_[2] GUARDED_BY(live_mutex_);
  mutable std::unordered_map<uint64_t, Rendering> renderings_ GUARDED_BY(live_mutex_);  // by inode
  mutable uint64_t renderings_made_ GUARDED_BY(live_mutex_) = 0;
  // renderings_'s size and bytes, written under live_mutex_.
  mutable std::atomic<size_t> renderings_held_{0};
  mutable std::atomic<size_t> rendering_bytes_{0};
};

}  // namespace clairfs
