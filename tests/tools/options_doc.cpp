// Writes the option table (src/options/table.cpp) into docs/options.md and the man page docs/clairfs.1,
// or checks that it is there.
//   options_doc [--check] docs/options.md|docs/clairfs.1
// The file's generated parts sit between "<!-- generated from src/options/table.cpp: SECTION -->" and
// "<!-- end of generated part -->" (in the man page: roff comments, '.\" generated from ...' and
// '.\" end of generated part'); SECTION is schedule, caches, logs, kernel or flags, each once. Everything
// else in the file is left as it is. --check exits 1, naming the command that fixes it, when a part differs.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "options/table.hpp"

namespace {

constexpr size_t kSections = 5;

bool generated(const std::string& section, bool man, std::string& out) {
  using clairfs::OptionSection;
  auto table = [man](OptionSection s) { return man ? clairfs::options_man(s) : clairfs::options_markdown(s); };
  if (section == "schedule") out = table(OptionSection::kSchedule);
  else if (section == "caches") out = table(OptionSection::kCaches);
  else if (section == "logs") out = table(OptionSection::kLogs);
  else if (section == "kernel") out = table(OptionSection::kKernel);
  else if (section == "flags") out = man ? clairfs::flags_man() : clairfs::flags_markdown();
  else return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::strcmp(argv[1], "--check") == 0;
  if (argc != 2 && !check) {
    std::fprintf(stderr, "usage: options_doc [--check] docs/options.md\n");
    return 2;
  }
  const std::string path = argv[argc - 1];
  const bool man = path.size() > 2 && path.compare(path.size() - 2, 2, ".1") == 0;
  const std::string begin_mark = man ? ".\\\" generated from src/options/table.cpp: " : "<!-- generated from src/options/table.cpp: ";
  const std::string end_mark = man ? ".\\\" end of generated part" : "<!-- end of generated part -->";
  const char* kBegin = begin_mark.c_str();
  const char* kEnd = end_mark.c_str();
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "options_doc: cannot read %s\n", path.c_str());
    return 2;
  }
  std::stringstream whole;
  whole << in.rdbuf();
  const std::string text = whole.str();
  std::string out;
  size_t at = 0, parts = 0;
  for (;;) {
    const size_t begin = text.find(kBegin, at);
    if (begin == std::string::npos) break;
    const size_t line_end = text.find('\n', begin);
    const size_t end = text.find(kEnd, line_end);
    if (line_end == std::string::npos || end == std::string::npos) {
      std::fprintf(stderr, "options_doc: %s: a generated part has no end marker\n", path.c_str());
      return 2;
    }
    std::string section = text.substr(begin + std::strlen(kBegin), line_end - begin - std::strlen(kBegin));
    section = section.substr(0, section.find(' '));
    std::string table;
    if (!generated(section, man, table)) {
      std::fprintf(stderr, "options_doc: %s: unknown section '%s'\n", path.c_str(), section.c_str());
      return 2;
    }
    out += text.substr(at, line_end + 1 - at) + table;
    at = end;
    ++parts;
  }
  out += text.substr(at);
  if (parts != kSections) {
    std::fprintf(stderr, "options_doc: %s has %zu generated parts, expected %zu\n", path.c_str(), parts, kSections);
    return 2;
  }
  if (check) {
    if (out == text) return 0;
    std::fprintf(stderr, "options_doc: %s differs from the option table; rewrite it with: options_doc %s\n",
                 path.c_str(), path.c_str());
    return 1;
  }
  if (out == text) return 0;
  std::ofstream(path) << out;
  std::printf("options_doc: rewrote the option tables in %s\n", path.c_str());
  return 0;
}
