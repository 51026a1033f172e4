// A fake for the peer loop's tests: LoopbackWires joins several nodes' Wires in one process. Messages
// are matched as MPI matches them — by sender and tag, in the order sent — and a send ends at once (its
// bytes copied, as MPI's eager sends of small messages), so a node whose loop is not turned is a peer
// that has gone silent. kill(node) is a peer that failed: operations with it break, and so does each
// node's standing receive from any node, once (as MPICH's do), and later ones with it break at once.
// Thread-safe, so that WirePeers' threads may share it.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "peer/wire.hpp"

namespace clairfs::fakes {

class LoopbackWires {
 public:
  explicit LoopbackWires(int nodes, int max_tag = 32767) : max_tag_(max_tag), dead_(static_cast<size_t>(nodes), false) {
    for (int n = 0; n < nodes; ++n) ends_.push_back(std::make_unique<End>(*this, n));
  }
  Wire& end(int node) { return *ends_[static_cast<size_t>(node)]; }
  int nodes() const { return static_cast<int>(ends_.size()); }

  void kill(int node) {
    std::lock_guard<std::mutex> lock(mutex_);
    dead_[static_cast<size_t>(node)] = true;
    for (auto& e : ends_) {
      if (e->node_ == node) continue;
      for (auto& [id, op] : e->ops_)
        if (op.state == kPending && (op.peer == node || (op.receive && op.peer == Wire::kAnyNode))) op.state = kBroken;
      e->inbox_.erase(
          std::remove_if(e->inbox_.begin(), e->inbox_.end(), [&](const Message& m) { return m.from == node; }),
          e->inbox_.end());
    }
  }
  // Messages sent to `node` that no receive took yet.
  size_t unmatched(int node) {
    std::lock_guard<std::mutex> lock(mutex_);
    return ends_[static_cast<size_t>(node)]->inbox_.size();
  }
  // Memory the node's wire was handed at the loop's end (Wire::strand).
  size_t stranded(int node) {
    std::lock_guard<std::mutex> lock(mutex_);
    return ends_[static_cast<size_t>(node)]->stranded_.size();
  }

 private:
  enum State { kPending, kDone, kBroken, kCancelled };
  struct Op {
    bool receive = false;
    char* into = nullptr;
    size_t len = 0;
    int peer = Wire::kAnyNode;
    int tag = 0;
    State state = kPending;
    int from = -1;
    size_t bytes = 0;
  };
  struct Message {
    int from;
    int tag;
    std::vector<char> bytes;
  };

  class End final : public Wire {
   public:
    End(LoopbackWires& hub, int node) : hub_(hub), node_(node) {}
    int node() const override { return node_; }
    int nodes() const override { return hub_.nodes(); }
    int max_tag() const override { return hub_.max_tag_; }

    Op receive(void* into, size_t len, int from, int tag) override {
      std::lock_guard<std::mutex> lock(hub_.mutex_);
      const Wire::Op id = next_++;
      LoopbackWires::Op& op = ops_[id];
      op.receive = true, op.into = static_cast<char*>(into), op.len = len, op.peer = from, op.tag = tag;
      if (from != kAnyNode && hub_.dead_[static_cast<size_t>(from)]) {
        op.state = kBroken;
        return id;
      }
      for (auto it = inbox_.begin(); it != inbox_.end(); ++it)
        if (matches(op, *it)) {
          deliver(op, *it);
          inbox_.erase(it);
          break;
        }
      return id;
    }
    Op send(const void* data, size_t len, int to, int tag) override {
      std::lock_guard<std::mutex> lock(hub_.mutex_);
      const Wire::Op id = next_++;
      LoopbackWires::Op& op = ops_[id];
      op.peer = to, op.tag = tag, op.len = len;
      if (hub_.dead_[static_cast<size_t>(to)] || hub_.dead_[static_cast<size_t>(node_)]) {
        op.state = kBroken;
        return id;
      }
      Message m{node_, tag, std::vector<char>(static_cast<const char*>(data), static_cast<const char*>(data) + len)};
      End& dest = *hub_.ends_[static_cast<size_t>(to)];
      op.state = kDone;
      for (auto& [rid, r] : dest.ops_)  // the oldest pending receive that matches
        if (r.receive && r.state == kPending && dest.matches(r, m)) {
          dest.deliver(r, m);
          return id;
        }
      dest.inbox_.push_back(std::move(m));
      return id;
    }
    Test test(Wire::Op& id) override {
      std::lock_guard<std::mutex> lock(hub_.mutex_);
      Test t;
      if (id == kNone) {
        t.ended = true;
        return t;
      }
      auto it = ops_.find(id);
      const LoopbackWires::Op& op = it->second;
      if (op.state == kPending) return t;
      t.ended = true;
      t.broken = op.state == kBroken;
      t.cancelled = op.state == kCancelled;
      t.from = op.from;
      t.bytes = op.bytes;
      ops_.erase(it);
      id = kNone;
      return t;
    }
    void cancel(Wire::Op id) override {
      std::lock_guard<std::mutex> lock(hub_.mutex_);
      auto it = ops_.find(id);
      if (it != ops_.end() && it->second.receive && it->second.state == kPending) it->second.state = kCancelled;
    }
    bool waiting(int from, int tag, size_t* bytes, bool* broken) override {
      std::lock_guard<std::mutex> lock(hub_.mutex_);
      *broken = hub_.dead_[static_cast<size_t>(from)];
      for (const Message& m : inbox_)
        if (m.from == from && m.tag == tag) {
          *bytes = m.bytes.size();
          return true;
        }
      return false;
    }
    void strand(Wire::Op id, std::shared_ptr<const void> memory) override {
      std::lock_guard<std::mutex> lock(hub_.mutex_);
      stranded_.push_back(std::move(memory));
      ops_.erase(id);  // (here nothing runs on: the memory is held only to be counted)
    }

   private:
    friend class LoopbackWires;
    bool matches(const LoopbackWires::Op& r, const Message& m) const {
      return r.tag == m.tag && (r.peer == kAnyNode || r.peer == m.from);
    }
    void deliver(LoopbackWires::Op& r, const Message& m) {
      const size_t n = std::min(r.len, m.bytes.size());
      if (n) std::memcpy(r.into, m.bytes.data(), n);
      r.state = kDone, r.from = m.from, r.bytes = n;
    }

    LoopbackWires& hub_;
    const int node_;
    Wire::Op next_ = 1;
    std::map<Wire::Op, LoopbackWires::Op> ops_;  // in the order posted
    std::deque<Message> inbox_;
    std::vector<std::shared_ptr<const void>> stranded_;
  };

  const int max_tag_;
  std::mutex mutex_;
  std::vector<bool> dead_;
  std::vector<std::unique_ptr<End>> ends_;
};

}  // namespace clairfs::fakes
