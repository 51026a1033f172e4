#include "peer/message.hpp"

#include <sys/stat.h>

#include <cstring>

namespace clairfs {

void encode_peer_request(const PeerRequest& r, uint64_t out[3]) {
  out[0] = r.id;
  out[1] = static_cast<uint64_t>(r.tag);
  out[2] = r.size;
}

std::optional<PeerRequest> decode_peer_request(const void* data, size_t len, const Manifest& manifest, int tag_ub) {
  uint64_t w[3];
  if (len != sizeof(w)) return std::nullopt;
  std::memcpy(w, data, sizeof(w));
  if (w[0] >= manifest.size()) return std::nullopt;
  const auto id = static_cast<EntryId>(w[0]);
  const Entry& e = manifest.entry(id);
  if (!S_ISREG(e.mode) || w[2] != e.size) return std::nullopt;
  if (w[1] < static_cast<uint64_t>(kPeerFirstReplyTag) || w[1] > static_cast<uint64_t>(tag_ub)) return std::nullopt;
  return PeerRequest{id, static_cast<int>(w[1]), w[2]};
}

}  // namespace clairfs
