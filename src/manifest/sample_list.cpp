// samples=FILE: the job's own sample list in place of ImageFolder's walk. Sample i is the file the list's
// i-th path names, as the job's Dataset numbers its samples (a sorted glob, ImageFolder with is_valid_file,
// a CSV of its own): the oracle shuffles indices, so the same seed gives the job's order on this list.
//
// Two forms, told apart by the first byte that is not white space:
//   a JSON list of paths, or of [path, label, ...] lists: json.dump(ds.samples, f) as torchvision has it;
//   one path a line: blank lines and lines starting with '#' skipped, '\' escaping a newline or itself as in
//   the order files.
// A path is relative to the mount's root, or absolute under the mount point or SOURCE (a list written by
// the job over the mount, or made beforehand over SOURCE itself).
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "clairfs/manifest.hpp"
#include "util/text.hpp"

namespace clairfs {

namespace {

// Each path of a JSON list, with where it is (element K), to `add`; throws std::runtime_error at the
// first element that is no path (or pair whose first item is one).
class JsonPaths final : public nlohmann::json_sax<nlohmann::json> {
 public:
  // (where: "line" or "element", and its number; said only in an error, so made only there)
  using Add = std::function<void(std::string_view path, const char* where, uint64_t number)>;
  JsonPaths(const std::string& file, Add add) : file_(file), add_(std::move(add)) {}

  bool start_array(std::size_t) override {
    if (++depth_ > 2) not_a_path();
    items_ = 0;
    return true;
  }
  bool end_array() override {
    if (depth_-- == 2) {
      if (items_ == 0) not_a_path();
      ++element_;
    }
    return true;
  }
  bool string(string_t& s) override {
    if (depth_ == 1) {
      add_(s, "element", element_);
      ++element_;
    } else if (items_++ == 0) {
      add_(s, "element", element_);
    }
    return true;
  }
  bool null() override { return other(); }
  bool boolean(bool) override { return other(); }
  bool number_integer(number_integer_t) override { return other(); }
  bool number_unsigned(number_unsigned_t) override { return other(); }
  bool number_float(number_float_t, const string_t&) override { return other(); }
  bool binary(binary_t&) override { return other(); }
  bool start_object(std::size_t) override {
    not_a_path();
    return false;
  }
  bool key(string_t&) override { return false; }
  bool end_object() override { return false; }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    throw std::runtime_error("samples '" + file_ + "' is no JSON list (broken at byte " + std::to_string(position) +
                             "): give a JSON list of paths, or one path a line");
  }

 private:
  // A label after a pair's path is fine; anything else where a path belongs is not.
  bool other() {
    if (depth_ != 2 || items_++ == 0) not_a_path();
    return true;
  }
  [[noreturn]] void not_a_path() const {
    throw std::runtime_error(
        "samples '" + file_ + "' " +
        (depth_ == 0 ? std::string("is no JSON list") : where() + " is neither a path nor a [path, label] pair"));
  }
  std::string where() const { return "element " + std::to_string(element_); }

  const std::string& file_;
  Add add_;
  int depth_ = 0;
  uint64_t element_ = 0;  // of the outer list
  uint64_t items_ = 0;    // in the current pair
};

// The path made relative to the mount's root: "./" and a leading prefix of `roots` taken off.
std::string_view relative_to_root(std::string_view path, const std::vector<std::string>& roots) {
  if (!path.empty() && path.front() == '/') {
    for (std::string_view root : roots) {
      while (root.size() > 1 && root.back() == '/') root.remove_suffix(1);
      if (path.size() > root.size() && path.substr(0, root.size()) == root && path[root.size()] == '/')
        return relative_to_root(path.substr(root.size() + 1), {});
    }
    return path;
  }
  while (path.substr(0, 2) == "./") path.remove_prefix(2);
  return path;
}

}  // namespace

bool Manifest::names(EntryId id, std::string_view path) const {
  while (true) {
    const size_t slash = path.rfind('/');
    const std::string_view last = slash == std::string_view::npos ? path : path.substr(slash + 1);
    if (id == 0 || last != name(id)) return false;
    id = tree_->entries.parent(id);
    if (slash == std::string_view::npos) return id == 0;
    path = path.substr(0, slash);
  }
}

void Manifest::use_samples(std::FILE* in, const std::string& file, const std::vector<std::string>& roots) {
  reset_samples(std::nullopt, {}, false);
  auto add = [&](std::string_view given, const char* where, uint64_t number) {
    const auto fail = [&](const std::string& why) {
      throw std::runtime_error("samples '" + file + "' " + where + " " + std::to_string(number) + ": '" +
                               escape_controls(given) + "' " + why);
    };
    const std::string_view path = relative_to_root(given, roots);
    if (!path.empty() && path.front() == '/') {
      std::string under;
      for (const auto& root : roots) under += (under.empty() ? "" : " nor ") + root;
      fail("is under neither " + under + " (give paths relative to the mount's root, or under it)");
    }
    // As ImageFolder's walk has them: a symlink to a file is that file; a link that leads nowhere, or a
    // FIFO, is a sample of its own that no read will serve (irregular).
    const size_t slash = path.rfind('/');
    const EntryId dir = slash == std::string_view::npos ? 0 : resolve_relative(path.substr(0, slash));
    const EntryId entry = dir == kNoEntry || !is_dir(dir) ? kNoEntry : lookup(dir, path.substr(slash + 1));
    if (entry == kNoEntry) fail("is no file in SOURCE");
    const EntryId target = resolve(entry);
    if (target != kNoEntry && is_dir(target)) fail("is a folder, not a file");
    const EntryId id = target == kNoEntry ? entry : target;
    if (samples_.size() == UINT32_MAX) fail("is one sample too many (at most 4,294,967,295)");
    add_sample(id, names(id, path) ? std::string_view() : path);
  };

  int c = std::fgetc(in);
  while (c == ' ' || c == '\t' || c == '\n' || c == '\r') c = std::fgetc(in);
  if (c != EOF) std::ungetc(c, in);
  if (c == '[') {
    JsonPaths paths(file, add);
    nlohmann::json::sax_parse(in, &paths);
  } else {
    char* line = nullptr;
    size_t cap = 0;
    struct Freed {
      char** p;
      ~Freed() { std::free(*p); }
    } freed{&line};
    ssize_t n;
    for (uint64_t number = 1; (n = ::getline(&line, &cap, in)) >= 0; ++number) {
      std::string_view text(line, static_cast<size_t>(n));
      if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
      if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
      if (text.empty() || text.front() == '#') continue;
      add(unescape_line(text), "line", number);
    }
  }
  if (std::ferror(in)) throw std::runtime_error("samples '" + file + "' could not be read whole");
  if (samples_.empty()) throw std::runtime_error("samples '" + file + "' names no samples");
}

}  // namespace clairfs
