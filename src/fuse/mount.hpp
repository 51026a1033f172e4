// A FUSE session and its kernel mount, owned: the destructor unmounts and frees both.
#pragma once

#include <fuse_lowlevel.h>

#include <csignal>
#include <functional>
#include <string>

#include "clairfs/options.hpp"
#include "fuse/frontend.hpp"
#include "fuse/page_cache.hpp"

namespace clairfs {

// The command (argv[1]) of the keeper that a mount made with auto_unmount starts: it holds fusermount3's
// socket until the daemon has wholly exited (mount.cpp says why). Not for users: `clairfs-keeper
// keep-auto-unmount DAEMON_PID MOUNTPOINT` with the daemon's pidfd at descriptor 3, the PID and the mount
// point only for whoever reads `ps`.
inline constexpr const char* kUnmountKeeperCommand = "keep-auto-unmount";
int run_unmount_keeper(int argc, char** argv);

class MountedSession {
 public:
  // Creates the session and mounts it read-only at options.mountpoint_abs; attaches `page_cache` (if
  // given) to the session while it lives. Throws std::runtime_error with one line on failure (nothing
  // is left mounted).
  MountedSession(const Options& options, Frontend& frontend, FusePageCache* page_cache = nullptr);
  ~MountedSession();
  MountedSession(const MountedSession&) = delete;
  MountedSession& operator=(const MountedSession&) = delete;

  // Serves requests until unmounted or one of the `ending` signals (blocked in every thread) arrives.
  // Returns 0 on a clean end, else a negative errno. `low_on_memory` is called when a serving thread
  // cannot allocate its request buffer.
  int serve(const sigset_t& ending, const std::function<void()>& low_on_memory);

 private:
  void start(const Options& options, Frontend& frontend);
  void answer_init();
  void stop();

  fuse_session* session_ = nullptr;
  FusePageCache* page_cache_ = nullptr;
  bool signals_set_ = false;
  bool mounted_ = false;
  std::string mountpoint_;
  long mount_id_ = -1;  // the mount's id in /proc/self/mountinfo, as it was made
};

}  // namespace clairfs
