// The peer nodes as a store: a file another node keeps for all (it owns it in the global plan) is asked
// of that node rather than of SOURCE.
//
// fetch() (a request thread's miss) waits for the answer up to `wait`; start_fetch() (the stager) hands
// the transport an IoLoop::external() completion, so the answer runs on the stager's thread. The
// transport checks the length of what arrives; anything but the whole file is a refusal, and the caller
// goes on to the next store.
//
// Thread-safe: the transport is, and this holds no state but the stager's count of fetches in flight.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "clairfs/peer.hpp"
#include "clairfs/store.hpp"

namespace clairfs {

class PeerStore final : public Store {
 public:
  // REQUIRES: transport outlives the store; owner has an entry per manifest entry.
  PeerStore(PeerTransport& transport, std::vector<uint16_t> owner, std::chrono::milliseconds wait);

  Origin origin() const override { return Origin::kPeer; }
  // Kept by another node, which may still be asked.
  bool may_hold(EntryId id) const override;
  int fetch(EntryId id, const Buffer& buf) override;
  void start_fetch(IoLoop& io, EntryId id, Buffer buf, Done done) override;

  // This node keeps the file for the others.
  bool owned(EntryId id) const { return owner_[id] == node_; }
  int node() const { return node_; }
  PeerTransport& transport() const { return transport_; }
  const std::vector<uint16_t>& owners() const { return owner_; }
  // Stager only: its fetches not answered yet.
  unsigned in_flight() const override { return in_flight_; }

 private:
  PeerTransport& transport_;
  const std::vector<uint16_t> owner_;
  const int node_;
  const std::chrono::milliseconds wait_;
  unsigned in_flight_ = 0;
};

}  // namespace clairfs
