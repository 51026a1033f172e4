#include "engine/watched_uses.hpp"

#include <iterator>
#include <utility>

namespace clairfs {

bool WatchedUses::opened(EntryId id, Clock::time_point now) {
  bool counted = false;  // by its first read, which came before this news (the watch's thread behind)
  if (auto it = read_before_open_.find(id); it != read_before_open_.end()) {
    counted = now - it->second.at < kAge;
    if (!counted || --it->second.opens == 0) read_before_open_.erase(it);
  }
  if (told_.size() >= kMaxRemembered) {
    for (auto t = told_.begin(); t != told_.end();) t = now - t->second >= kAge ? told_.erase(t) : std::next(t);
    if (told_.size() > kMaxRemembered / 2) told_.clear();  // a scan per half at most
  }
  told_[id] = now;
  if (!counted) unread_[id].opens++;
  return !counted;
}

void WatchedUses::hold(EntryId id, FileBytes data, Origin from) {
  auto it = unread_.find(id);
  if (it == unread_.end() || it->second.data) return;
  it->second.data = std::move(data);
  it->second.from = from;
}

bool WatchedUses::take_unread(EntryId id, FileBytes* data, Origin* from) {
  auto it = unread_.find(id);
  if (it == unread_.end()) return false;
  *data = it->second.data;
  *from = it->second.from;
  if (--it->second.opens == 0) unread_.erase(it);
  return true;
}

bool WatchedUses::read_before_told(EntryId id, Clock::time_point now) {
  if (read_before_open_.size() > kMaxRemembered) read_before_open_.clear();
  ReadFirst& r = read_before_open_[id];
  if (r.opens > 0 && now - r.at < kAge) return false;  // read again before told: counted once
  r.opens = 1;
  r.at = now;
  return true;
}

bool WatchedUses::told_lately(EntryId id, Clock::time_point now) const {
  auto it = told_.find(id);
  return it != told_.end() && now - it->second < kAge;
}

void WatchedUses::forget() {
  unread_.clear();
  read_before_open_.clear();
  told_.clear();
}

}  // namespace clairfs
