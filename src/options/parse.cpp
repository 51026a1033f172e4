// Value parsers for mount options: integers, sizes, rank lists, and the -o string splitter.
//
// They are strict on purpose: "12XB", "1e3", " 5" and "0x10" are errors, because a typo in a job
// script should fail at mount time with the option's name, not silently mean something else.
#include "options/parse.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "clairfs/options.hpp"
#include "options/table.hpp"

namespace clairfs {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Options whose value is a list; a bare token after them continues the list. See split_option_string.
bool is_list_option(const std::string& key) {
  const OptionSpec* o = find_option(key);
  return o && o->list;
}

bool looks_like_rank_item(const std::string& token) {
  return !token.empty() &&
         token.find_first_not_of("0123456789-") == std::string::npos &&
         std::isdigit(static_cast<unsigned char>(token.front()));
}

}  // namespace

[[noreturn]] void bad_value(const std::string& what, const std::string& value, const std::string& why) {
  throw UsageError("bad option '" + what + "=" + value + "': " + why);
}

uint64_t parse_u64(const std::string& what, const std::string& text) {
  uint64_t value = 0;
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text.front())))
    bad_value(what, text, "not a non-negative integer");
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) bad_value(what, text, "too large");
  if (ec != std::errc() || ptr != text.data() + text.size())
    bad_value(what, text, "not a non-negative integer");
  return value;
}

SeedInt parse_seed(const std::string& what, const std::string& text) {
  // torch.Generator.manual_seed accepts [-2^63, 2^64); Python adds the epoch before the call.
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) negative = text[i++] == '-';
  if (i == text.size()) bad_value(what, text, "not an integer");
  SeedUint magnitude = 0;
  const SeedUint limit = (static_cast<SeedUint>(1) << 64);
  for (; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) bad_value(what, text, "not an integer");
    magnitude = magnitude * 10 + static_cast<unsigned>(text[i] - '0');
    if (magnitude > limit) bad_value(what, text, "outside torch's seed range [-2^63, 2^64)");
  }
  if (negative ? magnitude > (static_cast<SeedUint>(1) << 63) : magnitude >= limit)
    bad_value(what, text, "outside torch's seed range [-2^63, 2^64)");
  return negative ? -static_cast<SeedInt>(magnitude) : static_cast<SeedInt>(magnitude);
}

bool parse_bool(const std::string& what, const std::string& text) {
  const std::string v = lower(text);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  bad_value(what, text, "not a boolean (use 1/0, true/false, yes/no)");
}

constexpr double kMaxSeconds = 1e9;

double parse_seconds(const std::string& what, const std::string& text) {
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(value) || value < 0)
    bad_value(what, text, "not a non-negative number of seconds");
  // (Made milliseconds in 64 bits; a few decades is more than any use.)
  if (value > kMaxSeconds)
    bad_value(what, text, "at most " + std::to_string(static_cast<uint64_t>(kMaxSeconds)) + " seconds");
  return value;
}

uint64_t parse_size(const std::string& what, const std::string& text) {
  double number = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text.front())))
    bad_value(what, text, "not a size (use e.g. 4096, 512M, 64G, 2T)");
  auto [ptr, ec] = std::from_chars(begin, end, number, std::chars_format::fixed);
  if (ec != std::errc()) bad_value(what, text, "not a size (use e.g. 4096, 512M, 64G, 2T)");
  std::string suffix = lower(std::string(ptr, end));
  int shift = 0;
  if (!suffix.empty()) {
    const std::string units = "kmgtp";
    auto pos = units.find(suffix.front());
    const std::string rest = suffix.substr(1);
    if (pos == std::string::npos || !(rest.empty() || rest == "b" || rest == "ib"))
      bad_value(what, text, "unknown unit '" + std::string(ptr, end) + "' (use K, M, G, T or P)");
    shift = 10 * static_cast<int>(pos + 1);
  }
  const double bytes = std::ldexp(number, shift);
  if (bytes >= 18446744073709551615.0) bad_value(what, text, "too large");
  if (shift == 0 && number != std::floor(number)) bad_value(what, text, "not a whole number of bytes");
  return static_cast<uint64_t>(bytes);
}

std::vector<uint64_t> parse_rank_list(const std::string& what, const std::string& text) {
  std::set<uint64_t> ranks;
  size_t start = 0;
  if (text.empty()) bad_value(what, text, "empty rank list");
  while (start <= text.size()) {
    size_t stop = text.find_first_of(",:", start);
    if (stop == std::string::npos) stop = text.size();
    const std::string item = text.substr(start, stop - start);
    if (item.empty()) bad_value(what, text, "empty item in rank list");
    const auto dash = item.find('-');
    auto item_value = [&](const std::string& s) {
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
        bad_value(what, text, "'" + item + "' is not a rank or a range like 0-3");
      return parse_u64(what, s);
    };
    uint64_t lo = 0, hi = 0;
    if (dash == std::string::npos) {
      lo = hi = item_value(item);
    } else {
      lo = item_value(item.substr(0, dash));
      hi = item_value(item.substr(dash + 1));
      if (hi < lo) bad_value(what, text, "range '" + item + "' runs backwards");
    }
    if (hi - lo >= kMaxNodeRanks || ranks.size() + (hi - lo) >= kMaxNodeRanks)
      bad_value(what, text, "more than " + std::to_string(kMaxNodeRanks) + " ranks on one node");
    for (uint64_t r = lo;; ++r) {  // not `r <= hi`: hi may be the largest uint64_t
      ranks.insert(r);
      if (r == hi) break;
    }
    start = stop + 1;
  }
  return {ranks.begin(), ranks.end()};
}

std::vector<std::string> split_option_string(const std::string& text) {
  // Split at commas not escaped by a backslash (libfuse's own escaping), unescaping as we go.
  std::vector<std::string> tokens;
  std::string current;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      current += text[++i];
    } else if (text[i] == ',') {
      tokens.push_back(current);
      current.clear();
    } else {
      current += text[i];
    }
  }
  tokens.push_back(current);

  std::vector<std::string> options;
  std::string list_key;  // the list-valued option the previous token belonged to, if any
  for (auto& token : tokens) {
    if (token.empty()) continue;
    auto eq = token.find('=');
    std::string key = token.substr(0, eq);
    const bool bare = eq == std::string::npos;
    if (bare && !list_key.empty() && !options.empty() &&
        (list_key == "ranks" ? looks_like_rank_item(token) : !is_known_flag(key))) {
      options.back() += ":" + token;
      continue;
    }
    // A flag inside -o ("-o -d") would otherwise reach the parser as an option named "_d".
    if (key[0] == '-')
      throw UsageError("'" + key + "' inside -o: flags such as -f and -d go outside -o (see clairfs --help)");
    // '-' and '_' spell the same key, except in x-* options that belong to other tools.
    if (key.rfind("x-", 0) != 0) std::replace(key.begin(), key.end(), '-', '_');
    list_key = (!bare && is_list_option(key)) ? key : std::string();
    options.push_back(bare ? key : key + token.substr(eq));
  }
  return options;
}

}  // namespace clairfs
