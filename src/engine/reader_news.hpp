// ReaderNews: what the engine makes of the readers' verdicts once the staging core's lock is let go —
// the log's lines (a rank off the plan or back, a rank that stopped, a process in another order or of
// another world size), the diagnosis of a rank off the plan (Diagnoser: with an oracle only, it knows the
// orders to try), and the calls that start a re-plan (EngineConfig::on_world, on_other_order). Also the
// epochs that ranks which never read are found to read in (late_epochs), for a plan that follows them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core.hpp"
#include "engine/diagnosis.hpp"
#include "engine/reader_tracker.hpp"

namespace clairfs {

class ReaderNews {
 public:
  // `ranks`: the training rank of each served rank index. `replans`: a reader of another world size
  // makes whoever built the engine plan again (on_world), rather than a remount: what the log says.
  // on_other_order is called once until a rank follows the plan again.
  ReaderNews(std::vector<uint64_t> ranks, bool replans, std::function<void()> on_world,
             std::function<void()> on_other_order);
  // Ranks off the plan are diagnosed against the mounted order's epochs (an engine built from an oracle).
  // REQUIRES: manifest outlives this.
  void diagnose(const Manifest& manifest, MountedOrder mounted);
  // Stops the diagnosis (its thread) before the parts it reads go.
  void stop() { diagnoser_.reset(); }

  // What placing opens changed (`evidence`: the opens of ranks to diagnose): logged, diagnoses asked,
  // the re-planning called.
  void tell(const ReaderTracker::Seen& seen, std::vector<Evidence> evidence);
  // Calls on_other_order, once until a rank follows the plan again.
  void other_order();

  // The diagnosis of served rank `r` off the plan: the epoch of the mounted order it reads, and what it
  // reads as ("" while none is known, or without a diagnosis).
  std::optional<uint64_t> epoch(size_t r) const;
  std::string answer(size_t r) const;
  // For each served rank that never read (`at`: kUnread), the epoch of the planned order it reads in,
  // found from `others`, the opens of processes that follow no rank — a rank that started epochs after
  // the others on its node, `at_epoch` (theirs) — or nullopt. One process reads for one rank; the
  // processes with the most opens are tried first (up to kLateTries). Slow (explain per try): off the
  // request path.
  std::vector<std::optional<uint64_t>> late_epochs(const std::vector<StagingCore::RankAt>& at,
                                                   const std::vector<std::pair<EntryId, pid_t>>& others,
                                                   uint64_t at_epoch) const;
  static constexpr size_t kLateTries = 4;

 private:
  const std::vector<uint64_t> ranks_;
  const bool replans_;
  const std::function<void()> on_world_;
  const std::function<void()> on_other_order_;
  std::atomic<bool> other_order_said_{false};  // on_other_order_ called
  std::unique_ptr<Diagnoser> diagnoser_;
};

}  // namespace clairfs
