// The daemon's parts, built by the mount command in steps (cli.cpp): the index of SOURCE, its reader and the
// oracle (load_index), then the peers, the engine and the trace (start_engine). What a mount serves; how
// the command becomes a daemon, mounts and ends is cli.cpp's.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"
#include "clairfs/oracle.hpp"
#include "engine/clairvoyant.hpp"
#include "engine/direct.hpp"
#include "engine/learning.hpp"
#include "engine/trace.hpp"
#include "fuse/page_cache.hpp"
#include "peer/mpi.hpp"
#include "peer/peer_loop.hpp"
#include "tiers/source.hpp"

namespace clairfs {

// The files' attributes, read in the background after a scan that left them for later (one node, no
// manifest=): the mount is up once the names are listed, as `find` lists them.
class BackgroundFill {
 public:
  explicit BackgroundFill(const Manifest& m) : thread_([this, &m] { run(m); }) {}
  ~BackgroundFill() {
    stop_ = true;
    thread_.join();
  }
  BackgroundFill(const BackgroundFill&) = delete;
  BackgroundFill& operator=(const BackgroundFill&) = delete;

 private:
  void run(const Manifest& m);

  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: started once stop_ is set up
};

// What a running mount is made of, in the order it is built; it goes in the reverse order, after the
// peer layer has completed every fetch while the engine still exists.
struct Daemon {
  std::optional<Manifest> manifest;
  std::optional<SourceTier> source;
  std::optional<BackgroundFill> fill;  // after a scan that left files' attributes for later
  std::optional<Oracle> oracle;
  FusePageCache page_cache;        // before the engine that pushes into it
  std::optional<PeerLinks> links;  // before the peers, which ask it who is gone; says goodbye last
  std::optional<WirePeers> peers;  // before the engine: the engine calls it
  std::optional<ClairvoyantEngine> staged;
  std::optional<LearningEngine> learning;  // seed=auto: builds the engine once it knows the seed
  std::optional<DirectEngine> direct;      // staging nothing: SOURCE read directly
  std::optional<TraceEngine> trace;
  Engine* serving = nullptr;  // what the front-end calls: the engine, or SOURCE directly; maybe traced

  Daemon() = default;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon() {
    if (peers) peers->stop();
  }
};

// Step 3: the index of SOURCE, its reader and the oracle. Node 0 alone reads SOURCE's metadata; the others
// get the index from it. Returns why this node cannot go on ("" when it can).
std::string load_index(const Options& o, MpiWorld* world, Daemon& d);

// Step 4: the peers (under a launcher with several nodes), the engine (staging on) and the trace.
// Throws NvmeError for a bad nvme= (the mount stops); any other engine failure leaves staging off.
void start_engine(const Options& o, MpiWorld* world, Daemon& d);

// SOURCE mounted by clairfs elsewhere on this node too: each mount stages it for itself (RAM twice, SOURCE
// read twice), where one mount serves every job that reads it. Said once. Not under a launcher of
// several daemons (on one host they play several nodes).
void warn_of_another_mount(const Options& o, const MpiWorld* world);

}  // namespace clairfs
