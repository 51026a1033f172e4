// The peer request: what one daemon sends another to ask for a file, and its decoding.
//
// A request is three little-endian 64-bit words: the file's entry id, the tag the answer must carry, and
// the size the asker expects. Nothing else crosses between daemons but file bytes. A request is checked
// against the manifest before anything is read for it: an id that names no regular file, a size that is
// not the file's, or a tag outside the answer range is refused (never served, never a crash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "clairfs/manifest.hpp"

namespace clairfs {

constexpr int kPeerFirstReplyTag = 16;

struct PeerRequest {
  EntryId id = 0;
  int tag = 0;
  uint64_t size = 0;
};

// The three words of a request for `id`.
void encode_peer_request(const PeerRequest& r, uint64_t out[3]);
// Decodes `len` bytes received as a request; nullopt if they are not a valid request for `manifest`.
// `tag_ub` is the largest tag the transport may use.
std::optional<PeerRequest> decode_peer_request(const void* data, size_t len, const Manifest& manifest, int tag_ub);

}  // namespace clairfs
