// Every mount option, declared once: its name, what value it takes, its default, the line `--help`
// prints, the paragraph docs/options.md shows, and how its value is checked and stored in Options.
//
// The parser (options.cpp) builds libfuse's templates from this table, `usage_text()` prints it, and
// tests/tools/options_doc writes it into docs/options.md (a test fails when the two differ). Adding an
// option is one Options field and one row in table.cpp; its consumer (the oracle's Schedule, the engine's
// configuration in cli.cpp) reads the field.
#pragma once

#include <string>
#include <vector>

#include "clairfs/options.hpp"

namespace clairfs {

enum class OptionSection { kSchedule, kCaches, kLogs, kKernel };

// How an option is written on the command line.
enum class Takes {
  kValue,      // name=VALUE
  kNothing,    // name
  kMaybeBool,  // name (true) or name=BOOL
};

// One option as the user typed it: the key (normalised: '_' spelling) and its value, if any.
struct GivenOption {
  std::string key;
  std::string value;
  bool has_value = false;
};

struct OptionSpec {
  const char* name;
  Takes takes;
  const char* value;     // the placeholder shown after '=' (N, SIZE, FILE, ...); "BOOL" for kMaybeBool
  OptionSection section;
  const char* fallback;  // the default as shown; "" when there is none to show
  bool list;             // the value is a list that bare tokens after it continue (ranks=0,2,5)
  const char* brief;     // --help: plain text, one short sentence
  const char* detail;    // docs/options.md: Markdown
  // Checks the value and stores it; throws UsageError naming the option.
  void (*store)(Options& options, const GivenOption& given);
};

// The options, in the order --help and the docs list them.
const std::vector<OptionSpec>& option_table();

// The row for `key` ('_' spelling, no value), or nullptr.
const OptionSpec* find_option(const std::string& key);

// Words that are not options of clairfs but that mount(8), mount.fuse3 and fstab hand over.
const std::vector<const char*>& kernel_mount_flags();   // passed on to the kernel's mount
const std::vector<const char*>& ignored_mount_words();  // accepted, no effect

// The command-line flags (-f, -d, -h, -V) with their spellings and one line each.
enum class FlagAction { kForeground, kDebug, kHelp, kVersion };
struct FlagSpec {
  std::vector<const char*> spellings;  // those starting with '-' are shown; "debug" also works in -o
  FlagAction action;
  const char* brief;
};
const std::vector<FlagSpec>& flag_table();

// The option lines of `clairfs --help`, section by section.
std::string options_help();

// docs/options.md's table of one section (Markdown, ends with a newline).
std::string options_markdown(OptionSection section);
// docs/options.md's table of the flags.
std::string flags_markdown();
// The man page's (docs/clairfs.1) entries of one section, and of the flags (roff).
std::string options_man(OptionSection section);
std::string flags_man();

}  // namespace clairfs
