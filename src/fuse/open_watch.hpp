// Every open and close of the mount's files, seen without a FUSE request.
//
// In FUSE no-open mode the kernel opens and closes files without a word to the daemon, and a file whose
// pages it holds is read with no request at all: the opens that say where each reader is never reach
// us. A fanotify group with a mark on the mount (FAN_OPEN | FAN_CLOSE_NOWRITE) is told of each one, with
// the opener's process, at a cost to the opener of one queued event (the daemon's thread does the rest).
// The watch's thread reads the events and a second thread hands each to the engine (Engine::opened,
// Engine::closed): each event holds the mount until it is read (an unmount meanwhile fails as busy), so
// the reading thread does nothing else and never waits on the engine.
//
// Each event carries a descriptor the kernel opened for us on the file (FUSE has no file handles that
// fanotify can report instead: its fsid is zero): its inode number, read from the kernel's cached
// attributes (no request), is the entry's (Frontend::ino_of), and it is closed at once. Opens by the
// daemon's own process, of the control files and of anything not a regular file of the data set, are
// left out.
//
// When events are lost (the kernel's queue, 16,384 events, overflowed while this thread was behind; or
// the kernel could not open an event's file for us), the engine is told (Engine::opens_lost), which
// counts it. Without CAP_SYS_ADMIN (a mount mark needs it), on a kernel without fanotify, or when the
// kernel sends opens anyway (no no-open support), the watch does not start and the log says why; the
// engine then keeps inferring opens from first reads (its stats say `"progress": {"from": "reads"}`).
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
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
  // Starts the thread, which marks the clairfs mount at `mountpoint_abs` (made by this user: see
  // open_own_clairfs_mount) once the session answers, and waits for the kernel's INIT to know whether
  // opens reach the daemon anyway. REQUIRES: manifest, engine and frontend outlive the watch; the
  // session goes first (the mark may wait for the session to answer, which a session gone ends).
  OpenWatch(const std::string& mountpoint_abs, const Manifest& manifest, Engine& engine, const Frontend& frontend);
  // Stops and joins the thread.
  ~OpenWatch();
  OpenWatch(const OpenWatch&) = delete;
  OpenWatch& operator=(const OpenWatch&) = delete;

 private:
  void run();
  // Marks the mount; "" or why not.
  std::string watch();
  struct Event {
    EntryId id;
    pid_t pid;
    uint8_t what;  // of the flags below
    static constexpr uint8_t kOpen = 1, kClose = 2, kLost = 4;
  };
  void handle(const char* events, size_t len);
  void pass_on(std::vector<Event> batch) EXCLUDES(queue_mutex_);
  void dispatch() EXCLUDES(queue_mutex_);

  const std::string mountpoint_;
  const Manifest& manifest_;
  Engine& engine_;
  const Frontend& frontend_;
  const pid_t self_;
  UniqueFd group_;  // the fanotify group
  UniqueFd stop_;   // an eventfd: written to stop the thread
  Mutex queue_mutex_;
  std::condition_variable ready_;
  std::deque<Event> pending_ GUARDED_BY(queue_mutex_);
  bool stopping_ GUARDED_BY(queue_mutex_) = false;
  std::thread thread_;      // reads the events
  std::thread dispatcher_;  // hands them to the engine
};

}  // namespace clairfs
