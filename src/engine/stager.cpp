#include "engine/stager.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "util/clock.hpp"
#include "util/log.hpp"
#include "util/memory.hpp"
#include "util/text.hpp"

namespace clairfs {

namespace {

using Clock = std::chrono::steady_clock;

// Pushes per turn: between turns the stager runs completions and picks new reads.
constexpr int kPushesPerTurn = 64;
// How often the allocator's free pages go back to the system (util/memory.hpp).
constexpr auto kReturnFreePages = std::chrono::seconds(1);
// How long an idle stager sleeps before looking again (woken sooner by readers' progress), and while
// page drops wait.
constexpr auto kIdleWait = std::chrono::milliseconds(100);
constexpr auto kDropWait = std::chrono::milliseconds(1);
// How often the planning thread looks whether the readers came within the horizon of the plan's end.
constexpr auto kPlanLook = std::chrono::milliseconds(20);
// A push or drop into the kernel takes microseconds, or copies the file's bytes at memory speed; one
// that takes 100 ms more than a copy at 1 byte/ns (1 GB/s) waits for a read request (see in_kernel).
constexpr auto kKernelCallGrace = std::chrono::milliseconds(100);
constexpr uint64_t kKernelCallBytesPerNs = 1;
// How long a turn waits for a peer's answer when it has nothing else to do.
constexpr auto kPeerPoll = std::chrono::milliseconds(1);
// At most this many questions to the kernel unanswered (StagingCore::questions).
constexpr size_t kAsksInFlight = 64;
// How long the walk waits on a file whose attributes could not be read (no descriptor free, say).
constexpr auto kKnowAgain = std::chrono::milliseconds(100);
// A question not answered within this long is taken as "not held".
constexpr auto kAskTimeout = std::chrono::seconds(1);

}  // namespace

Stager::Stager(StagerParts p)
    : manifest_(p.manifest),
      state_(p.state),
      ram_(p.ram),
      stores_(p.stores),
      peers_(p.stores.part(Origin::kPeer)),
      demand_(p.demand),
      counters_(p.counters),
      kernel_(p.kernel),
      idle_after_(p.idle),
      io_(p.depth),
      outside_{[this](EntryId id) { return demand_.loading_whole(id); },
               [this](EntryId id) { return demand_.reading(id); }},
      memory_retry_(p.memory_retry) {
  thread_ = std::thread([this] { run(); });
  try {
    planning_ = std::thread([this] { plan_loop(); });
  } catch (...) {
    state_.stop();
    thread_.join();
    throw;
  }
}

Stager::~Stager() {
  state_.stop();
  plan_wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (planning_.joinable()) planning_.join();
}

void Stager::finish() {
  {
    StagingCore::Turn turn(state_);  // (so that the planning thread cannot miss the wake-up)
    finishing_.store(true);
  }
  state_.wake_stager();
  plan_wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (planning_.joinable()) planning_.join();
}

void Stager::run() {
  FreePageReturner free_pages(kReturnFreePages);
  for (;;) {
    free_pages.tick();
    if (!survive_out_of_memory([this] { return turn(); })) return;
  }
}

bool Stager::survive_out_of_memory(const std::function<bool()>& step) {
  try {
    return step();
  } catch (const std::bad_alloc&) {
    // The address space limited under the daemon: this turn is lost, the next tries again a little later.
    out_of_memory();
    StagingCore::Turn turn(state_);
    if (state_.stopping()) return false;
    state_.stager_nap(turn, kIdleWait);
    return !state_.stopping();
  }
}

bool Stager::turn() {
  if (state_.short_of_memory.exchange(false)) give_back_memory(0);
  if (raise_budget_at_ && Clock::now() >= *raise_budget_at_) raise_ram_budget();
  run_drops();
  push_ahead();
  ask_kernel();
  std::vector<Pick> picks;
  auto adopted = demand_.take_adopted();
  bool idle = false;
  {
    StagingCore::Turn turn(state_);
    if (state_.stopping()) return false;
    keep_adopted(std::move(adopted));
    give_back_if_idle();
    idle = state_.is_idle();  // nothing staged until the next read
  }
  const bool finishing = finishing_.load();
  if (finishing && io_.idle()) return false;
  unsigned room = finishing || idle ? 0 : io_.ring_room();
  // The files read on demand go to NVMe as the ring has room (it may be full of reads for a while).
  const unsigned writes = stores_.write_held(io_, room);
  room -= writes;
  {
    StagingCore::Turn turn(state_);
    if (state_.stopping()) return false;
    StagingCore::Walk walk = state_.pick(room, outside_, Clock::now() >= know_again_at_);
    know_first_ = walk.know_first;
    to_know_ = std::move(walk.to_know);
    picks = choose_stores(walk.picks);
    if (picks.empty() && writes == 0 && io_.idle() && !stores_.copies_held() && !know_first_) {
      // Woken by opens only once the readers have moved some way (or read-ahead is queued).
      Clock::duration wait = state_.drops_waiting() ? kDropWait : kIdleWait;
      if (raise_budget_at_) wait = std::clamp<Clock::duration>(*raise_budget_at_ - Clock::now(), {}, wait);
      state_.stager_sleep(turn, wait);
      return true;
    }
  }
  for (const Pick& pick : picks) stage(pick);
  know_now();
  const bool nothing = picks.empty() && writes == 0;
  if (io_.external_in_flight() > 0) io_.run(nothing ? kPeerPoll : std::chrono::milliseconds(0));
  else if (nothing) io_.run_waiting();
  else io_.run(std::chrono::milliseconds(0));
  return true;
}

void Stager::out_of_memory() {
  if (out_of_memory_said_++ == 0)
    log_warning("the stager could not allocate memory (an address-space limit?); it goes on, staging less");
}

void Stager::plan_loop() {
  for (;;) {
    bool added = false;
    try {
      added = plan_ahead();
    } catch (const std::bad_alloc&) {  // adding the epoch built (its build's own failure is said there)
      out_of_memory();
    }
    StagingCore::Turn turn(state_);
    if (state_.stopping() || finishing_.load()) return;
    if (added) {
      state_.wake_stager();  // a waiting stager has the new epoch's files to stage
      continue;
    }
    turn.wait_for(plan_wake_, kPlanLook);
  }
}

bool Stager::plan_ahead() { return !finishing_.load() && state_.plan_next(); }

void Stager::give_back_if_idle() {
  const auto released = state_.release_if_idle(state_.now(), idle_after_);
  if (!released) return;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(idle_after_).count();
  log_info("nothing read for " + std::to_string(seconds) + " s (idle=): " + std::to_string(released->first) +
           " files (" + human_bytes(static_cast<double>(released->second)) +
           ") in RAM and the pushed pages given back; staging again at the next read");
}

void Stager::run_drops() {
  std::vector<EntryId> drops;
  {
    StagingCore::Turn turn(state_);
    drops = state_.take_drops();
  }
  if (drops.empty()) return;
  if (kernel_)
    for (EntryId id : drops)
      if (in_kernel(manifest_.entry(id).size, [&] { return kernel_->drop(id); }) == 0) counters_.drops++;
  StagingCore::Turn turn(state_);
  state_.dropped(drops);
}

void Stager::push_ahead() {
  const std::function<bool(EntryId)> knows = [this](EntryId id) { return kernel_->knows(id); };
  if (const uint64_t n = kernel_ ? kernel_->introductions() : 0; n != introductions_seen_) {
    introductions_seen_ = n;
    StagingCore::Turn turn(state_);
    state_.introduced(state_.now());
  }
  for (int i = 0; i < kPushesPerTurn; ++i) {
    std::optional<PageWindow::Push> push;
    {
      StagingCore::Turn turn(state_);
      push = state_.next_push(state_.now(), knows);
    }
    if (!push) return;
    const int rc =
        in_kernel(push->data->size(), [&] { return kernel_->push(push->id, push->data->data(), push->data->size()); });
    (rc < 0 ? counters_.push_failures : counters_.pushes)++;
    StagingCore::Turn turn(state_);
    state_.push_done(*push, rc < 0 ? rc : 0, state_.now());
  }
}

int Stager::in_kernel(uint64_t bytes, const std::function<int()>& call) {
  state_.in_kernel_until(Clock::now() + kKernelCallGrace + std::chrono::nanoseconds(bytes / kKernelCallBytesPerNs));
  const int rc = call();
  state_.in_kernel_until(std::nullopt);
  return rc;
}

void Stager::keep_adopted(std::vector<std::pair<EntryId, FileBytes>> adopted) {
  // Files read whole on demand: kept like staged ones, so SOURCE sees them once, and queued for NVMe.
  for (auto& [id, bytes] : adopted)
    if (state_.keep_read(id, bytes)) stores_.hold_copy(id, std::move(bytes));
}

std::vector<Stager::Pick> Stager::choose_stores(const std::vector<StagingCore::Pick>& picks) {
  using For = StagingCore::Pick::For;
  std::vector<Pick> chosen;
  chosen.reserve(picks.size());
  for (const StagingCore::Pick& p : picks) {
    const bool peer = peers_ && peers_->may_hold(p.id);  // (the keeper may hold it: ask it)
    Origin first = Origin::kSource;
    if (p.why == For::kReadAhead) {
      first = p.on_nvme ? Origin::kNvme : Origin::kSource;
    } else if (p.why == For::kDeferred) {
      first = peer ? Origin::kPeer : Origin::kSource;
    } else if (p.why == For::kPlan) {
      if (p.on_nvme) {
        first = Origin::kNvme;
      } else if (peer) {
        if (model_.prefer_peer(p.soon, peers_->in_flight(), io_.ring_in_flight() + static_cast<unsigned>(chosen.size()),
                               io_.depth())) {
          first = Origin::kPeer;
        } else {
          counters_.source_over_peer++;
          counters_.source_over_peer_bytes += manifest_.entry(p.id).size;
        }
      }
    }
    chosen.push_back(Pick{p, first, first == Origin::kPeer && p.may_defer});
  }
  return chosen;
}

void Stager::know_now() {
  if (!know_first_) return;
  manifest_.want_first(to_know_);
  to_know_.clear();
  // (Gone: the walk passes over it.)
  if (!manifest_.ensure(*know_first_) && manifest_.pending(*know_first_)) know_again_at_ = Clock::now() + kKnowAgain;
  counters_.attributes_read++;
  know_first_.reset();
}

void Stager::ask_kernel() {
  if (!kernel_) return;
  std::vector<EntryId> ask;
  const auto now = Clock::now();
  {
    StagingCore::Turn turn(state_);
    for (auto it = asking_.begin(); it != asking_.end();) {
      if (now - it->second < kAskTimeout) {
        ++it;
        continue;
      }
      state_.not_answered(it->first);
      asking_.erase(it++);
    }
    ask = state_.questions(kAsksInFlight - std::min(kAsksInFlight, asking_.size()));
  }
  for (EntryId id : ask) {
    auto answer = io_.external([this, id](int64_t held) { answered(id, held > 0); });
    asking_.emplace(id, now);
    counters_.kernel_asks++;
    if (kernel_->probe(id, manifest_.entry(id).size, answer) < 0)
      answer(0);  // not asked (the inode forgotten): not held
  }
}

void Stager::answered(EntryId id, bool held) {
  if (asking_.erase(id) == 0) return;  // given up on (kAskTimeout)
  StagingCore::Turn turn(state_);
  state_.answered(id, held);
}

void Stager::stage(const Pick& pick) {
  std::shared_ptr<Bytes> buf;
  try {
    buf = std::make_shared<Bytes>(manifest_.entry(pick.id()).size);
  } catch (const std::bad_alloc&) {
    // ram= is more than this process may allocate (an address-space limit, overcommit off): the file is
    // left to SOURCE like a failed read, and RAM is given back.
    const uint64_t size = manifest_.entry(pick.id()).size;
    ram_.unreserve(size);
    counters_.stage_failures++;
    finish(pick);
    give_back_memory(size);
    return;
  }
  stores_.start_find(io_, pick.id(), std::move(buf), Store::Route{pick.first, pick.peer_only},
                     [this, pick](const Store::Found& found) { return staged(pick, found); });
}

void Stager::give_back_memory(uint64_t bytes) {
  const uint64_t budget = ram_.lower_budget_below_used(bytes + kServingRoom);
  unsigned let_go = 0;
  {
    StagingCore::Turn turn(state_);
    let_go = state_.shed_ram(budget);
  }
  raise_step_ = kServingRoom;
  raise_budget_at_ = Clock::now() + memory_retry_;
  if (out_of_memory_said_++ == 0)  // once: the stats show the budget as it comes down further
    log_warning(std::string(bytes ? "staging" : "serving") + " could not allocate memory (ram= is more than this " +
                "process may allocate: an address-space limit?); the RAM budget is now " +
                human_bytes(static_cast<double>(budget)) + ", " + std::to_string(let_go) +
                (let_go == 1 ? " file" : " files") + " let go for reads to go on");
}

void Stager::raise_ram_budget() {
  const uint64_t budget = ram_.raise_budget(raise_step_);
  if (budget < ram_.configured_budget()) {
    raise_step_ *= 2;
    raise_budget_at_ = Clock::now() + memory_retry_;
    return;
  }
  raise_budget_at_.reset();
  out_of_memory_said_ = 0;  // a shortage after this one is said again
  log_notice("no allocation has failed for a while: the RAM budget is back to " +
             human_bytes(static_cast<double>(budget)));
}

Store::Keep Stager::staged(const Pick& pick, const Store::Found& r) {
  const uint64_t size = manifest_.entry(pick.id()).size;
  if (log_enabled(LogLevel::kDebug) && pick.first == Origin::kPeer && r.from != Origin::kPeer)
    log_debug("staging /" + manifest_.path(pick.id()) + ": its peer did not serve it (refused, timed out or gone)" +
              (r.rc < 0 ? pick.peer_only ? "; asked again once needed soon" : "" : "; read from the next store"));
  if (r.rc < 0) {
    ram_.unreserve(size);
    (pick.peer_only ? counters_.peer_deferrals : counters_.stage_failures)++;
    finish(pick, /*defer=*/pick.peer_only);  // asked again once needed soon
    return std::nullopt;
  }
  if (r.from == Origin::kPeer || (r.from == Origin::kSource && size > 0))
    model_.note(r.from == Origin::kPeer, seconds_since(r.since));
  if (r.from == Origin::kPeer) {
    counters_.staged_from_peer++;
    counters_.staged_peer_bytes += size;
  } else if (r.from == Origin::kSource) {
    counters_.staged_source_bytes += size;
  }
  const uint64_t after = keep(pick, r);
  finish(pick);
  if (after == kNever) return std::nullopt;
  return after;  // NVMe holds it for that use
}

uint64_t Stager::keep(const Pick& pick, const Store::Found& r) {
  StagingCore::Turn turn(state_);
  return state_.staged(pick.what, r.buf, r.from);
}

void Stager::finish(const Pick& pick, bool defer) {
  {
    StagingCore::Turn turn(state_);
    if (defer) state_.defer(pick.what);
    state_.flight_ended(pick.id());
  }
  state_.flights_ended();
}

}  // namespace clairfs
