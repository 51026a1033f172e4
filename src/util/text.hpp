// Text helpers: line-oriented ones shared by the published order files, the trace and the order-file
// reader, and the fixed layout of .clairfs/stats.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace clairfs {

// Appends `name` to `out` with '\\' and '\n' escaped as "\\\\" and "\\n", so any file name fits one line.
inline void append_escaped_line(std::string& out, std::string_view name) {
  for (char c : name) {
    if (c == '\\' || c == '\n') out += '\\';
    out += c == '\n' ? 'n' : c;
  }
  out += '\n';
}

// `text` fit to show on a terminal or in a log line: control bytes (below 0x20, and 0x7f) as \xNN and
// '\\' doubled, so that a file name with a newline or ESC in it can neither forge a line nor send a
// terminal an escape sequence. Other bytes (UTF-8 included) as they are.
inline std::string escape_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      if (c == '\\') out += '\\';
      out += c;
    }
  }
  return out;
}

// The inverse of append_escaped_line for one line without its '\n'.
inline std::string unescape_line(std::string_view line) {
  std::string out;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size()) {
      const char c = line[++i];
      out += c == 'n' ? '\n' : c;
    } else {
      out += line[i];
    }
  }
  return out;
}

// Bytes for people: "23.4 GiB" (powers of 1024, one decimal).
inline std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", bytes, units[u]);
  return buf;
}

// Ranks as a list a user would write: "0-3", "0,2,5", "0-3,8" (sorted, no repeats; "none" if empty).
inline std::string rank_list_text(const std::vector<uint64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

}  // namespace clairfs
