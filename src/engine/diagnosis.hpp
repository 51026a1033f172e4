// Diagnosis: when a rank reads in another order than the plan, which order it is. The nearby mistakes a
// job makes are tried against the files the rank opened, and the one that fits is named:
//
//   another seed          DistributedSampler(shuffle=True) seeded otherwise: the mounted seed ± 16, the
//                         seeds people type (0-100, 1234, 3407, ...), each at the rank's epoch and at
//                         start_epoch (over 2 M samples, the 48 likeliest only)
//   another epoch         the mounted seed at epoch 0, start_epoch, or within 3 of the plan's: a job
//                         started elsewhere, or one that never calls sampler.set_epoch(e) (every epoch
//                         repeats the first)
//   another world size    or rank: the same shuffle split across 1-16, 32, ... ranks
//   sample order          shuffle=False, or a sequential sampler
//   a walk                tar, rsync, cp: files in directory order, files that are no samples among them
//
// How an order is tried: a reader in order X opens, one after another, files close together in X (a
// DataLoader's workers open within a window of batches). So for each candidate order the opens are
// placed in it, and the share of consecutive opens that lie within `gap` items of each other is its
// score; the candidate must also hold nearly all of the opens (the rank's share, for a world size). A
// random order scores about 2·gap / its length, the true one nearly 1. Torch's shuffle of a seed s at
// epoch e depends only on the low 32 bits of s + e, so every candidate seed and epoch is one value.
//
// `explain` is pure and may take seconds on large data sets (a shuffle of N per candidate value, about
// 300 values); the Diagnoser runs it on its own thread, off the request path.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/oracle.hpp"
#include "util/thread_annotations.hpp"

namespace clairfs {

// What the mount was told.
struct MountedOrder {
  Order order = Order::kTorch;
  SeedInt seed = 0;
  uint64_t world_size = 1;
  uint64_t start_epoch = 0;
  TorchShuffle shuffle = TorchShuffle::kLargeSplit;
  uint64_t gap = 256;  // items two consecutive opens of one reader may lie apart (the planner's tolerance)
};

// What a rank opened, oldest first, and where the plan had it.
struct Evidence {
  uint64_t rank = 0;   // the training rank
  uint64_t epoch = 0;  // the epoch the plan had it in
  std::vector<EntryId> opens;
  // The rank never read in the plan, or its opens are another job's processes' (started again from
  // scratch): the start epoch read later is a start, not an epoch repeated for want of set_epoch.
  bool unread = false;
};

// The order that fits, as the words after "rank R " ("reads as seed=43 (mounted seed=42)"), or nullopt.
// Needs at least kMinOpens opens. When the order is the mounted one at another epoch, up to
// kFollowedEpochs — a job started at another epoch than the plan's, or of a higher seed (torch's order of
// seed s at epoch e is seed s - k's at epoch e + k), not one repeating its first epoch for want of
// set_epoch — that epoch is put in `*epoch` (if given; left as it was otherwise).
constexpr uint64_t kFollowedEpochs = 100000;
std::optional<std::string> explain(const Manifest& manifest, const MountedOrder& mounted, const Evidence& evidence,
                                   std::optional<uint64_t>* epoch = nullptr);
constexpr size_t kMinDiagnosisOpens = 16;

// seed=auto: the torch shuffle (DistributedSampler, shuffle=True) the served ranks read in, learned
// from the node's first opens; failing that, RandomSampler's without a generator (DataLoader(shuffle=True)
// after torch.manual_seed(seed)), whose seed is an output of torch's global generator: the likely
// seeds' first kLearnDraws outputs after the DataLoader's base seed are tried, each first by where its
// shuffle starts, cheaply, then whole. The likely seeds (as above, without a mounted one) are tried at the
// mounted start epoch and the kLearnEpochs - 1 after it; opens are split by the rank each lies in and
// each rank's consecutive opens must lie close (as above). An order is taken only when its fit is at
// least kLearnFit, kLearnMargin above every other's, and no order tried would reach it by chance with
// odds above one in a million: with a few hundred candidates, 16 opens decide when a rank's items are
// many against the gap; small data sets with wide gaps need more.
struct LearnQuestion {
  uint64_t world_size = 1;
  std::vector<uint64_t> ranks{0};  // the training ranks this node serves
  uint64_t start_epoch = 0;
  uint64_t gap = 256;
  TorchShuffle shuffle = TorchShuffle::kLargeSplit;
  bool distributed = true;  // try DistributedSampler's shuffle (order=torch)
  bool global = true;       // and then RandomSampler's without a generator (order=torch-global)
};
struct Learned {
  SeedInt seed = 0;       // the seed whose epoch start_epoch is the order found
  double fit = 0;         // the share of a rank's consecutive opens that lay close in it
  size_t candidates = 0;  // orders tried
  Order order = Order::kTorch;
  uint64_t draws = 0;  // order=torch-global: the script's draws before
};
// Makes what learn_seed needs every time (the global generator's candidates): called by the learning
// thread before the job's first opens come.
void prepare_learning();
// What was learned, as mount options: "seed=5", or "seed=5,order=torch-global,draws=100".
std::string learned_options(const Learned& learned);
constexpr uint64_t kLearnEpochs = 4;
constexpr double kLearnFit = 0.8;
constexpr double kLearnMargin = 0.3;
std::optional<Learned> learn_seed(const Manifest& manifest, const LearnQuestion& question, const std::vector<EntryId>& opens);

// Runs `explain` for ranks off the plan on its own thread, and logs what it finds (one line per answer
// that differs from the last). ask() and answer() are called by the request threads, under the engine's
// mutex or not; the diagnosis thread takes only this class's mutex.
class Diagnoser {
 public:
  // REQUIRES: manifest outlives it. `ranks`: the training rank of each served rank index.
  Diagnoser(const Manifest& manifest, MountedOrder mounted, std::vector<uint64_t> ranks);
  ~Diagnoser();

  // Diagnose served rank `index` from this evidence (replaces a question not yet taken up).
  void ask(size_t index, Evidence evidence) EXCLUDES(mutex_);
  // The rank follows the plan again: its answer no longer holds.
  void forget(size_t index) EXCLUDES(mutex_);
  // The latest answer for a rank off the plan ("" while none fits or none is known yet).
  std::string answer(size_t index) const EXCLUDES(mutex_);
  // The epoch of the mounted order the rank reads, when that is the answer (explain's `epoch`).
  std::optional<uint64_t> epoch(size_t index) const EXCLUDES(mutex_);
  // Questions answered (tests wait on it).
  uint64_t answered() const EXCLUDES(mutex_);
  // The epoch of the mounted order `evidence` reads, asked and answered on the caller's thread (explain:
  // slow on large data sets).
  std::optional<uint64_t> epoch_now(const Evidence& evidence) const;

 private:
  void run() EXCLUDES(mutex_);

  const Manifest& manifest_;
  const MountedOrder mounted_;
  const std::vector<uint64_t> ranks_;
  mutable Mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::optional<Evidence>> asked_ GUARDED_BY(mutex_);
  std::vector<std::string> answers_ GUARDED_BY(mutex_);
  std::vector<std::optional<uint64_t>> epochs_ GUARDED_BY(mutex_);
  std::vector<uint64_t> generation_ GUARDED_BY(mutex_);  // bumped by forget: a late answer is dropped
  uint64_t answered_ GUARDED_BY(mutex_) = 0;
  bool stop_ GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: started once the rest is set up
};

}  // namespace clairfs
