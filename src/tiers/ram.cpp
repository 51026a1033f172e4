#include "tiers/ram.hpp"

namespace clairfs {

bool RamTier::reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (held_ + reserved_ + bytes > budget_) return false;
  reserved_ += bytes;
  return true;
}

void RamTier::unreserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ -= std::min(reserved_, bytes);
}

void RamTier::insert(EntryId id, FileBytes data) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t size = data->size();
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
  const uint64_t size = it->second->size();
  held_ -= size;
  files_.erase(it);
  return size;
}

uint64_t RamTier::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_ + reserved_;
}

uint64_t RamTier::files() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return files_.size();
}

}  // namespace clairfs
