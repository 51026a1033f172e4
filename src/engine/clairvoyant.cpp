#include "engine/clairvoyant.hpp"

#include <sys/stat.h>

#include "engine/engine_parts.hpp"
#include "util/log.hpp"
#include "util/text.hpp"

namespace clairfs {

namespace {

using Clock = std::chrono::steady_clock;

// How long an open waits for a staging read of its file before reading it itself: far above a read's
// time on a working file system, short enough that a stuck read costs little.
constexpr auto kWaitForStaging = std::chrono::seconds(5);
// ...and stops waiting sooner when the stager's push or drop into the kernel is overdue
// (StagingCore::wait_for_flight).

}  // namespace

ClairvoyantEngine::ClairvoyantEngine(const Manifest& manifest, const Oracle& oracle, SourceStore& source,
                                     EngineConfig config)
    : ClairvoyantEngine(Parts{}, manifest,
                        oracle_streams(manifest, oracle, served_ranks(config), config.epoch_shift, config.epochs),
                        source, with_head(manifest, oracle, config)) {  // a copy: the streams read it
  const Schedule& s = oracle.schedule();
  news_.diagnose(manifest_,
                 MountedOrder{s.order, s.seed, s.world_size, config_.start_epoch, s.torch_shuffle, config_.tolerance});
  if (s.order == Order::kTorch)
    state_.set_world(s.world_size, served_ranks(config_), s.batch_size == 1 ? s.workers : 1);
  begin();
}

ClairvoyantEngine::ClairvoyantEngine(const Manifest& manifest, StreamSource streams, SourceStore& source,
                                     EngineConfig config)
    : ClairvoyantEngine(Parts{}, manifest, std::move(streams), source, std::move(config)) {
  begin();
}

ClairvoyantEngine::ClairvoyantEngine(Parts, const Manifest& manifest, StreamSource streams, SourceStore& source,
                                     EngineConfig config)
    : manifest_(manifest),
      config_(std::move(config)),
      streams_(std::move(streams)),
      ram_(config_.ram),
      nvme_(make_nvme(manifest_, config_)),
      peers_(make_peers(manifest_, config_)),
      mean_size_(mean_sample_size(manifest_)),
      state_(manifest_, served_ranks(config_), planner_config(manifest_, config_), streams_,
             policy_config(config_, mean_size_), window_config(config_, mean_size_),
             StagingConfig{config_.bytes_in_flight, config_.handed}, ram_, nvme_.get(), counters_, config_.handed_over),
      chain_({nvme_.get(), peers_.get()}, source, &state_),
      demand_(manifest_, chain_, source, counters_, [this] { state_.wake_stager(); }),
      news_(served_ranks(config_), config_.replans, config_.on_world, config_.on_other_order) {
  state_.set_lookups(config_.parent_of ? config_.parent_of : parent_from_proc,
                     config_.process_of ? config_.process_of : process_from_proc);
}

void ClairvoyantEngine::begin() {
  // The opens below judged reader by reader, as the watch tells them (in a re-plan, the other job's opens
  // among them, judged rank by rank, called the new plan's ranks off at once).
  if (config_.watched) watching_opens();
  // The epochs after the readers' one planned now (the stager would, later): a file the readers passed
  // already is kept for its next use there.
  if (config_.adopt) state_.plan_up_to(kNever);
  touch();  // (idle= counts from here)
  catch_up(config_.opened_before);
  if (config_.adopt) adopted_ = state_.adopt(config_.adopt(*this));
  stager_ =
      std::make_unique<Stager>(StagerParts{manifest_, state_, ram_, chain_, demand_, counters_, config_.page_cache,
                                           config_.depth, config_.idle, config_.memory_retry});
}

ClairvoyantEngine::~ClairvoyantEngine() {
  stager_.reset();
  news_.stop();
}

// ---- progress --------------------------------------------------------------------------------------

FileBytes ClairvoyantEngine::wait_for_staging(StagingCore::Turn& turn, EntryId id, Origin* from) {
  // A file being staged right now arrives sooner from that read than from a second one.
  // Given up (the stager's call into the kernel overdue): read on demand by the caller, so that request
  // threads free up for the kernel.
  StagingCore::Landed landed;
  if (!state_.wait_for_flight(turn, id, Clock::now() + kWaitForStaging, &landed)) counters_.staging_waits_given_up++;
  if (FileBytes data = state_.ram_copy(id, from)) return data;
  *from = landed.from;
  return landed.bytes;
}

FileBytes ClairvoyantEngine::from_successor(EntryId id, Origin* from) {
  ClairvoyantEngine* next = successor_.load(std::memory_order_acquire);
  if (!next) return nullptr;
  StagingCore::Turn turn(next->state_);
  return next->wait_for_staging(turn, id, from);
}

void ClairvoyantEngine::placed(StagingCore::Placed& p) {
  if (p.seen.open.expected) counters_.served_files(Origin::kPageCache, p.seen.open.presumed);
  if (!p.debug.empty()) log_debug(p.debug);
  if (p.woke) log_info("a read after idle=: staging again");
  if (p.wake || p.woke) state_.wake_stager();
  if (!p.seen.changed.empty() || !p.evidence.empty() || p.seen.other || p.seen.other_world || p.seen.world_decided)
    news_.tell(p.seen, std::move(p.evidence));
}

FileBytes ClairvoyantEngine::note_open(EntryId id, pid_t pid, bool handle, Origin* from, bool* again) {
  FileBytes data;
  StagingCore::Placed p;
  {
    StagingCore::Turn turn(state_);
    data = wait_for_staging(turn, id, from);
    p = state_.place(id, pid, handle);
  }
  *again = p.seen.again;
  placed(p);
  return data;
}

void ClairvoyantEngine::plan_for(size_t opens) { state_.plan_up_to(state_.reach(opens)); }

void ClairvoyantEngine::catch_up(const std::vector<std::pair<EntryId, pid_t>>& opens) {
  const ReaderTracker::Seen all = state_.catch_up(opens);
  if (!all.changed.empty() || all.other || all.other_world || all.world_decided) news_.tell(all, {});
}

void ClairvoyantEngine::take_over(const std::vector<std::pair<EntryId, pid_t>>& opens) {
  catch_up(opens);
  // Then those told here since (waiting meanwhile), and those told while these are placed, in turn.
  while (auto done = state_.place_waiting())
    for (StagingCore::Placed& p : *done) placed(p);
}

// ---- re-planning -----------------------------------------------------------------------------------

std::vector<ClairvoyantEngine::RankAt> ClairvoyantEngine::ranks_at() const {
  std::vector<RankAt> at = state_.ranks_at();
  for (size_t r = 0; r < at.size(); ++r)
    if (at[r].is == RankAt::Is::kOff) at[r].epoch = news_.epoch(r);
  return at;
}

std::vector<std::optional<uint64_t>> ClairvoyantEngine::late_epochs(
    const std::vector<std::pair<EntryId, pid_t>>& others, uint64_t at_epoch) const {
  return news_.late_epochs(ranks_at(), others, at_epoch);
}

uint64_t ClairvoyantEngine::reading_epoch() const { return state_.reading_epoch().value_or(config_.start_epoch); }

std::vector<std::pair<EntryId, FileBytes>> ClairvoyantEngine::retire(ClairvoyantEngine& next) {
  if (stager_) stager_->finish();  // its reads in flight kept first: SOURCE sent them once
  stager_.reset();                 // no more staging, pushes or NVMe writes
  demand_.hand_to(next.demand_);
  successor_.store(&next, std::memory_order_release);
  std::vector<std::pair<EntryId, FileBytes>> held;
  for (EntryId id : ram_.ids())
    if (FileBytes bytes = ram_.get(id)) held.emplace_back(id, std::move(bytes));
  return held;
}

void ClairvoyantEngine::free_ram() { state_.forget_ram(); }

void ClairvoyantEngine::successor_gone() {
  successor_.store(nullptr, std::memory_order_release);
  demand_.hand_back();
}

// ---- Engine ----------------------------------------------------------------------------------------

int ClairvoyantEngine::open(EntryId id, pid_t pid, uint64_t* handle) {
  Origin from = Origin::kRam;
  bool again = false;
  FileBytes data = note_open(id, pid, true, &from, &again);
  if (!data) data = from_successor(id, &from);
  *handle = reinterpret_cast<uint64_t>(new OpenFile(id, pid, std::move(data), from));
  return 0;
}

ssize_t ClairvoyantEngine::read(uint64_t handle, char* buf, size_t size, off_t offset, HeldPiece* held) {
  touch();
  return reinterpret_cast<OpenFile*>(handle)->read(demand_, buf, size, offset, held);
}

void ClairvoyantEngine::release(uint64_t handle) {
  auto* file = reinterpret_cast<OpenFile*>(handle);
  state_.handle_closed(file->id());
  file->close(demand_);
  delete file;
}

ssize_t ClairvoyantEngine::read_unopened(EntryId id, pid_t pid, char* buf, size_t size, off_t offset, HeldPiece* held) {
  const auto t0 = state_.now();
  touch(t0);
  bool first = offset == 0;  // the kernel reads a file from its start
  Origin from = Origin::kRam;
  FileBytes data;
  std::optional<DemandReader::Claim> miss;  // taken under the lock when RAM has no copy (see Claim)
  if (watched_.load(std::memory_order_acquire)) {
    StagingCore::Turn turn(state_);
    const StagingCore::WatchedRead r = state_.watched_read(id, first, t0, &data, &from);
    first = r.first;
    if (r.wait) data = wait_for_staging(turn, id, &from);
    if (!data) miss.emplace(demand_, id);
  } else if (first) {
    // Without a watch, the first read is the open.
    bool again = false;
    data = note_open(id, pid, false, &from, &again);
    first = !again;  // counted once
    if (!data) miss.emplace(demand_, id);
  } else {
    StagingCore::Turn turn(state_);
    data = state_.ram_copy(id, &from);
    if (!data) miss.emplace(demand_, id);
  }
  if (!data && (data = from_successor(id, &from))) miss.reset();
  if (data) return demand_.read_unopened_held(id, data, from, first, buf, size, offset, held);
  return demand_.read_unopened(id, pid, first, buf, size, offset, t0, held);
}

// ---- opens seen by a watch on the mount --------------------------------------------------------------

void ClairvoyantEngine::watching_opens() {
  state_.watching_opens();
  watched_.store(true, std::memory_order_release);
}

void ClairvoyantEngine::opened(EntryId id, pid_t pid) {
  counters_.watched_opens++;
  StagingCore::Placed p = state_.watched_open(id, pid);
  placed(p);
}

void ClairvoyantEngine::closed(EntryId id, pid_t pid) { close_told(id, pid); }

bool ClairvoyantEngine::close_told(EntryId id, pid_t) {
  counters_.watched_closes++;
  // No read reached the daemon while it was open: the kernel's pages (pushed, or from an earlier read)
  // served it.
  const bool counted = state_.watched_close(id);
  if (counted) counters_.served_file(Origin::kPageCache);
  return counted;
}

bool ClairvoyantEngine::unread_open(EntryId id) const { return state_.unread(id); }
bool ClairvoyantEngine::give_up_unread_open(EntryId id) { return state_.give_up_unread(id); }
void ClairvoyantEngine::take_unread_open(EntryId id) { state_.take_unread(id); }
void ClairvoyantEngine::low_on_memory() { state_.memory_short(); }

void ClairvoyantEngine::opens_lost() {
  counters_.watch_losses++;
  state_.opens_lost();
}

PeerTransport::Lookup ClairvoyantEngine::peer_lookup() {
  return [this](EntryId id) -> PeerBytes {
    // A peer's message carries a file id only: checked against the manifest before anything is read.
    if (id >= manifest_.size() || !S_ISREG(manifest_.entry(id).mode)) return nullptr;
    touch();  // a node whose peers still read is not idle
    if (FileBytes b = ram_.get(id)) return b;
    return demand_.nvme_copy(id);
  };
}

}  // namespace clairfs
