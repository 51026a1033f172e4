// What is mounted where, read from /proc/self/mountinfo, and the local leftovers a clairfs daemon that
// died can leave: a dead mount (the kernel answers ENOTCONN) and an NVMe cache folder.
//
// Used at start-up (a mount point that is already a clairfs mount is refused) and by `clairfs cleanup`,
// which a job's helper or a site's epilog runs on every node after the daemons have stopped.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace clairfs {

// This node's host name (as gethostname gives it; "?" if it cannot).
std::string host_name();

struct MountEntry {
  std::string mountpoint;  // unescaped
  std::string fstype;      // "fuse.clairfs" for ours
  std::string source;      // the fsname
};

// The topmost mount whose mount point is exactly `abs_path`, if any.
std::optional<MountEntry> mount_at(const std::string& abs_path);

// The absolute form of `path` without resolving its last component: realpath() of the parent plus the
// name, so that a dead mount point (whose stat fails with ENOTCONN) still has a name to look up.
std::string absolute_parent_resolved(const std::string& path);

// True if `abs_path` is a FUSE mount whose daemon is gone (any access fails with ENOTCONN).
bool is_dead_fuse_mount(const std::string& abs_path);

// The start of every NVMe cache folder's name that a daemon on this host makes: "clairfs-cache.HOST.";
// the PID and a random suffix follow. The host name keeps nodes apart on a DIR they share.
std::string cache_folder_prefix();

// Detaches the mount at `abs_path` (umount2 MNT_DETACH as root, else `fusermount3 -u -z`). Returns
// false, with errno set, if it is still mounted.
bool detach_mount(const std::string& abs_path);

// A cache folder left in `dir` by a clairfs daemon of this host that has died.
struct StaleCache {
  std::string path;
  long pid;
  unsigned long long bytes;
};

// The folders `dir` holds that a clairfs daemon of this host made (clairfs-cache.HOST.PID.XXXXXX) and
// that no live daemon holds: its PID is gone and nobody holds the folder's lock.
std::vector<StaleCache> stale_caches(const std::string& dir);

// Removes the stale folders in `dir` (stale_caches()): one line for each, saying what was removed or why
// it could not be; *stayed is set if one could not be.
std::vector<std::string> remove_stale_caches(const std::string& dir, bool* stayed = nullptr);

// Removes a cache folder and the files in it (the only kind it holds: flat, regular files). Returns
// false, with errno set, if something stayed.
bool remove_cache_folder(const std::string& path);

}  // namespace clairfs
