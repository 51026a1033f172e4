// A tier's residents ordered by when each is needed next (a planner key): what Belady's MIN evicts first
// is the resident needed farthest in the future.
//
// Thread-compatible: the engine guards it with its own mutex.
#pragma once

#include <absl/container/btree_set.h>
#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "clairfs/types.hpp"
#include "util/flat_map.hpp"

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
    shrink_if_sparse(key_);
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
  // Each resident keyed in [lo, hi) moved to new_key(id, its key).
  template <class NewKey>
  void rekey(uint64_t lo, uint64_t hi, const NewKey& new_key) {
    std::vector<std::pair<uint64_t, EntryId>> moved;
    for (auto it = by_key_.lower_bound({lo, 0}); it != by_key_.end() && it->first < hi; ++it) moved.push_back(*it);
    for (const auto& [key, id] : moved) set(id, new_key(id, key));
  }
  // (key, id) of the resident needed last, if any.
  std::optional<std::pair<uint64_t, EntryId>> farthest() const {
    if (by_key_.empty()) return std::nullopt;
    return *std::prev(by_key_.end());
  }
  // (key, id) of the resident needed last among those needed before `limit`, if any.
  std::optional<std::pair<uint64_t, EntryId>> farthest_below(uint64_t limit) const {
    auto it = by_key_.lower_bound({limit, 0});
    if (it == by_key_.begin()) return std::nullopt;
    return *std::prev(it);
  }
  // The id of the resident needed last among the `limit` needed last that `pick` accepts, if any.
  template <class Pick>
  std::optional<EntryId> farthest_where(const Pick& pick, size_t limit) const {
    size_t n = 0;
    for (auto it = by_key_.rbegin(); it != by_key_.rend() && n < limit; ++it, ++n)
      if (pick(it->second)) return it->second;
    return std::nullopt;
  }
  size_t size() const { return key_.size(); }
  // Bytes held: the B-tree's nodes (256 B for up to 15 residents, estimated two thirds full) and the
  // hash table's slots with their control bytes. A node-based set and map took 104 B a resident.
  size_t memory_bytes() const { return by_key_.size() * kTreeBytesPerResident + key_.capacity() * (sizeof(KeyOf::value_type) + 1); }
  static constexpr size_t kTreeBytesPerResident = 26;

 private:
  using KeyOf = absl::flat_hash_map<EntryId, uint64_t>;
  absl::btree_set<std::pair<uint64_t, EntryId>> by_key_;
  KeyOf key_;
};

// A tier's residents in two groups: the files this node keeps for the other nodes (it owns them in the
// global plan; see peer.hpp) and the rest. Each group is ordered by next use; a file of the rest may
// push out only another of the rest, an owned file either, so what peers count on stays while the node
// has room for it. With one node nothing is owned and this is plain MIN.
class TierIndex {
 public:
  void set(EntryId id, uint64_t key, bool owned) { (owned ? owned_ : rest_).set(id, key); }
  bool erase(EntryId id) { return rest_.erase(id) || owned_.erase(id); }
  bool contains(EntryId id) const { return rest_.contains(id) || owned_.contains(id); }
  std::optional<uint64_t> key(EntryId id) const {
    auto k = rest_.key(id);
    return k ? k : owned_.key(id);
  }
  void passed(EntryId id, uint64_t passed, uint64_t next) {
    rest_.passed(id, passed, next);
    owned_.passed(id, passed, next);
  }
  // Each resident keyed in [lo, hi) moved to new_key(id, its key, owned).
  template <class NewKey>
  void rekey(uint64_t lo, uint64_t hi, const NewKey& new_key) {
    rest_.rekey(lo, hi, [&](EntryId id, uint64_t key) { return new_key(id, key, false); });
    owned_.rekey(lo, hi, [&](EntryId id, uint64_t key) { return new_key(id, key, true); });
  }
  // The resident to evict for a file needed at `key`: one needed later than that, from the rest first
  // (owned ones only for an owned file); nullopt if none may go.
  std::optional<EntryId> victim(uint64_t key, bool owned) const {
    if (auto far = rest_.farthest(); far && far->first > key) return far->second;
    if (owned)
      if (auto far = owned_.farthest(); far && far->first > key) return far->second;
    return std::nullopt;
  }
  // The resident needed last, of the rest first.
  std::optional<EntryId> farthest() const {
    if (auto far = rest_.farthest()) return far->second;
    if (auto far = owned_.farthest()) return far->second;
    return std::nullopt;
  }
  // The resident needed last of the rest (for read-ahead, which takes only what no plan needs).
  std::optional<std::pair<uint64_t, EntryId>> farthest_unowned() const { return rest_.farthest(); }
  std::optional<std::pair<uint64_t, EntryId>> farthest_unowned_below(uint64_t limit) const { return rest_.farthest_below(limit); }
  template <class Pick>
  std::optional<EntryId> farthest_unowned_where(const Pick& pick, size_t limit) const {
    return rest_.farthest_where(pick, limit);
  }
  size_t size() const { return rest_.size() + owned_.size(); }
  size_t memory_bytes() const { return rest_.memory_bytes() + owned_.memory_bytes(); }
  size_t owned() const { return owned_.size(); }

 private:
  NextUseIndex rest_, owned_;
};

}  // namespace clairfs
