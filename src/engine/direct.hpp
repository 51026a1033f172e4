// DirectEngine: a mount that stages nothing (no ram=, or staging could not start): every open and read
// goes to SOURCE (tiers/source.hpp), as it would without clairfs.
#pragma once

#include "clairfs/engine.hpp"
#include "tiers/source.hpp"

namespace clairfs {

class DirectEngine final : public Engine {
 public:
  // REQUIRES: `source` outlives the engine.
  explicit DirectEngine(SourceTier& source) : source_(source) {}

  int open(EntryId id, pid_t pid, uint64_t* handle) override { return source_.open(id, pid, handle); }
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset, HeldPiece*) override {
    return source_.read(handle, buf, size, offset);
  }
  void release(uint64_t handle) override { source_.release(handle); }
  ssize_t read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, HeldPiece*) override {
    return source_.read_unopened(id, pid, buf, size, offset);
  }
  EngineStats stats() const override { return source_.stats(); }

 private:
  SourceTier& source_;
};

}  // namespace clairfs
