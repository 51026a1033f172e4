#include "engine/reader_news.hpp"

#include <algorithm>
#include <unordered_map>

#include "util/log.hpp"

namespace clairfs {

ReaderNews::ReaderNews(std::vector<uint64_t> ranks, bool replans, std::function<void()> on_world,
                       std::function<void()> on_other_order)
    : ranks_(std::move(ranks)),
      replans_(replans),
      on_world_(std::move(on_world)),
      on_other_order_(std::move(on_other_order)) {}

void ReaderNews::diagnose(const Manifest& manifest, MountedOrder mounted) {
  diagnoser_ = std::make_unique<Diagnoser>(manifest, std::move(mounted), ranks_);
}

void ReaderNews::other_order() {
  if (on_other_order_ && !other_order_said_.exchange(true)) on_other_order_();
}

void ReaderNews::tell(const ReaderTracker::Seen& seen, std::vector<Evidence> evidence) {
  if (seen.other)
    log_warning("process " + std::to_string(seen.other) +
                " reads this mount in another order than the plan (another job?): its opens are counted apart "
                "(status: other readers) and do not move the planned ranks");
  if (seen.other_world) {
    const uint64_t world = seen.world, mounted = seen.mounted_world;
    const std::string words = "process " + std::to_string(seen.other_world) + " opens samples " +
                              std::to_string(world) +
                              " apart in the shuffle, as a rank of world_size=" + std::to_string(world) +
                              " does (planned: world_size=" + std::to_string(mounted) + ")";
    if (replans_)
      log_info(words + "; the mount plans for its world size once no process reads as the plan's");
    else
      log_warning(words +
                  ": the job runs with another world size? Progress by rank is the plan's, not the job's; "
                  "remount with world_size=" +
                  std::to_string(world));
  }
  if (seen.world_decided && on_world_) on_world_();
  if (seen.other) other_order();
  for (const auto& [index, verdict] : seen.changed) {
    const uint64_t r = index;  // a name a lambda can capture
    const std::string rank = "rank " + std::to_string(ranks_[r]);
    switch (verdict) {
      case ReaderTracker::Verdict::kFollowing:
        other_order_said_.store(false);  // followed again: a reader in another order later is news
        if (auto e =
                std::find_if(evidence.begin(), evidence.end(), [&](const Evidence& x) { return x.rank == ranks_[r]; });
            e != evidence.end()) {  // back, but in a later epoch than the plan had it in: the diagnosis says why
          log_warning(rank + " reads the planned order of a later epoch than " + std::to_string(e->epoch) +
                      ", where the plan had it: staging follows it there");
        } else {
          if (diagnoser_) diagnoser_->forget(r);
          log_info(rank + " reads in the planned order");
        }
        break;
      case ReaderTracker::Verdict::kOff:
        log_warning(rank + " does not read in the planned order: staging for it stops until it does" +
                    (diagnoser_ ? " (what it reads as follows when found)" : ""));
        other_order();  // seed=auto: the job may read as another seed now
        break;
      case ReaderTracker::Verdict::kIdle:
        log_info(rank + " stopped reading: staging for it stops until it reads again");
        break;
      case ReaderTracker::Verdict::kChecking: break;
    }
  }
  if (!diagnoser_) return;
  for (Evidence& e : evidence)
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (ranks_[r] == e.rank) diagnoser_->ask(r, std::move(e));
}

std::optional<uint64_t> ReaderNews::epoch(size_t r) const { return diagnoser_ ? diagnoser_->epoch(r) : std::nullopt; }

std::string ReaderNews::answer(size_t r) const { return diagnoser_ ? diagnoser_->answer(r) : std::string(); }

std::vector<std::optional<uint64_t>> ReaderNews::late_epochs(const std::vector<StagingCore::RankAt>& at,
                                                             const std::vector<std::pair<EntryId, pid_t>>& others,
                                                             uint64_t at_epoch) const {
  std::vector<std::optional<uint64_t>> found(at.size());
  if (!diagnoser_) return found;
  std::unordered_map<pid_t, std::vector<EntryId>> by_process;
  for (const auto& [id, pid] : others) by_process[pid].push_back(id);
  std::vector<std::vector<EntryId>*> tries;
  for (auto& [pid, opens] : by_process)
    if (opens.size() >= kMinDiagnosisOpens) tries.push_back(&opens);
  std::sort(tries.begin(), tries.end(), [](const auto* a, const auto* b) { return a->size() > b->size(); });
  if (tries.size() > kLateTries) tries.resize(kLateTries);
  for (size_t r = 0; r < at.size(); ++r) {
    if (at[r].is != StagingCore::RankAt::Is::kUnread) continue;
    for (auto& opens : tries) {
      if (!opens) continue;
      found[r] = diagnoser_->epoch_now(Evidence{ranks_[r], at_epoch, *opens, /*unread=*/true});
      if (found[r]) {
        opens = nullptr;  // one process, one rank
        break;
      }
    }
  }
  return found;
}

}  // namespace clairfs
