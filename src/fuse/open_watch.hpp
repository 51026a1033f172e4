// Every open and close of the mount's files, seen without a FUSE request.
//
// In FUSE no-open mode the kernel opens and closes files without a word to the daemon, and a file whose
// pages it holds is read with no request at all: the opens that say where each reader is never reach
// us. A fanotify group with a mark on each of the mount's directories (FAN_OPEN | FAN_CLOSE_NOWRITE of
// its children) is told of each one, with the opener's thread (as root; a user's group, the process), at
// a cost to the opener of one queued event. The watch's thread reads the events and a second thread
// hands each to the engine (Engine::opened, Engine::closed), so that the kernel's queue is drained
// however busy the engine is.
//
// Each event names its file by a file handle (FAN_REPORT_FID), which for FUSE holds the node id: the
// entry's inode number (Frontend::ino_of). No descriptor is opened for the watch, so no event keeps the
// mount busy. Opens by the daemon's own process, of the control files and of anything not a regular
// file of the data set, are left out. A user's daemon is not told other processes' pids (the engine then
// places opens by their files alone).
//
// When events are lost (the kernel's queue, 16,384 events, overflowed while this thread was behind), the
// engine is told (Engine::opens_lost), which counts it. On a kernel that cannot report FUSE's handles
// (before 6.8, whose fanotify refuses a file system with no fsid), without fanotify, with more
// directories than a user may mark, or when the kernel sends opens anyway (no no-open support), the
// watch does not start and the log says why; the engine then keeps inferring opens from first reads
// (its stats say `"progress": {"from": "reads"}`).
#pragma once

#include <sys/fanotify.h>
#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "clairfs/engine.hpp"
#include "clairfs/manifest.hpp"
#include "fuse/frontend.hpp"
#include "util/fs.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

class OpenWatch {
 public:
  // Starts the thread, which marks the directories of the clairfs mount at `mountpoint_abs` (made by this user: see
  // open_own_clairfs_mount) once the session answers, and waits for the kernel's INIT to know whether
  // opens reach the daemon anyway. REQUIRES: manifest, engine and frontend outlive the watch; the
  // session goes first (the mark may wait for the session to answer, which a session gone ends).
  // `started` is called once, on the watch's thread, when it watches or has given up. Root's watch marks
  // through a copy of the mount (clone_), so the mount may be unmounted while it marks; a user's watch
  // holds the mount while it marks (an unmount meanwhile fails with EBUSY: the mount command returns
  // only once marked, but with -f the mount is visible before).
  OpenWatch(const std::string& mountpoint_abs, const Manifest& manifest, Engine& engine, const Frontend& frontend,
            std::function<void()> started = {});
  // Stops and joins the thread.
  ~OpenWatch();
  OpenWatch(const OpenWatch&) = delete;
  OpenWatch& operator=(const OpenWatch&) = delete;

 private:
  void run();
  // Gives the calling thread a table of descriptors of its own, without /dev/fuse's; false if it cannot.
  static bool own_descriptors();
  // Marks the mount's directories number `part`, `part + parts`, ... in `group` (on a thread with its own
  // descriptors); `holds_dirs`: by entry, whether it holds directories. "" or why not.
  std::string mark(int group, const std::vector<bool>& holds_dirs, unsigned part, unsigned parts);
  // Lists, through the mount at `root`, the directories that hold directories (those of this part): the
  // kernel keeps the full entries of a listing (READDIRPLUS), so the marks find their directories
  // without a lookup each.
  void list_parents(int root, const std::vector<bool>& holds_dirs, unsigned part, unsigned parts) const;
  // Waits for the session, marks the directories, starts the dispatcher: whether it watches.
  bool start();
  // Says why the mount's opens are not watched (the engine follows reads), lets the group go: false.
  bool give_up(const std::string& why);
  // Reads the events until stopped.
  void drain();
  // Marks the mount; "" or why not.
  std::string watch();
  struct Event {
    EntryId id;
    pid_t pid;
    uint8_t what;  // of the flags below
    static constexpr uint8_t kOpen = 1, kClose = 2, kLost = 4;
  };
  void handle(const char* events, size_t len);
  // The entry an event names, if any.
  std::optional<EntryId> entry_of(const fanotify_event_metadata& m) const;
  // FUSE's file handle type (fuse_encode_fh): the node id's high and low words, then its generation.
  static constexpr int kFuseHandle = 0x81;
  void pass_on(std::vector<Event> batch) EXCLUDES(queue_mutex_);
  void dispatch() EXCLUDES(queue_mutex_);

  const std::string mountpoint_;
  const Manifest& manifest_;
  Engine& engine_;
  const Frontend& frontend_;
  const pid_t self_;
  std::function<void()> started_;
  // Root's own copy of the mount (a detached clone of it, made before the session answers), through which the
  // directories are marked: a descriptor held in the user's mount would make its unmount fail (EBUSY) for as
  // long as marking takes. Empty for a user's daemon (which may not clone a mount); closed once marked.
  UniqueFd clone_;
  UniqueFd group_;  // the fanotify group
  UniqueFd stop_;   // an eventfd: written to stop the thread
  Mutex queue_mutex_;
  std::condition_variable ready_;
  std::deque<Event> pending_ GUARDED_BY(queue_mutex_);
  bool stopping_ GUARDED_BY(queue_mutex_) = false;
  bool lost_ GUARDED_BY(queue_mutex_) = false;  // events dropped before they were queued
  std::thread thread_;      // reads the events
  std::thread dispatcher_;  // hands them to the engine
};

}  // namespace clairfs
