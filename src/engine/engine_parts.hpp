// How an EngineConfig becomes the configurations of the engine's parts (planner, policy, page window),
// its tiers (NVMe, peers) and the oracle's streams: ClairvoyantEngine's construction, apart.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/oracle.hpp"
#include "engine/clairvoyant.hpp"
#include "engine/page_window.hpp"
#include "engine/planner.hpp"
#include "engine/policy.hpp"
#include "peer/peer_store.hpp"
#include "tiers/nvme.hpp"

namespace clairfs {

// The training ranks the engine serves (rank 0 when none is told).
std::vector<uint64_t> served_ranks(const EngineConfig& c);
// Each served rank's files of the plan's epoch, in the order the oracle says it reads them: its own
// epoch (the plan's + its shift), none past `end`; its first `steps` at most.
StreamSource oracle_streams(const Manifest& manifest, const Oracle& oracle, std::vector<uint64_t> ranks,
                            std::vector<uint64_t> shift, std::optional<uint64_t> end, uint64_t steps = UINT64_MAX);
// The engine's config with the start epoch's head to plan first, where that helps (engine_parts.cpp).
EngineConfig with_head(const Manifest& manifest, const Oracle& oracle, EngineConfig c);
PlannerConfig planner_config(const Manifest& manifest, const EngineConfig& c);
PolicyConfig policy_config(const EngineConfig& c, uint64_t mean_size);
WindowConfig window_config(const EngineConfig& c, uint64_t mean_size);
std::unique_ptr<NvmeTier> make_nvme(const Manifest& manifest, const EngineConfig& c);
// The peers as a store, when the node has peers and an owner per entry (std::logic_error: not one each).
std::unique_ptr<PeerStore> make_peers(const Manifest& manifest, const EngineConfig& c);

}  // namespace clairfs
