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
// Demand-read files waiting for their NVMe write at most.
constexpr size_t kMaxToWrite = 4096;
// Samples queued for read-ahead at most (32 for each of 32 sequential readers).
constexpr size_t kMaxReadAheadQueued = 1024;
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
// At most this many files wait for their keeper (deferred_); beyond, a refusal sends a file to SOURCE.
constexpr size_t kMaxDeferred = 65536;
// The kernel is asked whether it holds files at most this many keys ahead of the staging walk, with at
// most this many questions unanswered: an answer takes a request's round trip, and the staging walk
// finds most of its answers there when it comes.
constexpr uint64_t kAskAhead = 256;
constexpr size_t kAsksInFlight = 64;
// Steps ahead of the walk whose files' attributes are asked of the fill first, while it reads them.
constexpr uint64_t kKnowAhead = 1024;
// How long the walk waits on a file whose attributes could not be read (no descriptor free, say).
constexpr auto kKnowAgain = std::chrono::milliseconds(100);
// A question not answered within this long is taken as "not held".
constexpr auto kAskTimeout = std::chrono::seconds(1);

}  // namespace

Stager::Stager(StagerParts p)
    : manifest_(p.manifest),
      state_(p.state),
      ram_(p.ram),
      chain_(p.chain),
      nvme_(p.nvme),
      peers_(p.peers),
      demand_(p.demand),
      counters_(p.counters),
      streams_(p.streams),
      kernel_(p.kernel),
      max_bytes_in_flight_(p.bytes_in_flight),
      idle_after_(p.idle),
      io_(p.depth),
      memory_retry_(p.memory_retry),
      handed_(std::move(p.handed)) {
  thread_ = std::thread([this] { run(); });
  try {
    planning_ = std::thread([this] { plan_loop(); });
  } catch (...) {
    {
      MutexLock lock(state_.mutex);
      state_.stop = true;
    }
    state_.wake_stager();
    thread_.join();
    throw;
  }
}

Stager::~Stager() {
  {
    MutexLock lock(state_.mutex);
    state_.stop = true;
  }
  state_.wake_stager();
  state_.flights_ended();
  plan_wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (planning_.joinable()) planning_.join();
}

void Stager::finish() {
  {
    MutexLock lock(state_.mutex);  // (so that the planning thread cannot miss the wake-up)
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
    MutexLock lock(state_.mutex);
    if (state_.stop) return false;
    state_.stager_nap(lock, kIdleWait);
    return !state_.stop;
  }
}

bool Stager::turn() {
  if (state_.short_of_memory.exchange(false)) give_back_memory(0);
  if (raise_budget_at_ && Clock::now() >= *raise_budget_at_) raise_ram_budget();
  run_drops();
  push_ahead();
  ask_kernel();
  std::vector<Pick> picks;
  std::vector<Write> writes;
  auto adopted = demand_.take_adopted();
  {
    MutexLock lock(state_.mutex);
    if (state_.stop) return false;
    unsigned room = io_.ring_room();
    keep_adopted(std::move(adopted));
    if (finishing_.load() && io_.idle()) return false;
    if (finishing_.load()) room = 0;
    give_back_if_idle();
    if (state_.idle) room = 0;  // nothing staged until the next read
    writes = pick_writes(room);
    room -= static_cast<unsigned>(writes.size());
    pick_readahead(room, picks);
    pick_deferred(room, picks);
    pick_handed(room, picks);
    pick_planned(room, picks);
    if (picks.empty() && writes.empty() && io_.idle() && (to_write_.empty() || !nvme_->admitting()) && !know_first_) {
      to_write_.clear();
      // Woken by opens only once the readers have moved some way (or read-ahead is queued): a wake-up
      // per open would cost every open a context switch.
      Clock::duration wait = state_.window.drops_waiting() ? kDropWait : kIdleWait;
      if (raise_budget_at_) wait = std::clamp<Clock::duration>(*raise_budget_at_ - Clock::now(), {}, wait);
      state_.stager_sleep(lock, state_.planner.cursor() + std::max<uint64_t>(1, state_.policy.evict_window() / 8),
                          wait);
      return true;
    }
  }
  for (Write& w : writes) write(w.id, std::move(w.bytes), w.key);
  for (const Pick& pick : picks) stage(pick);
  know_now();
  const bool idle = picks.empty() && writes.empty();
  if (io_.external_in_flight() > 0) io_.run(idle ? kPeerPoll : std::chrono::milliseconds(0));
  else if (idle) io_.run_waiting();
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
    MutexLock lock(state_.mutex);
    if (state_.stop || finishing_.load()) return;
    if (added) {
      state_.wake_stager();  // a waiting stager has the new epoch's files to stage
      continue;
    }
    lock.wait_for(plan_wake_, kPlanLook);
  }
}

bool Stager::plan_ahead() {
  std::optional<uint64_t> want;
  uint64_t ranks = 0;
  {
    MutexLock lock(state_.mutex);
    if (state_.stop || finishing_.load()) return false;
    want = state_.planner.wanted_epoch();
    ranks = state_.tracker.ranks();
  }
  if (!want) return false;
  // Built off the lock: an epoch of a large data set takes seconds.
  std::optional<EpochStreams> e;
  try {
    e = Planner::build(streams_, *want, ranks, manifest_.size());
  } catch (const std::exception& ex) {
    // Out of memory, most likely: what is planned is still staged, reads beyond go on demand.
    log_warning("cannot plan epoch " + std::to_string(*want) + ": " + ex.what() +
                "; staging stops at the end of the epochs planned, reads go on");
  }
  MutexLock lock(state_.mutex);
  if (state_.planner.wanted_epoch() != want) return false;
  const bool head = state_.planner.head_only();
  const uint64_t head_end = state_.planner.planned_end();
  state_.grow_plan(std::move(e));
  if (head && log_enabled(LogLevel::kDebug))
    log_debug("epoch " + std::to_string(*want) + " planned whole (" + std::to_string(state_.planner.planned_end()) +
              " uses), after its first " + std::to_string(head_end) + " alone");
  return true;
}

void Stager::give_back_if_idle() {
  if (idle_after_.count() == 0 || state_.idle) return;
  const int64_t last = state_.last_use_ns.load(std::memory_order_relaxed);
  if (Clock::now().time_since_epoch() - std::chrono::nanoseconds(last) < idle_after_) return;
  state_.idle = true;
  const auto [files, bytes] = state_.release_ram();
  counters_.idle_releases++;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(idle_after_).count();
  log_info("nothing read for " + std::to_string(seconds) + " s (idle=): " + std::to_string(files) + " files (" +
           human_bytes(static_cast<double>(bytes)) +
           ") in RAM and the pushed pages given back; staging again at the "
           "next read");
}

void Stager::run_drops() {
  std::vector<EntryId> drops;
  {
    MutexLock lock(state_.mutex);
    // Only this thread adds to in_flight, so a file not staged now stays so until the drops are done.
    drops = state_.window.take_drops([&](EntryId id) REQUIRES(state_.mutex) { return state_.in_flight(id); });
  }
  if (drops.empty()) return;
  if (kernel_)
    for (EntryId id : drops)
      if (in_kernel(manifest_.entry(id).size, [&] { return kernel_->drop(id); }) == 0) counters_.drops++;
  MutexLock lock(state_.mutex);
  state_.window.dropped(drops);
}

void Stager::push_ahead() {
  const std::function<bool(EntryId)> knows = [this](EntryId id) { return kernel_->knows(id); };
  if (const uint64_t n = kernel_ ? kernel_->introductions() : 0; n != introductions_seen_) {
    introductions_seen_ = n;
    MutexLock lock(state_.mutex);
    state_.window.introduced(Clock::now());
  }
  for (int i = 0; i < kPushesPerTurn; ++i) {
    std::optional<PageWindow::Push> push;
    {
      MutexLock lock(state_.mutex);
      if (!state_.window.active()) return;
      push = state_.window.next_push(Clock::now(), knows);
    }
    if (!push) return;
    const int rc =
        in_kernel(push->data->size(), [&] { return kernel_->push(push->id, push->data->data(), push->data->size()); });
    (rc < 0 ? counters_.push_failures : counters_.pushes)++;
    MutexLock lock(state_.mutex);
    state_.window.push_done(*push, rc < 0 ? rc : 0, Clock::now());
  }
}

int Stager::in_kernel(uint64_t bytes, const std::function<int()>& call) {
  state_.in_kernel_until(Clock::now() + kKernelCallGrace + std::chrono::nanoseconds(bytes / kKernelCallBytesPerNs));
  const int rc = call();
  state_.in_kernel_until(std::nullopt);
  return rc;
}

void Stager::keep_adopted(std::vector<std::pair<EntryId, FileBytes>> adopted) {
  // Files read whole on demand: kept like staged ones, so SOURCE sees them once.
  StagingPolicy& policy = state_.policy;
  for (auto& [id, bytes] : adopted) {
    if (policy.ram().contains(id) || state_.in_flight(id)) continue;
    const uint64_t key = policy.keep_key(id);
    if (key == kNever) continue;
    const uint64_t size = bytes->size();
    const bool kept = state_.kept_in_ram(id);
    if (state_.make_ram_room(size, key, kept)) {
      DemandAllowance::hand_over(bytes);
      state_.keep_in_ram(id, bytes, key, kept, Origin::kRam);
    }
    if (nvme_ && to_write_.size() < kMaxToWrite && !writing_.count(id) && !nvme_->find(id))
      to_write_.emplace_back(id, std::move(bytes));
  }
}

std::vector<Stager::Write> Stager::pick_writes(unsigned room) {
  // The adopted files' NVMe writes, as the ring has room (it may be full of reads for a while): first
  // those RAM did not take, whose only copy is the one waiting here.
  if (!to_write_.empty())
    std::stable_partition(to_write_.begin(), to_write_.end(),
                          [&](const auto& w) REQUIRES(state_.mutex) { return !state_.policy.ram().contains(w.first); });
  std::vector<Write> writes;
  size_t w = 0;
  for (; w < to_write_.size() && writes.size() < room; ++w) {
    auto& [id, bytes] = to_write_[w];
    const uint64_t key = state_.policy.keep_key(id);
    if (key == kNever || writing_.count(id) || nvme_->find(id)) continue;
    if (state_.make_nvme_room(bytes->size(), key)) {
      writes.push_back(Write{id, std::move(bytes), key});
      continue;
    }
    // NVMe is full of kept copies. A kept file whose only copy waits here goes to RAM instead, where
    // RAM's copies of NVMe's files make room for it (dropped, it would be read from SOURCE again). With
    // no room in either, it is dropped.
    if (state_.kept_in_ram(id) && !state_.policy.ram().contains(id) && state_.make_ram_room(bytes->size(), key, true)) {
      DemandAllowance::hand_over(bytes);
      state_.keep_in_ram(id, bytes, key, true, Origin::kRam);
    }
  }
  to_write_.erase(to_write_.begin(), to_write_.begin() + static_cast<std::ptrdiff_t>(w));
  return writes;
}

void Stager::pick_readahead(unsigned room, std::vector<Pick>& picks) {
  std::vector<EntryId>& queue = state_.tracker.readahead();
  size_t n = 0;
  for (; n < queue.size() && picks.size() < room; ++n) {
    const EntryId id = queue[n];
    if (!manifest_.known(id)) continue;  // its attributes not read yet (or gone): not read ahead
    const Entry& e = manifest_.entry(id);
    if (!S_ISREG(e.mode) || state_.policy.ram().contains(id) || on_its_way(id)) continue;
    if (kernel_ && state_.window.should_ask(id)) {  // read ahead only if the kernel no longer holds it
      state_.window.asking(id);
      to_ask_.push_back(id);
      readahead_asks_.insert(id);
      continue;
    }
    if (state_.window.kernel_may_hold(id)) continue;
    if (!room_in_flight(e.size)) break;
    if (!state_.make_readahead_room(e.size)) break;  // the rest waits for room (read files make it)
    picks.push_back(Pick{id, kReadAheadKey, true, state_.on_nvme(id) ? Origin::kNvme : Origin::kSource});
    take_off(id, e.size);
  }
  queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
  // Readers that went elsewhere leave their samples behind: the oldest go first.
  if (queue.size() > kMaxReadAheadQueued)
    queue.erase(queue.begin(), queue.end() - static_cast<std::ptrdiff_t>(kMaxReadAheadQueued));
}

bool Stager::on_its_way(EntryId id) const { return state_.in_flight(id) || demand_.loading_whole(id); }

void Stager::pick_planned(unsigned room, std::vector<Pick>& picks) {
  StagingPolicy& policy = state_.policy;
  // (A file on its way is skipped, not waited for: the walk would stand still for the load.)
  auto busy = [&](EntryId id) REQUIRES(state_.mutex) { return on_its_way(id); };
  while (picks.size() < room) {
    const auto c = policy.next_candidate(busy);
    if (!c) break;
    if (c->pending) {
      if (Clock::now() >= know_again_at_) wait_for_attributes(c->key, c->id);
      break;
    }
    if (deferred_ids_.contains(c->id)) {  // waiting for its keeper, for an earlier use
      policy.take();
      continue;
    }
    const bool kept = state_.kept_in_ram(c->id);
    if (kernel_ && !kept) {                     // (a file kept for the other nodes is staged: they ask this one)
      if (state_.window.kernel_holds(c->id)) {  // the kernel holds its pages: the use is read from them
        if (c->key >= left_up_to_) {            // (once: the walk may come again)
          counters_.left_to_kernel++;
          if (log_enabled(LogLevel::kDebug))
            log_debug("step " + std::to_string(c->key) + ": /" + manifest_.path(c->id) +
                      " not staged, the kernel holds its pages");
        }
        left_up_to_ = std::max(left_up_to_, c->key + 1);
        policy.take();
        continue;
      }
      if (state_.window.asking_now(c->id)) break;  // its answer is on its way
      if (state_.window.should_ask(c->id)) {       // asked at the next turn, then staged or not
        ask_key_ = c->key;
        break;
      }
    }
    // Its reader reads it from the stores itself right now (a miss): staged too, it would be read twice.
    if (policy.needed_soon(c->key) && demand_.reading(c->id)) {
      counters_.left_to_readers++;
      policy.take();
      continue;
    }
    if (!room_in_flight(c->size)) break;  // comes once those in flight are in
    // Full of files needed sooner, or this one is beyond the eviction window: wait for the readers.
    if (!state_.make_ram_room(c->size, c->key, kept)) {
      if (c->key != said_wait_at_ && log_enabled(LogLevel::kDebug))
        log_debug("staging waits for the readers at step " + std::to_string(c->key) + " (/" + manifest_.path(c->id) +
                  "): RAM holds files needed sooner" +
                  (policy.within_window(c->key) ? "" : ", or it is beyond the lead window"));
      said_wait_at_ = c->key;
      break;
    }
    Origin first = Origin::kSource;
    const bool soon = policy.needed_soon(c->key);
    if (state_.on_nvme(c->id))
      first = Origin::kNvme;
    else if (peers_ && peers_->may_hold(c->id)) {
      if (model_.prefer_peer(soon, peers_->in_flight(), io_.ring_in_flight() + static_cast<unsigned>(picks.size()),
                             io_.depth())) {
        first = Origin::kPeer;
      } else {
        counters_.source_over_peer++;
        counters_.source_over_peer_bytes += c->size;
      }
    }
    picks.push_back(Pick{c->id, c->key, false, first, first == Origin::kPeer && may_defer(soon)});
    take_off(c->id, c->size);
    policy.take();
  }
}

void Stager::wait_for_attributes(uint64_t key, EntryId id) {
  know_first_ = id;
  const uint64_t end = std::min(state_.planner.planned_end(), key + kKnowAhead);
  for (uint64_t k = std::max(key + 1, known_ahead_to_); k < end; ++k)
    if (state_.policy.upcoming(k))
      if (const EntryId next = *state_.planner.item(k); manifest_.pending(next)) to_know_.push_back(next);
  known_ahead_to_ = std::max(known_ahead_to_, end);
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
    MutexLock lock(state_.mutex);
    StagingPolicy& policy = state_.policy;
    // An answer that never came (the session ending, say) must not hold the staging walk: not held.
    for (auto it = asking_.begin(); it != asking_.end();) {
      if (now - it->second < kAskTimeout) {
        ++it;
        continue;
      }
      if (state_.window.answered(it->first, false)) state_.policy.restart();
      readahead_asks_.erase(it->first);
      asking_.erase(it++);
    }
    const uint64_t from = policy.stage_key();
    const uint64_t end = std::min(state_.planner.planned_end(), from + kAskAhead);
    auto walk = [&](uint64_t& key, uint64_t end, bool again) REQUIRES(state_.mutex) {
      for (; key < end && asking_.size() + ask.size() < kAsksInFlight; ++key) {
        if (!policy.upcoming(key)) continue;
        const EntryId id = *state_.planner.item(key);
        // (Its attributes not read yet: never looked up, so the kernel holds none of its pages.)
        if (!manifest_.known(id) || policy.owned(id) || policy.ram().contains(id) ||
            !(again ? state_.window.should_ask_again(id) : state_.window.should_ask(id)))
          continue;
        state_.window.asking(id);
        ask.push_back(id);
      }
    };
    // The uses coming near first: a file the kernel said it held may be gone from it by now.
    uint64_t near = state_.planner.cursor();
    while (policy.needed_soon(near)) ++near;
    again_key_ = std::max(again_key_, state_.planner.cursor());
    walk(again_key_, near, true);
    ask_key_ = std::max(ask_key_, from);
    walk(ask_key_, end, false);
    ask.insert(ask.end(), to_ask_.begin(), to_ask_.end());  // read-ahead's, from the last turn
    to_ask_.clear();
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
  MutexLock lock(state_.mutex);
  const bool readahead = readahead_asks_.erase(id) != 0;
  if (!state_.window.answered(id, held)) {
    if (readahead && !held) state_.tracker.readahead().push_back(id);  // read ahead after all
    return;
  }
  // Taken back since the kernel said it held it: staged after all, the walk going back for it.
  counters_.kernel_took_back++;
  state_.policy.restart();
}

bool Stager::may_defer(bool soon) const {
  return !soon && deferred_.size() < kMaxDeferred;
}

void Stager::pop_deferred() {
  deferred_ids_.erase(deferred_.top().second);
  deferred_.pop();
}

void Stager::pick_deferred(unsigned room, std::vector<Pick>& picks) {
  StagingPolicy& policy = state_.policy;
  while (!deferred_.empty() && picks.size() < room) {
    const auto [key, id] = deferred_.top();
    // Passed or read on demand meanwhile, or there by another way: nothing left to do.
    if (!policy.upcoming(key) || policy.ram().contains(id) || on_its_way(id)) {
      pop_deferred();
      continue;
    }
    if (!policy.needed_soon(key)) return;  // nor are the others, needed later
    const uint64_t size = manifest_.entry(id).size;
    if (!room_in_flight(size)) return;
    // Full of files needed sooner, or beyond the eviction window and no free room: wait for the readers.
    if (!state_.make_ram_room(size, key, state_.kept_in_ram(id))) return;
    pop_deferred();
    picks.push_back(Pick{id, key, false, peers_ && peers_->may_hold(id) ? Origin::kPeer : Origin::kSource});
    take_off(id, size);
  }
}

void Stager::pick_handed(unsigned room, std::vector<Pick>& picks) {
  // Read from SOURCE here once, early, while RAM has room (at the start it is empty): the node that reads
  // them first, and every later reader, then asks this one. Takes free room, or that of RAM copies of
  // files NVMe holds; else waits for it (never pushes out a file's only copy).
  StagingPolicy& policy = state_.policy;
  for (; next_handed_ < handed_.size() && picks.size() < room; ++next_handed_) {
    const EntryId id = handed_[next_handed_];
    if (!manifest_.known(id) || policy.ram().contains(id) || on_its_way(id) || state_.on_nvme(id)) continue;
    const uint64_t key = policy.keep_key(id), size = manifest_.entry(id).size;
    if (key == kNever) continue;
    if (!room_in_flight(size) || !state_.make_ram_room(size, key, true)) return;
    picks.push_back(Pick{id, key, false, Origin::kSource});
    take_off(id, size);
    counters_.handed_staged++;
  }
}

void Stager::stage(const Pick& pick) {
  std::shared_ptr<std::vector<char>> buf;
  try {
    buf = std::make_shared<std::vector<char>>(manifest_.entry(pick.id).size);
  } catch (const std::bad_alloc&) {
    // ram= is more than this process may allocate (an address-space limit, overcommit off): the file is
    // left to SOURCE like a failed read, and RAM is given back.
    const uint64_t size = manifest_.entry(pick.id).size;
    ram_.unreserve(size);
    counters_.stage_failures++;
    finish(pick.id);
    give_back_memory(size);
    return;
  }
  chain_.start_fetch(io_, pick.id, std::move(buf), pick.first,
                     [this, pick](const StoreChain::Result& r) { staged(pick, r); }, pick.peer_only);
}

void Stager::give_back_memory(uint64_t bytes) {
  const uint64_t budget = ram_.lower_budget_below_used(bytes + kServingRoom);
  unsigned let_go = 0;
  {
    MutexLock lock(state_.mutex);
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

void Stager::staged(const Pick& pick, const StoreChain::Result& r) {
  const uint64_t size = manifest_.entry(pick.id).size;
  if (log_enabled(LogLevel::kDebug) && pick.first == Origin::kPeer && r.from != Origin::kPeer)
    log_debug("staging /" + manifest_.path(pick.id) + ": its peer did not serve it (refused, timed out or gone)" +
              (r.rc < 0 ? pick.peer_only ? "; asked again once needed soon" : "" : "; read from the next store"));
  if (r.rc < 0) {
    ram_.unreserve(size);
    if (pick.peer_only) {  // asked again once needed soon
      if (deferred_ids_.insert(pick.id).second) deferred_.emplace(pick.key, pick.id);
      counters_.peer_deferrals++;
    } else {
      counters_.stage_failures++;
    }
    finish(pick.id);
    return;
  }
  if (r.from == Origin::kPeer || (r.from == Origin::kSource && size > 0))
    model_.note(r.from == Origin::kPeer, seconds_since(r.since));
  if (r.from == Origin::kPeer) {
    counters_.staged_from_peer++;
    counters_.staged_peer_bytes += size;
  } else if (r.from == Origin::kSource) {
    counters_.staged_source_bytes += size;
  }
  uint64_t after = kNever;
  const bool to_nvme = keep(pick, r, &after);
  finish(pick.id);
  if (to_nvme) write(pick.id, r.buf, after);
}

bool Stager::keep(const Pick& pick, const StoreChain::Result& r, uint64_t* after) {
  MutexLock lock(state_.mutex);
  *after = state_.staged(pick.id, r.buf, r.from, pick.readahead);
  return nvme_ && *after != kNever && !writing_.count(pick.id) && !nvme_->find(pick.id) &&
         state_.make_nvme_room(r.buf->size(), *after);
}

void Stager::write(EntryId id, FileBytes bytes, uint64_t key) {
  writing_.insert(id);
  nvme_->start_offer(io_, id, std::move(bytes), [this, id, key](int rc) { written(id, key, rc); });
}

void Stager::written(EntryId id, uint64_t key, int rc) {
  writing_.erase(id);
  if (rc < 0) return;  // counted (and a full disk logged) by the tier
  MutexLock lock(state_.mutex);
  state_.written(id, key);
}

bool Stager::room_in_flight(uint64_t size) const {
  return bytes_in_flight_ == 0 || bytes_in_flight_ + size <= max_bytes_in_flight_;
}

void Stager::take_off(EntryId id, uint64_t size) {
  state_.flight_started(id);
  bytes_in_flight_ += size;
}

void Stager::finish(EntryId id) {
  {
    MutexLock lock(state_.mutex);
    if (state_.flight_ended(id)) bytes_in_flight_ -= manifest_.entry(id).size;
  }
  state_.flights_ended();
}

}  // namespace clairfs
