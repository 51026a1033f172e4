// Line-oriented text helpers shared by the published order files, the trace and the order-file reader.
#pragma once

#include <string>
#include <string_view>

namespace clairfs {

// Appends `name` to `out` with '\\' and '\n' escaped as "\\\\" and "\\n", so any file name fits one line.
inline void append_escaped_line(std::string& out, std::string_view name) {
  for (char c : name) {
    if (c == '\\' || c == '\n') out += '\\';
    out += c == '\n' ? 'n' : c;
  }
  out += '\n';
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

}  // namespace clairfs
