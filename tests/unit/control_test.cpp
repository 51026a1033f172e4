// The control files of .clairfs: a rank file rendered as it is read gives the same bytes, whatever the
// reads' offsets and sizes, as the whole text one path a line; a live file (stats) is read whole from the
// rendering its lookup gave, whatever renderings came after it, and is kept while the kernel holds it.
#include "control/control.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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

// A tree whose stats are a numbered text of a length that changes with each rendering (as stats' do
// when a rank appears or a number gains a digit), `size` bytes at least.
class LiveTest : public ControlTest {
 protected:
  LiveTest() : live(files.manifest, oracle, config()) {}

  ControlConfig config() {
    ControlConfig c;
    c.stats = [this]() {
      const uint64_t n = ++made;
      return "{\"rendering\": " + std::to_string(n) + ", \"pad\": \"" + std::string(n % 3 * 100 + size, 'x') + "\"}\n";
    };
    return c;
  }
  ControlAttr stats(ControlTree::Reader who = ControlTree::Reader::kOwner) {
    return live.lookup(ControlTree::root_ino(), "stats", who).value();
  }
  // The next rendering: looked up until one comes that is not `before`'s (made at most every
  // kLiveRefresh, or longer after a slow one).
  ControlAttr next_after(const ControlAttr& before) {
    for (int i = 0; i < 5000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const ControlAttr a = stats();
      if (a.ino != before.ino) return a;
      live.forget(a.ino, 1);
    }
    ADD_FAILURE() << "no new rendering in 5 s";
    return before;
  }
  std::string text_of(uint64_t ino) {
    const auto f = live.content(ino);
    if (!f) return "(gone)";
    return read_all(*f, 4096);
  }

  size_t size = 10;
  uint64_t made = 0;
  ControlTree live;
};

TEST_F(LiveTest, AReaderReadsTheRenderingItsLookupGaveWholeWhateverCameAfter) {
  const ControlAttr first = stats();
  const std::string first_text = text_of(first.ino);
  EXPECT_EQ(first_text.size(), first.size);
  EXPECT_EQ(first_text.find("\"rendering\": 1,"), 1u) << first_text;
  const ControlAttr second = next_after(first);
  EXPECT_NE(second.size, first.size);
  EXPECT_GT(second.mtime_ns, first.mtime_ns);
  // The first reader, still holding its inode, reads its own rendering to the end, at its own size.
  EXPECT_EQ(text_of(first.ino), first_text);
  EXPECT_EQ(live.getattr(first.ino).value().size, first.size);
  EXPECT_EQ(text_of(second.ino).size(), second.size);
  EXPECT_TRUE(ControlTree::is_live(first.ino) && ControlTree::is_live(second.ino));
  EXPECT_FALSE(ControlTree::is_live(rank_attr(0, 0).ino));
}

TEST_F(LiveTest, ARenderingIsGoneOnceTheKernelForgetsItUnlessItIsTheLatest) {
  const ControlAttr first = stats();
  stats();  // a second lookup of the same rendering (within kLiveRefresh), or of a new one
  live.forget(first.ino, 1);
  const ControlAttr later = next_after(first);
  EXPECT_NE(text_of(first.ino), "(gone)");  // one lookup of it may still be held
  live.forget(first.ino, 2);                // (more than it holds: counted down to none, no further)
  EXPECT_EQ(text_of(first.ino), "(gone)");
  EXPECT_FALSE(live.getattr(first.ino));
  live.forget(later.ino, 1);
  EXPECT_NE(text_of(later.ino), "(gone)");  // the latest, kept for the next lookup
  EXPECT_EQ(live.renderings(), 1u);
  EXPECT_EQ(stats().ino, later.ino);
}

TEST_F(LiveTest, AnotherUserIsGivenARenderingUpToASecondOld) {
  const ControlAttr owners = stats();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(stats(ControlTree::Reader::kOther).ino, owners.ino);
  EXPECT_NE(next_after(owners).ino, owners.ino);
}

TEST_F(LiveTest, RenderingsHeldAreBoundedInBytes) {
  size = 20 << 20;  // 20 MiB a rendering: the fourth held passes the 64 MiB bound
  ControlAttr a = stats();
  for (int i = 0; i < 3; ++i) a = next_after(a);
  EXPECT_EQ(live.renderings(), 4u);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(stats().ino, a.ino);  // the latest again, however old, until one is let go
  EXPECT_EQ(made, 4u);
  live.forget(a.ino - 1, 1);
  EXPECT_NE(next_after(a).ino, a.ino);
  EXPECT_EQ(live.renderings(), 4u);
  EXPECT_GE(live.cached_bytes(), size_t{80} << 20);
}

}  // namespace
}  // namespace clairfs
