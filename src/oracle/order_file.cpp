// The order file for order=list: the user's own order, for samplers nobody can predict.
//
//   # comments and blank lines are ignored
//   @epoch 0              optional: the sections that follow apply from this epoch on
//   cats/001.jpg          one sample per line, a path relative to the mount root
//   @rank 1               optional: the lines that follow are rank 1's own sequence
//
// Without @rank lines a section is one global sequence, split across ranks like DistributedSampler.
// A backslash escapes a newline (\n) or a backslash (\\) in a name, as in the published order files.
#include <charconv>
#include <fstream>

#include "clairfs/oracle.hpp"
#include "util/text.hpp"

namespace clairfs {


OrderList parse_order_file(const std::string& file, uint64_t num_samples, uint64_t world_size,
                           const std::function<int64_t(const std::string&)>& resolve) {
  std::ifstream in(file);
  if (!in) throw UsageError("order_file '" + file + "' cannot be read");
  return parse_order_stream(in, file, num_samples, world_size, resolve);
}

OrderList parse_order_stream(std::istream& in, const std::string& file, uint64_t num_samples, uint64_t world_size,
                             const std::function<int64_t(const std::string&)>& resolve) {
  OrderList list;
  auto where = [&](size_t line_no) { return "order_file '" + file + "' line " + std::to_string(line_no) + ": "; };
  int64_t rank = -1;  // current @rank, or -1 for the global sequence
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("@epoch ", 0) == 0 || line.rfind("@rank ", 0) == 0) {
      const bool is_epoch = line[1] == 'e';
      const std::string number = line.substr(is_epoch ? 7 : 6);
      uint64_t value = 0;
      // Digits only: stoull would take " -5" (a space, then a sign) as 2^64 - 5.
      const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
      if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos || ec != std::errc() ||
          end != number.data() + number.size())
        throw UsageError(where(line_no) + "'" + line + "' needs a non-negative number");
      if (is_epoch) {
        if (!list.sections.empty() && value <= list.sections.back().first_epoch)
          throw UsageError(where(line_no) + "epochs must increase");
        list.sections.push_back({value, {}, {}});
        rank = -1;
      } else {
        if (value >= world_size)
          throw UsageError(where(line_no) + "rank " + std::to_string(value) + " is not below world_size=" +
                           std::to_string(world_size));
        if (list.sections.empty()) list.sections.push_back({0, {}, {}});
        auto& sec = list.sections.back();
        if (!sec.global.empty()) throw UsageError(where(line_no) + "@rank after lines that belong to no rank");
        if (sec.by_rank.size() < world_size) sec.by_rank.resize(world_size);
        rank = static_cast<int64_t>(value);
      }
      continue;
    }
    if (line[0] == '@') throw UsageError(where(line_no) + "unknown directive '" + line + "'");
    std::string path = unescape_line(line);
    while (path.rfind("./", 0) == 0) path.erase(0, 2);
    const int64_t sample = resolve(path);
    if (sample < 0 || static_cast<uint64_t>(sample) >= num_samples)
      throw UsageError(where(line_no) + "'" + path + "' is not a sample in SOURCE");
    if (list.sections.empty()) list.sections.push_back({0, {}, {}});
    auto& sec = list.sections.back();
    if (rank >= 0) sec.by_rank[static_cast<size_t>(rank)].push_back(static_cast<uint32_t>(sample));
    else if (!sec.by_rank.empty()) throw UsageError(where(line_no) + "a line outside any @rank in a section that has them");
    else sec.global.push_back(static_cast<uint32_t>(sample));
  }
  if (list.sections.empty()) throw UsageError("order_file '" + file + "' names no samples");
  if (list.sections.front().first_epoch != 0) list.sections.front().first_epoch = 0;  // covers earlier epochs too
  return list;
}

}  // namespace clairfs
