#include "tiers/ram.hpp"

#include <algorithm>
#include <cstring>
#include <new>

#include "util/flat_map.hpp"

namespace clairfs {
namespace {

// Lingering files counted at most before the freed among them are looked for.
constexpr size_t kSettleEvery = 1024;

}  // namespace

bool RamTier::reserve(uint64_t bytes) {
  MutexLock lock(mutex_);
  if (held_ + reserved_ + lingering_bytes_ + charge(bytes) > budget_) settle();
  if (held_ + reserved_ + lingering_bytes_ + charge(bytes) > budget_) return false;
  reserved_ += charge(bytes);
  return true;
}

uint64_t RamTier::budget() const {
  MutexLock lock(mutex_);
  return budget_;
}

uint64_t RamTier::lower_budget_below_used(uint64_t less) {
  MutexLock lock(mutex_);
  settle();
  const uint64_t used = held_ + reserved_ + lingering_bytes_;
  budget_ = std::min(budget_, used - std::min(used, less));
  return budget_;
}

uint64_t RamTier::raise_budget(uint64_t more) {
  MutexLock lock(mutex_);
  budget_ += std::min(configured_ - std::min(configured_, budget_), more);
  return budget_;
}

void RamTier::unreserve(uint64_t bytes) {
  MutexLock lock(mutex_);
  reserved_ -= std::min(reserved_, charge(bytes));
}

RamTier::Small RamTier::make_small(const Bytes& bytes) {
  const auto size = static_cast<uint32_t>(bytes.size());
  Small s(static_cast<char*>(::operator new(sizeof size + size)));
  std::memcpy(s.get(), &size, sizeof size);
  if (size != 0) std::memcpy(s.get() + sizeof size, bytes.data(), size);
  return s;
}

uint32_t RamTier::small_size(const Small& s) {
  uint32_t size;
  std::memcpy(&size, s.get(), sizeof size);
  return size;
}

void RamTier::insert(EntryId id, FileBytes data) {
  const uint64_t bytes = data->size();
  Small small = bytes <= kSmallFile ? make_small(*data) : nullptr;  // allocated before the lock is taken
  MutexLock lock(mutex_);
  const uint64_t size = charge(bytes);
  reserved_ -= std::min(reserved_, size);
  if (small_.contains(id) || large_.contains(id)) return;
  if (small)
    small_.emplace(id, std::move(small));
  else
    large_.emplace(id, std::move(data));
  held_ += size;
  held_bytes_ += bytes;
}

FileBytes RamTier::get(EntryId id) const {
  MutexLock lock(mutex_);
  if (auto it = small_.find(id); it != small_.end()) {
    const char* at = it->second.get() + sizeof(uint32_t);
    return std::make_shared<const Bytes>(at, at + small_size(it->second));
  }
  auto it = large_.find(id);
  return it == large_.end() ? nullptr : it->second;
}

bool RamTier::contains(EntryId id) const {
  MutexLock lock(mutex_);
  return small_.contains(id) || large_.contains(id);
}

uint64_t RamTier::erase(EntryId id) {
  Small gone;  // freed after the lock is let go
  MutexLock lock(mutex_);
  if (auto it = small_.find(id); it != small_.end()) {
    gone = std::move(it->second);
    small_.erase(it);
    shrink_if_sparse(small_);
    const uint64_t size = small_size(gone);
    held_ -= charge(size);
    held_bytes_ -= size;
    return size;
  }
  auto it = large_.find(id);
  if (it == large_.end()) return 0;
  const FileBytes bytes = std::move(it->second);
  const uint64_t size = bytes->size();
  held_ -= charge(size);
  held_bytes_ -= size;
  large_.erase(it);
  shrink_if_sparse(large_);
  if (bytes.use_count() > 1) {  // someone else holds it: counted until freed
    if (lingering_.size() >= kSettleEvery) settle();  // not left to the next full budget alone
    lingering_.push_back({bytes, charge(size)});
    lingering_bytes_ += charge(size);
  }
  return size;
}

void RamTier::settle() {
  auto freed = [this](const Lingering& l) REQUIRES(mutex_) {
    if (!l.bytes.expired()) return false;
    lingering_bytes_ -= l.size;
    return true;
  };
  lingering_.erase(std::remove_if(lingering_.begin(), lingering_.end(), freed), lingering_.end());
}

uint64_t RamTier::used() const {
  MutexLock lock(mutex_);
  return held_ + reserved_ + lingering_bytes_;
}

uint64_t RamTier::files() const {
  MutexLock lock(mutex_);
  return small_.size() + large_.size();
}

std::vector<EntryId> RamTier::ids() const {
  MutexLock lock(mutex_);
  std::vector<EntryId> out;
  out.reserve(small_.size() + large_.size());
  for (const auto& [id, bytes] : small_) out.push_back(id);
  for (const auto& [id, bytes] : large_) out.push_back(id);
  return out;
}

uint64_t RamTier::bookkeeping() const {
  MutexLock lock(mutex_);
  return held_ - held_bytes_;
}

struct DemandAllowance::Release {
  std::shared_ptr<Shared> shared;
  uint64_t size;
  bool counted;
  void operator()(Bytes* bytes) const {
    if (counted) shared->give_back(size);
    delete bytes;
  }
};

void DemandAllowance::Shared::give_back(uint64_t size) {
  used.fetch_sub(size);
  if (waiting.load() == 0) return;
  MutexLock lock(mutex);  // (so that a waiter between its look and its wait is not missed)
  freed.notify_all();
}

std::shared_ptr<Bytes> DemandAllowance::allocate(uint64_t size) {
  uint64_t now = shared_->used.load();
  do {
    if (size > limit_ || now > limit_ - size) return nullptr;
  } while (!shared_->used.compare_exchange_weak(now, now + size));
  std::unique_ptr<Bytes> bytes;
  try {
    bytes = std::make_unique<Bytes>(size);
  } catch (const std::bad_alloc&) {  // the process may not have more (an address-space limit): as over the limit
    shared_->give_back(size);
    return nullptr;
  }
  // Should the control block fail to allocate, shared_ptr calls the deleter, which gives the share back.
  return std::shared_ptr<Bytes>(bytes.release(), Release{shared_, size, true});
}

std::shared_ptr<Bytes> DemandAllowance::allocate_by(uint64_t size, Clock::time_point deadline, bool* waited) {
  *waited = false;
  if (auto bytes = allocate(size); bytes || size > limit_) return bytes;
  *waited = true;
  Shared& s = *shared_;
  s.waiting++;
  std::shared_ptr<Bytes> bytes;
  // (allocate() is tried without the mutex: should the buffer's control block fail to allocate, its
  // deleter gives the share back, which takes the mutex.)
  while (!(bytes = allocate(size)) && Clock::now() < deadline) {
    MutexLock lock(s.mutex);
    // Looked at again under the mutex: a share given back since the try above would wake no one.
    if (s.used.load() > limit_ - size)
      lock.wait_for(s.freed, std::min<Clock::duration>(deadline - Clock::now(), std::chrono::milliseconds(10)));
  }
  s.waiting--;
  return bytes;
}

void DemandAllowance::hand_over(const FileBytes& bytes) {
  // The deleter is read when the last owner lets go, which happens after this call returns (the
  // caller owns `bytes`), so the flag needs no lock.
  auto* release = std::get_deleter<Release>(bytes);
  if (!release || !release->counted) return;
  release->counted = false;
  release->shared->give_back(release->size);
}

}  // namespace clairfs
