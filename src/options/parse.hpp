// Internal value parsers shared by the option parser (see clairfs/options.hpp for the public ones).
#pragma once

#include <cstdint>
#include <string>

#include "clairfs/options.hpp"

namespace clairfs {

// Ranks one node serves at most (ranks=, ranks_per_node=): far beyond any node (a few to a few hundred),
// small enough that a typo costs neither memory nor the time of following a million readers.
constexpr uint64_t kMaxNodeRanks = 4096;

// Throws UsageError("bad option 'what=value': why").
[[noreturn]] void bad_value(const std::string& what, const std::string& value, const std::string& why);

uint64_t parse_u64(const std::string& what, const std::string& text);
SeedInt parse_seed(const std::string& what, const std::string& text);
bool parse_bool(const std::string& what, const std::string& text);
double parse_seconds(const std::string& what, const std::string& text);

// True for option names that stand alone without '=' (drop_last, allow_other, ro, ...).
bool is_known_flag(const std::string& key);

}  // namespace clairfs
