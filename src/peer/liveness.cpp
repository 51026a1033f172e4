#include "peer/liveness.hpp"

#include <algorithm>

namespace clairfs {

void PeerLiveness::asked(int peer, uint64_t bytes, Clock::time_point now) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.owed == 0 && p.heard < now) p.heard = now;  // silence counts from when it began to owe
  ++p.owed;
  p.owed_bytes += bytes;
}

void PeerLiveness::ended(int peer, uint64_t bytes) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.owed > 0) --p.owed;
  p.owed_bytes = p.owed_bytes > bytes ? p.owed_bytes - bytes : 0;
  if (p.owed == 0) p.owed_bytes = 0;
}

bool PeerLiveness::heard(int peer, Clock::time_point now) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.pinged && !p.dead) {  // its answer to the ping in time (or another message after it)
    p.slow_pong = std::max<Clock::duration>(now - *p.pinged, p.slow_pong - p.slow_pong / 8);
    p.proven = true;
  }
  p.heard = now;
  p.pinged.reset();
  if (!p.dead) return false;
  p.dead = false;
  ++p.returns;
  return true;
}

void PeerLiveness::answered(int peer) { peers_[static_cast<size_t>(peer)].proven = true; }

PeerLiveness::Clock::duration PeerLiveness::within(const Peer& p) const {
  Clock::duration within = p.proven ? std::max<Clock::duration>(config_.answer_within, 4 * p.slow_pong)
                                    : Clock::duration{config_.unproven_within};
  if (p.returns > 0)
    within = std::min<Clock::duration>(std::max<Clock::duration>(within, config_.longest_within),
                                       within * (int64_t{1} << std::min(p.returns, 16u)));
  const auto queued = std::chrono::duration<double>(static_cast<double>(p.owed_bytes) / config_.link_bytes_per_second);
  return within + std::chrono::duration_cast<Clock::duration>(queued);
}

PeerLiveness::Turn PeerLiveness::turn(Clock::time_point now) {
  Turn t;
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (p.dead || p.owed == 0) continue;
    if (p.pinged) {
      if (now - *p.pinged >= within(p)) {
        p.dead = true;
        t.dead.push_back(static_cast<int>(i));
      }
    } else if (now - p.heard >= config_.probe_after) {
      p.pinged = now;
      t.ping.push_back(static_cast<int>(i));
    }
  }
  return t;
}

}  // namespace clairfs
