#include "fuse/mount.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "util/log.hpp"
#include "util/mounts.hpp"

namespace clairfs {

namespace {

// libfuse's option parser splits at commas; a comma in a value (fsname) must be escaped.
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// 16 threads: enough that a slow SOURCE read does not hold up lookups and cached reads; requests are
// short, so more would only add contention on 2-core nodes.
constexpr unsigned kMaxThreads = 16;

// Closes the connection at descriptor `fd` and leaves there a descriptor that polls POLLERR.
void end_connection_quietly(int fd) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return;
  ::close(ends[0]);
  if (::dup2(ends[1], fd) < 0) log_warning(std::string("cannot close the FUSE connection: ") + std::strerror(errno));
  ::close(ends[1]);
}

}  // namespace

MountedSession::MountedSession(const Options& o, Frontend& frontend, FusePageCache* page_cache)
    : page_cache_(page_cache) {
  try {
    start(o, frontend);
  } catch (...) {
    stop();
    throw;
  }
}

void MountedSession::start(const Options& o, Frontend& frontend) {
  // nosuid, nodev: a setuid file or a device node in SOURCE is data here, whoever mounts it and however.
  std::string mount_opts = "ro,nosuid,nodev,subtype=clairfs,fsname=" + escape(o.fsname);
  if (o.allow_other) mount_opts += ",allow_other";
  if (o.default_permissions) mount_opts += ",default_permissions";
  if (o.auto_unmount) mount_opts += ",auto_unmount";
  for (const auto& flag : o.mount_flags) mount_opts += "," + flag;

  std::vector<std::string> argv = {"clairfs", "-o", mount_opts};
  if (o.debug) argv.push_back("-d");
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(cargv.size()), cargv.data());
  session_ = fuse_session_new(&args, &Frontend::ops(), sizeof(fuse_lowlevel_ops), &frontend);
  fuse_opt_free_args(&args);
  if (!session_) throw std::runtime_error("cannot create the FUSE session (see the message above)");
  if (fuse_set_signal_handlers(session_) != 0) throw std::runtime_error("cannot install signal handlers");
  signals_set_ = true;
  if (fuse_session_mount(session_, o.mountpoint_abs.c_str()) != 0)
    throw std::runtime_error("cannot mount at '" + o.mountpoint + "' (is /dev/fuse usable? see the message above)");
  mounted_ = true;
  mountpoint_ = o.mountpoint_abs;
  if (const auto m = mount_at(mountpoint_); m && m->fstype == "fuse.clairfs") mount_id_ = m->id;
  if (page_cache_) page_cache_->attach(session_);
}

MountedSession::~MountedSession() { stop(); }

void MountedSession::stop() {
  if (!session_) return;
  if (page_cache_) page_cache_->detach();  // waits for a push in progress
  if (mounted_) {
    // libfuse unmounts by closing the connection first and then unmounting the path: in between every
    // access (a reader, `clairfs status --watch`) fails with ENOTCONN as if the daemon had died, and as
    // root it unmounts whatever the path names by then. So the mount this session made is detached
    // first, by its id through a descriptor; then the connection is closed by putting in its place a
    // descriptor that polls as an ended connection (a pipe's write end with no reader), which tells
    // libfuse that the mount is gone already.
    if (detach_mount_by_id(mountpoint_, mount_id_)) end_connection_quietly(fuse_session_fd(session_));
    fuse_session_unmount(session_);
  }
  if (signals_set_) fuse_remove_signal_handlers(session_);
  fuse_session_destroy(session_);
  session_ = nullptr;
}

int MountedSession::serve() {
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, kMaxThreads);
  fuse_loop_cfg_set_clone_fd(config, 0);
  const int rc = fuse_session_loop_mt(session_, config);
  fuse_loop_cfg_destroy(config);
  // libfuse's handler leaves the signal's number as the loop's result: a stop asked for, not a failure.
  if (rc == SIGTERM || rc == SIGINT) {
    log_notice(std::string("stopped by SIG") + sigabbrev_np(rc) + "; unmounting");
    return 0;
  }
  return rc;
}

}  // namespace clairfs
