#include "tiers/ram.hpp"

#include <algorithm>

namespace clairfs {
namespace {

// Lingering files counted at most before the freed among them are looked for.
constexpr size_t kSettleEvery = 1024;

}  // namespace

bool RamTier::reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (held_ + reserved_ + lingering_bytes_ + charge(bytes) > budget_) settle();
  if (held_ + reserved_ + lingering_bytes_ + charge(bytes) > budget_) return false;
  reserved_ += charge(bytes);
  return true;
}

uint64_t RamTier::budget() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return budget_;
}

uint64_t RamTier::lower_budget_to_used() {
  std::lock_guard<std::mutex> lock(mutex_);
  settle();
  budget_ = std::min(budget_, held_ + reserved_ + lingering_bytes_);
  return budget_;
}

void RamTier::unreserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= std::min(reserved_, charge(bytes));
}

void RamTier::insert(EntryId id, FileBytes data) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t size = charge(data->size());
  reserved_ -= std::min(reserved_, size);
  auto [it, inserted] = files_.emplace(id, std::move(data));
  if (inserted) held_ += size;
}

FileBytes RamTier::get(EntryId id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find(id);
  return it == files_.end() ? nullptr : it->second;
}

bool RamTier::contains(EntryId id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return files_.count(id) != 0;
}

uint64_t RamTier::erase(EntryId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = files_.find(id);
  if (it == files_.end()) return 0;
  const FileBytes bytes = std::move(it->second);
  const uint64_t size = bytes->size();
  held_ -= charge(size);
  files_.erase(it);
  if (bytes.use_count() > 1) {  // someone else holds it: counted until freed
    if (lingering_.size() >= kSettleEvery) settle();  // not left to the next full budget alone
    lingering_.push_back({bytes, charge(size)});
    lingering_bytes_ += charge(size);
  }
  return size;
}

void RamTier::settle() {
  auto freed = [this](const Lingering& l) {
    if (!l.bytes.expired()) return false;
    lingering_bytes_ -= l.size;
    return true;
  };
  lingering_.erase(std::remove_if(lingering_.begin(), lingering_.end(), freed), lingering_.end());
}

uint64_t RamTier::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_ + reserved_ + lingering_bytes_;
}

uint64_t RamTier::files() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return files_.size();
}

struct DemandAllowance::Release {
  std::shared_ptr<std::atomic<uint64_t>> used;
  uint64_t size;
  bool counted;
  void operator()(std::vector<char>* bytes) const {
    if (counted) used->fetch_sub(size);
    delete bytes;
  }
};

std::shared_ptr<std::vector<char>> DemandAllowance::allocate(uint64_t size) {
  uint64_t now = used_->load();
  do {
    if (size > limit_ || now > limit_ - size) return nullptr;
  } while (!used_->compare_exchange_weak(now, now + size));
  std::unique_ptr<std::vector<char>> bytes;
  try {
    bytes = std::make_unique<std::vector<char>>(size);
  } catch (const std::bad_alloc&) {  // the process may not have more (an address-space limit): as over the limit
    used_->fetch_sub(size);
    return nullptr;
  }
  // Should the control block fail to allocate, shared_ptr calls the deleter, which gives the share back.
  return std::shared_ptr<std::vector<char>>(bytes.release(), Release{used_, size, true});
}

void DemandAllowance::hand_over(const FileBytes& bytes) {
  // The deleter is read when the last owner lets go, which happens after this call returns (the
  // caller owns `bytes`), so the flag needs no lock.
  auto* release = std::get_deleter<Release>(bytes);
  if (!release || !release->counted) return;
  release->counted = false;
  release->used->fetch_sub(release->size);
}

}  // namespace clairfs
