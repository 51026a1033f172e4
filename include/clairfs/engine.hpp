// The seam between the FUSE front-end and whatever serves file bytes.
//
// The front-end translates each kernel request into one call here and replies with the result; it holds
// no policy. Files are read either through handles (open, read, release) or, in FUSE no-open mode, by
// id (read_unopened), with the opens and closes told by a watch on the mount (opened, closed). Today the only implementation reads SOURCE directly (SourceReader); the clairvoyant engine
// (staging, tiers, peers) implements the same interface, so the front-end does not change.
//
// Every call is on the data path: it returns -errno, never throws, and never returns bytes it has not
// verified belong to the file the manifest describes.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "clairfs/bytes.hpp"
#include "clairfs/stats.hpp"
#include "clairfs/types.hpp"

namespace clairfs {

// A read's answer left where the engine holds it (a file's RAM copy) instead of copied into the caller's
// buffer: the front-end replies from there, and holds `bytes` until the reply is sent.
struct HeldPiece {
  std::shared_ptr<const Bytes> bytes;
  const char* at = nullptr;  // the piece read, inside *bytes
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Opens regular file `id` for process `pid` (the reader: a DataLoader worker, say). On success stores an
  // opaque handle and returns 0. The open is also the engine's signal of where that reader is.
  virtual int open(EntryId id, pid_t pid, uint64_t* handle) = 0;

  // Reads up to `size` bytes at `offset` into `buf`; returns the byte count (short only at end of file)
  // or -errno. Where `held` is given and the engine holds the file whole in memory, it may leave the
  // bytes there (*held says where) and not write `buf`: one copy of them fewer (the kernel's into its
  // pages is the other).
  virtual ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset, HeldPiece* held) = 0;

  // Ends a handle from open(). Never fails.
  virtual void release(uint64_t handle) = 0;

  // A read of regular file `id` that the kernel opened without asking (FUSE no-open mode: open was
  // answered ENOSYS once, and from then on the kernel opens every file itself and never releases).
  // The read at offset 0 counts as the file's open. Returns like read(), `held` as there.
  virtual ssize_t read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, HeldPiece* held) = 0;

  // Opens and closes the kernel makes without asking (no-open mode), as a watch on the mount sees them
  // (fuse/open_watch.hpp), each with the opener's process. From watching_opens() on, they are the
  // readers' progress, and a file's first read no longer stands for its open. Called on the watch's
  // thread; never fail, never wait on I/O. By default ignored (an engine that follows nobody).
  virtual void watching_opens() {}
  virtual void opened(EntryId /*id*/, pid_t /*pid*/) {}
  virtual void closed(EntryId /*id*/, pid_t /*pid*/) {}
  // The watch lost events (its queue overflowed): which files are open is no longer known.
  virtual void opens_lost() {}
  // A request of thread `pid`, running as `uid`, reached the daemon (a lookup, a read): the process is
  // there now. An engine that asks whose an open was when the watch tells it — the opener may have
  // ended by then (`cat` of 64 files) — may keep the answer. Any thread; never waits on I/O.
  virtual void caller(pid_t /*pid*/, uid_t /*uid*/) {}

  // What it has done, for .clairfs/stats, `clairfs status` and the metrics (tiers, staging, readers;
  // to_json renders it). Any thread.
  virtual EngineStats stats() const = 0;

  // The process could not allocate memory where requests are served (libfuse's buffers: an
  // address-space limit, overcommit off): memory held for later reads is given back soon, so that
  // reading goes on. Any thread; never waits. By default nothing is held.
  virtual void low_on_memory() {}
};

}  // namespace clairfs
