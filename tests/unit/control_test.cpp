// The order files of .clairfs: a rank file rendered as it is read gives the same bytes, whatever the
// reads' offsets and sizes, as the whole text one path a line.
#include "control/control.hpp"

#include <gtest/gtest.h>

#include "fakes/memory_source.hpp"
#include "util/text.hpp"

namespace clairfs {
namespace {

constexpr uint64_t kFiles = 3001;

class ControlTest : public ::testing::Test {
 protected:
  ControlTest() : oracle(kFiles, schedule()), tree(files.manifest, oracle, ControlConfig{}) {}

  static Schedule schedule() {
    Schedule s;
    s.seed = 7;
    s.world_size = 3;
    return s;
  }
  // The rank file's attributes, found by name as the kernel finds them.
  ControlAttr rank_attr(uint64_t epoch, uint64_t rank) {
    const auto order = tree.lookup(ControlTree::root_ino(), "order");
    const auto dir = tree.lookup(order.value().ino, "epoch-" + std::to_string(epoch));
    return tree.lookup(dir.value().ino, "rank-" + std::to_string(rank)).value();
  }
  std::string expected(uint64_t epoch, uint64_t rank) {
    std::string text;
    for (uint32_t s : oracle.epoch(epoch).rank_sequence(rank)) append_escaped_line(text, files.manifest.sample_path(s));
    return text;
  }
  // The file read from start to end in pieces of `step` bytes.
  static std::string read_all(const ControlFile& f, size_t step) {
    std::string out, scratch;
    for (uint64_t off = 0;; off += step) {
      const std::string_view got = f.read(off, step, scratch);
      if (got.empty()) break;
      EXPECT_LE(got.size(), step);
      out += got;
    }
    return out;
  }

  fakes::MemoryTree files{std::vector<uint64_t>(kFiles, 1)};
  Oracle oracle;
  ControlTree tree;
};

TEST_F(ControlTest, RankFileReadInAnyPiecesIsItsWholeText) {
  for (uint64_t rank = 0; rank < 3; ++rank) {
    const std::string want = expected(1, rank);
    const ControlAttr a = rank_attr(1, rank);
    EXPECT_EQ(a.size, want.size());
    const auto file = tree.content(a.ino);
    ASSERT_TRUE(file);
    EXPECT_EQ(file->size(), want.size());
    for (size_t step : {size_t{1}, size_t{7}, size_t{4096}, size_t{131072}, want.size()})
      EXPECT_EQ(read_all(*file, step), want) << "rank " << rank << ", pieces of " << step;
  }
}

TEST_F(ControlTest, RankFileReadsAtAnyOffset) {
  const std::string want = expected(0, 2);
  const auto file = tree.content(rank_attr(0, 2).ino);
  std::string scratch;
  for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{5000}, uint64_t{want.size() - 1}})
    EXPECT_EQ(file->read(off, 300, scratch), want.substr(off, 300)) << "at " << off;
  EXPECT_TRUE(file->read(want.size(), 300, scratch).empty());
  EXPECT_TRUE(file->read(want.size() + 9, 300, scratch).empty());
  EXPECT_TRUE(file->read(3, 0, scratch).empty());
}

TEST_F(ControlTest, RankFilesKeptHoldTheirSamplesNotTheirText) {
  const ControlAttr a = rank_attr(0, 0);
  const auto file = tree.content(a.ino);
  EXPECT_EQ(tree.content(a.ino), file);  // kept: the size and the reads use one build
  // 4 bytes a line and a mark every 256 lines, where the text takes more than 10 a line.
  EXPECT_LT(file->memory_bytes(), a.size / 2);
  EXPECT_EQ(tree.cached_bytes(), file->memory_bytes());
}

}  // namespace
}  // namespace clairfs
