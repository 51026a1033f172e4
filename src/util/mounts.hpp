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
  std::string super_options;  // the file system's own: FUSE's say user_id= (who mounted it)
  long id = -1;               // the mount's id (unique while it is mounted)
  std::string device;         // its file system's device, "MAJOR:MINOR" (a FUSE mount's names its bdi)
};

// The topmost mount whose mount point is exactly `abs_path`, if any.
std::optional<MountEntry> mount_at(const std::string& abs_path);

// The mount points of this node's clairfs mounts whose fsname is `fsname` (SOURCE, by default).
std::vector<std::string> clairfs_mounts_of(const std::string& fsname);

// The absolute form of `path` without resolving its last component: realpath() of the parent plus the
// name, so that a dead mount point (whose stat fails with ENOTCONN) still has a name to look up.
std::string absolute_parent_resolved(const std::string& path);

// True if `abs_path` is a FUSE mount whose daemon is gone (any access fails with ENOTCONN).
bool is_dead_fuse_mount(const std::string& abs_path);

// The start of every NVMe cache folder's name that a daemon on this host makes: "clairfs-cache.HOST.";
// the PID and a random suffix follow. The host name keeps nodes apart on a DIR they share.
std::string cache_folder_prefix();

// `path` made absolute against the working directory and normalized by its letters alone ("a/../b" is
// "b"), resolving no symlink: the path a command was given, as the kernel will walk it.
std::string lexically_absolute(const std::string& path);

// What detach_clairfs_mount() found and did.
enum class Detached { kNotClairfs, kSymlink, kLive, kDead, kFailed };

// Detaches the clairfs mount at `abs_path` (lexically_absolute) and says whether its daemon was alive.
// The path is resolved once, with no symlink on the way (kSymlink if it has one), to a descriptor: its
// mount (by id, from
// /proc/self/fdinfo) must be a fuse.clairfs mount whose mount point is `abs_path`, and that very mount is
// detached (umount2 through the descriptor as root, else `fusermount3 -u -z`) — a parent directory
// swapped for a symlink in between cannot turn it onto another mount. kFailed sets errno.
Detached detach_clairfs_mount(const std::string& abs_path);

// Detaches the mount with id `id` (a daemon's own, recorded as it mounted) at `abs_path`, resolved
// once with no symlink on the way: true if that very mount is detached. No request reaches the file
// system, so a daemon that no longer serves its mount can detach it.
bool detach_mount_by_id(const std::string& abs_path, long id);

// An O_PATH descriptor of the root of the clairfs mount at `abs_path` (lexically_absolute) that this
// process's user made, or -errno: the path is resolved once, with no symlink on the way (-ELOOP if it
// has one); the mount it reaches must be a fuse.clairfs mount at exactly `abs_path` whose user_id= is
// our effective uid (-ENOENT otherwise), so that another user's mount made over it is never taken for
// ours.
int open_own_clairfs_mount(const std::string& abs_path);

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
