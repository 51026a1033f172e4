// A tier's residents ordered by when each is needed next (a planner key): what Belady's MIN evicts first
// is the resident needed farthest in the future.
//
// Thread-compatible: the engine guards it with its own mutex.
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "clairfs/manifest.hpp"

namespace clairfs {

class NextUseIndex {
 public:
  // Inserts id, or moves it to `key`.
  void set(EntryId id, uint64_t key) {
    auto [it, fresh] = key_.try_emplace(id, key);
    if (!fresh) {
      by_key_.erase({it->second, id});
      it->second = key;
    }
    by_key_.insert({key, id});
  }
  bool erase(EntryId id) {
    auto it = key_.find(id);
    if (it == key_.end()) return false;
    by_key_.erase({it->second, id});
    key_.erase(it);
    return true;
  }
  bool contains(EntryId id) const { return key_.count(id) != 0; }
  std::optional<uint64_t> key(EntryId id) const {
    auto it = key_.find(id);
    return it == key_.end() ? std::nullopt : std::optional<uint64_t>(it->second);
  }
  // The use at `passed` went by: if id was waiting for it (or an earlier one), it now waits for `next`.
  void passed(EntryId id, uint64_t passed, uint64_t next) {
    auto it = key_.find(id);
    if (it != key_.end() && it->second <= passed) set(id, next);
  }
  // (key, id) of the resident needed last, if any.
  std::optional<std::pair<uint64_t, EntryId>> farthest() const {
    if (by_key_.empty()) return std::nullopt;
    return *std::prev(by_key_.end());
  }
  size_t size() const { return key_.size(); }

 private:
  std::set<std::pair<uint64_t, EntryId>> by_key_;
  std::unordered_map<EntryId, uint64_t> key_;
};

}  // namespace clairfs
