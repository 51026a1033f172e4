#include "engine/counters.hpp"

#include <nlohmann/json.hpp>

namespace clairfs {

void EngineCounters::to_json(nlohmann::json& j) const {
  for (Origin o : {Origin::kRam, Origin::kNvme, Origin::kPeer, Origin::kSource})
    j["tiers"][origin_name(o)] = {{"files", files(o)}, {"bytes", bytes(o)}};
  // Without opens, files read from pushed pages are presumed read once their reader reads past them.
  j["tiers"]["pagecache"] = {{"files", files(Origin::kPageCache)}};
  j["staged"] = {{"files", staged_files.load()},
                 {"bytes", staged_bytes.load()},
                 {"from_nvme", staged_from_nvme.load()},
                 {"from_peer", staged_from_peer.load()},
                 {"failures", stage_failures.load()},
                 {"source_bytes", staged_source_bytes.load()},
                 {"attributes_read", attributes_read.load()}};
  // Everything read from SOURCE, for any reason: what a parallel file system sees of this node.
  j["source_traffic"] = {{"bytes", staged_source_bytes.load() + bytes(Origin::kSource)}};
  j["stalls"] = {{"opens", files(Origin::kSource)},
                 {"seconds", static_cast<double>(stall_ns.load()) / 1e9},
                 {"staging_waits_given_up", staging_waits_given_up.load()}};
  j["readahead_files"] = readahead_files.load();
}

}  // namespace clairfs
