// TraceEngine: an Engine that passes every call to another and appends "PID PATH" for each successful
// open to a file (-o trace=FILE), so a user can see what the job really read, in which order, by which
// process — and tests can compare it with the oracle's prediction.
#pragma once

#include <string>

#include "clairfs/engine.hpp"
#include "clairfs/manifest.hpp"
#include "util/fs.hpp"

namespace clairfs {

class TraceEngine final : public Engine {
 public:
  // REQUIRES: inner and manifest outlive this. Throws std::runtime_error if the file cannot be opened.
  TraceEngine(Engine& inner, const Manifest& manifest, const std::string& file);

  int open(EntryId id, pid_t pid, uint64_t* handle) override;
  ssize_t read(uint64_t handle, char* buf, size_t size, off_t offset, HeldPiece* held) override {
    return inner_.read(handle, buf, size, offset, held);
  }
  void release(uint64_t handle) override { inner_.release(handle); }
  // Not traced: a trace needs every open, so trace= keeps the kernel sending them (progress=opens).
  ssize_t read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, HeldPiece* held) override {
    return inner_.read_unopened(id, pid, buf, size, offset, held);
  }
  void low_on_memory() override { inner_.low_on_memory(); }
  void caller(pid_t pid, uid_t uid) override { inner_.caller(pid, uid); }
  EngineStats stats() const override;

 private:
  Engine& inner_;
  const Manifest& manifest_;
  UniqueFd fd_;  // O_APPEND: each line is one write(), so concurrent opens never interleave within a line
};

}  // namespace clairfs
