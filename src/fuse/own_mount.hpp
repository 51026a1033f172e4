// The daemon's own way into its mount: the threads that make requests to this very daemon through the
// kernel (the watch marking the directories, the introducer looking files up) reach the mount the same
// way and guard against the same two hazards.
//
// A descriptor held in the user's mount makes its unmount fail (EBUSY) while it is held: root works
// through a detached copy of the mount instead (open_tree), which an unmount leaves alone. And a request
// in flight when the daemon is killed is waited for by the kernel until the connection aborts — which it
// does when the last descriptor of /dev/fuse closes: a thread that made the request while holding one (a
// thread of the daemon shares the session's) would wait on itself forever. Such threads take a table of
// descriptors of their own, without /dev/fuse's, first.
#pragma once

#include <string>

#include "util/fs.hpp"

namespace clairfs {

// A detached copy of the clairfs mount at `mountpoint_abs` (made by this user), or none: root may clone a
// mount (open_tree), a user may not. Descriptors opened through the copy hold it, not the user's mount, so
// an unmount meanwhile succeeds (the file system then lives until the copy is closed). The original is held
// for three system calls and no FUSE request: the session need not be answering yet.
UniqueFd clone_of_own_mount(const std::string& mountpoint_abs);

// Gives the calling thread a table of descriptors of its own, without /dev/fuse's; false if it cannot.
// (A copy of every other: for a thread that ends soon.)
bool own_descriptor_table();
// Gives the calling thread a table of descriptors of its own with none in it; false if it cannot. For a
// thread that lives as long as the daemon: a copy it held of any other descriptor would keep that open
// after the daemon closed it (the pipe the mount command waits on, a removed file). It cannot log.
bool empty_descriptor_table();

}  // namespace clairfs
