// Unit tests for the manifest: the scan, ImageFolder's sample order on awkward trees, the file format
// and its validation.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "clairfs/manifest.hpp"
#include "clairfs/options.hpp"

namespace fs = std::filesystem;

namespace clairfs {
namespace {

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/clairfs-manifest-XXXXXX";
    root_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(root_); }

  void file(const std::string& rel, const std::string& content = "x") {
    fs::create_directories(fs::path(root_ + "/" + rel).parent_path());
    std::ofstream(root_ + "/" + rel) << content;
  }
  void dir(const std::string& rel) { fs::create_directories(root_ + "/" + rel); }
  void link(const std::string& target, const std::string& rel) {
    fs::create_directories(fs::path(root_ + "/" + rel).parent_path());
    fs::create_symlink(target, root_ + "/" + rel);
  }
  std::vector<std::string> sample_paths(const Manifest& m) {
    std::vector<std::string> out;
    for (EntryId id : m.samples()) out.push_back(m.path(id));
    return out;
  }
  Manifest scan() { return Manifest::scan(root_, default_extensions()); }

  std::string root_;
};

TEST_F(ManifestTest, ClassesSortByBytesAndHiddenOnesCount) {
  file("b/1.png");
  file("B/1.png");
  file("a/1.png");
  file(".hidden/1.png");
  file("top.png");  // a file at the root is no class and no sample
  Manifest m = scan();
  EXPECT_EQ(sample_paths(m), (std::vector<std::string>{".hidden/1.png", "B/1.png", "a/1.png", "b/1.png"}));
  ASSERT_EQ(m.classes().size(), 4u);
  EXPECT_EQ(m.name(m.classes()[1].entry), "B");
  EXPECT_EQ(m.classes()[3].first_sample, 3u);
}

TEST_F(ManifestTest, AViewOfASubfolderHasItsSamplesOnTheSameTree) {
  // SOURCE holds train/ and val/; a job reads ImageFolder(MOUNTPOINT/train): the view's samples are that
  // folder's walk (its classes a and b, with the extensions the manifest walked with), on the same entries.
  file("train/b/2.png");
  file("train/a/1.png");
  file("train/a/skip.txt");
  file("val/a/3.png");
  const Manifest m = Manifest::scan(root_, {".png"});
  EXPECT_EQ(sample_paths(m), (std::vector<std::string>{"train/a/1.png", "train/b/2.png", "val/a/3.png"}));
  EXPECT_EQ(m.sample_root(), "");
  const std::optional<Manifest> train = m.with_root("train");
  ASSERT_TRUE(train);
  EXPECT_EQ(sample_paths(*train), (std::vector<std::string>{"train/a/1.png", "train/b/2.png"}));
  EXPECT_EQ(train->sample_root(), "train");
  EXPECT_EQ(train->classes().size(), 2u);
  EXPECT_EQ(train->samples()[0], m.samples()[0]);  // the same entries
  EXPECT_EQ(train->size(), m.size());
  EXPECT_FALSE(m.with_root("train/a/1.png"));  // no folder
  EXPECT_FALSE(m.with_root("nothing"));
}

TEST_F(ManifestTest, AViewLessSomeFilesKeepsTheWalksOrderAndCountsThoseLeftOut) {
  // ImageFolder with an is_valid_file: the walk's samples in its order, less those the rule left out.
  file("a/1.png");
  file("a/2.png");
  file("b/3.png");
  file("b/4.png");
  const Manifest m = scan();
  const EntryId left = m.samples()[1];
  const Manifest kept = m.with_samples_kept([&](EntryId id) { return id != left; });
  EXPECT_EQ(sample_paths(kept), (std::vector<std::string>{"a/1.png", "b/3.png", "b/4.png"}));
  EXPECT_EQ(kept.left_out(), 1u);
  EXPECT_EQ(kept.sample_root(), m.sample_root());
  EXPECT_EQ(m.left_out(), 0u);
  EXPECT_EQ(kept.with_samples_kept([](EntryId) { return true; }).left_out(), 1u);  // of the walk, still
}

TEST_F(ManifestTest, ASortedGlobViewListsTheFilesWithItsSuffixesInPathOrder) {
  // sorted(glob(f"{dir}/**/*.jpg", recursive=True)): every name but those starting with '.', at any depth
  // (the folder's own files too), the suffix matched with case; the paths sorted as strings ("a-b.jpg"
  // before "a/...", '-' being before '/').
  file("a/x.jpg");
  file("a-b.jpg");
  file("a/sub/y.jpg");
  file("a/z.JPG");
  file("a/.h.jpg");
  file(".hid/w.jpg");
  file("b/c.png");
  file("a/x.jpg.txt");
  const Manifest m = scan();
  const std::optional<Manifest> all = m.with_sorted_glob("", {".jpg"});
  ASSERT_TRUE(all);
  EXPECT_EQ(sample_paths(*all), (std::vector<std::string>{"a-b.jpg", "a/sub/y.jpg", "a/x.jpg"}));
  EXPECT_TRUE(all->globbed());
  EXPECT_TRUE(all->classes().empty());
  const std::optional<Manifest> a = m.with_sorted_glob("a", {".JPG", ".jpg"});
  ASSERT_TRUE(a);
  EXPECT_EQ(sample_paths(*a), (std::vector<std::string>{"a/sub/y.jpg", "a/x.jpg", "a/z.JPG"}));
  EXPECT_EQ(a->sample_root(), "a");
  EXPECT_FALSE(a->with_root("a/sub"));  // no walk to take the extensions of
  EXPECT_FALSE(m.with_sorted_glob("a-b.jpg", {".jpg"}));
}

TEST_F(ManifestTest, DirectoriesWalkInSortedPathOrderDashBeforeSlash) {
  file("c/x/z/3.png");
  file("c/x-y/2.png");
  file("c/x/1.png");
  file("c/0.png");
  file("c/x/z/a.png");
  Manifest m = scan();
  EXPECT_EQ(sample_paths(m),
            (std::vector<std::string>{"c/0.png", "c/x/1.png", "c/x-y/2.png", "c/x/z/3.png", "c/x/z/a.png"}));
}

TEST_F(ManifestTest, ExtensionsIgnoreCaseAndHiddenFilesCount) {
  file("c/A.PNG");
  file("c/b.Jpeg");
  file("c/.c.png");
  file("c/d.txt");
  file("c/e.png.bak");
  file("c/f.webp");
  file("c/g.TIFF");
  file("c/png");
  Manifest m = scan();
  EXPECT_EQ(sample_paths(m), (std::vector<std::string>{"c/.c.png", "c/A.PNG", "c/b.Jpeg", "c/f.webp", "c/g.TIFF"}));
  Manifest only_txt = Manifest::scan(root_, {".txt"});
  EXPECT_EQ(sample_paths(only_txt), (std::vector<std::string>{"c/d.txt"}));
}

TEST_F(ManifestTest, SymlinkedDirectoriesAreFollowed) {
  file("real/r.png");
  file("c/a.png");
  link("../real", "c/sub");                // a symlinked directory inside a class
  link("real", "d");                       // a symlinked class
  link(root_ + "/real/r.png", "c/z.png");  // an absolute link to a file inside SOURCE
  link("/nonexistent/x.png", "c/y.png");   // a dangling link is still listed, as ImageFolder does
  Manifest m = scan();
  const EntryId real = m.lookup(m.lookup(0, "real"), "r.png");
  ASSERT_NE(real, kNoEntry);
  // c: a.png, y.png (dangling: the link itself), z.png -> real/r.png, then dir c/sub -> real/r.png;
  // d -> real: r.png; real: r.png.
  std::vector<std::string> expect = {"c/a.png", "c/y.png", "real/r.png", "real/r.png", "real/r.png", "real/r.png"};
  EXPECT_EQ(sample_paths(m), expect);
  EXPECT_EQ(m.classes().size(), 3u);
  EXPECT_EQ(m.name(m.classes()[1].entry), "d");
  EXPECT_EQ(m.irregular_samples(), 1u);  // y.png
  file("c/b.png");
  EXPECT_EQ(scan().irregular_samples(), 1u);
  ::unlink((root_ + "/c/y.png").c_str());
  EXPECT_EQ(scan().irregular_samples(), 0u);
}

TEST_F(ManifestTest, SymlinkCycleIsWalkedOnceWithAWarning) {
  file("c/a/1.png");
  link("..", "c/a/up");
  Manifest m = scan();
  EXPECT_EQ(sample_paths(m), (std::vector<std::string>{"c/a/1.png"}));
  ASSERT_FALSE(m.warnings().empty());
  EXPECT_NE(m.warnings()[0].find("cycle"), std::string::npos);
}

TEST_F(ManifestTest, TreeMirrorsSource) {
  file("c/name with spaces.png", "12345");
  file("c/ünïcödé.png");
  file("c/new\nline.png");
  link("name with spaces.png", "c/l");
  ::mkfifo((root_ + "/fifo").c_str(), 0600);
  ::chmod((root_ + "/c/ünïcödé.png").c_str(), 0640);
  Manifest m = scan();
  const EntryId c = m.lookup(0, "c");
  ASSERT_NE(c, kNoEntry);
  EXPECT_TRUE(m.is_dir(c));
  const EntryId spaced = m.lookup(c, "name with spaces.png");
  ASSERT_NE(spaced, kNoEntry);
  EXPECT_EQ(m.entry(spaced).size, 5u);
  EXPECT_EQ(m.path(spaced), "c/name with spaces.png");
  EXPECT_EQ(m.entry(m.lookup(c, "ünïcödé.png")).mode & 07777, 0640u);
  EXPECT_NE(m.lookup(c, "new\nline.png"), kNoEntry);
  const EntryId l = m.lookup(c, "l");
  EXPECT_TRUE(S_ISLNK(m.entry(l).mode));
  EXPECT_EQ(m.link_target(l), "name with spaces.png");
  EXPECT_TRUE(S_ISFIFO(m.entry(m.lookup(0, "fifo")).mode));
  EXPECT_EQ(m.lookup(c, "missing"), kNoEntry);
  EXPECT_EQ(m.lookup(spaced, "x"), kNoEntry);
  struct stat st {};
  ASSERT_EQ(::stat((root_ + "/c/name with spaces.png").c_str(), &st), 0);
  EXPECT_EQ(m.entry(spaced).mtime_ns, st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
  EXPECT_EQ(m.entry(0).subdir_count, 1u);
}

TEST_F(ManifestTest, SaveLoadRoundTripsAndDamageIsDetected) {
  file("c/1.png", "abc");
  file("d/e/2.jpg");
  link("../c", "d/l");
  Manifest m = scan();
  const std::string file = root_ + "/../" + fs::path(root_).filename().string() + ".manifest";
  m.save(file);
  Manifest back = Manifest::load(file, default_extensions());
  ASSERT_EQ(back.size(), m.size());
  for (EntryId i = 0; i < m.size(); ++i) {
    EXPECT_EQ(back.path(i), m.path(i));
    EXPECT_EQ(back.entry(i).size, m.entry(i).size);
    EXPECT_EQ(back.entry(i).mode, m.entry(i).mode);
  }
  EXPECT_TRUE(std::equal(back.samples().begin(), back.samples().end(), m.samples().begin(), m.samples().end()));

  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) { std::ofstream(file, std::ios::binary | std::ios::trunc) << b; };
  auto load_error = [&]() -> std::string {
    try {
      Manifest::load(file, default_extensions());
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  write(bytes.substr(0, bytes.size() - 1));
  EXPECT_NE(load_error().find("truncated"), std::string::npos);
  for (size_t pos : {size_t{70}, bytes.size() / 2, bytes.size() - 2}) {
    std::string flipped = bytes;
    flipped[pos] ^= 0x20;
    write(flipped);
    EXPECT_NE(load_error(), "") << "flip at " << pos;
  }
  write("not a manifest at all, but long enough to hold a header of sixty-four bytes.........");
  EXPECT_NE(load_error().find("not a clairfs manifest"), std::string::npos);
  write("");
  EXPECT_NE(load_error(), "");
  fs::remove(file);
}

TEST_F(ManifestTest, ValidationRejectsInconsistentTrees) {
  std::vector<Entry> entries(2);
  entries[0].mode = S_IFDIR | 0755;
  entries[0].first_child = 1;
  entries[0].child_count = 1;
  entries[1].mode = S_IFREG | 0644;
  entries[1].name_len = 1;
  EXPECT_NO_THROW(Manifest::from_parts(entries, "a", default_extensions(), "/"));
  auto bad = entries;
  bad[0].child_count = 2;  // children beyond the table
  EXPECT_THROW(Manifest::from_parts(bad, "a", default_extensions(), "/"), std::runtime_error);
  bad = entries;
  bad[1].name_len = 5;  // name beyond the blob
  EXPECT_THROW(Manifest::from_parts(bad, "a", default_extensions(), "/"), std::runtime_error);
  EXPECT_THROW(Manifest::from_parts(entries, "/", default_extensions(), "/"), std::runtime_error);
  bad = entries;
  bad[1].mode = S_IFDIR | 0755;  // a directory not counted as a subdirectory
  EXPECT_THROW(Manifest::from_parts(bad, "a", default_extensions(), "/"), std::runtime_error);
  bad = entries;
  bad[0].child_count = 0;  // entry 1 unreachable
  EXPECT_THROW(Manifest::from_parts(bad, "a", default_extensions(), "/"), std::runtime_error);
}

TEST_F(ManifestTest, MemoryStaysUnderFortyBytesPerFilePlusNames) {
  size_t name_bytes = 0;
  for (int c = 0; c < 10; ++c)
    for (int i = 0; i < 200; ++i) {
      const std::string name = "img_" + std::to_string(i) + ".png";
      file("class" + std::to_string(c) + "/" + name);
      name_bytes += name.size();
    }
  Manifest m = scan();
  EXPECT_EQ(m.samples().size(), 2000u);
  EXPECT_LE(m.memory_bytes(), 2011 * 40 + name_bytes + 10 * 6);  // 32 a table row, 4 a sample
}

bool same(const Entry& a, const Entry& b) { return std::memcmp(&a, &b, sizeof(Entry)) == 0; }

// samples=FILE: the list read in either form, each path's file a sample in the list's order.
class SampleListTest : public ManifestTest {
 protected:
  void SetUp() override {
    ManifestTest::SetUp();
    file("cat/1.jpg");
    file("cat/2.jpg");
    file("dog/1.jpg");
    file("dog/notes.txt");
    link("../cat/2.jpg", "dog/alias.jpg");
    link("../nowhere.jpg", "dog/dangling.jpg");
  }
  // Uses `text` as the list; the error text if it is refused ("" if not).
  std::string use(Manifest& m, const std::string& text) {
    std::FILE* in = ::fmemopen(const_cast<char*>(text.data()), text.size(), "r");
    if (text.empty()) in = std::fopen("/dev/null", "r");
    std::string error;
    try {
      m.use_samples(in, "L", {"/mnt/x", root_});
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    std::fclose(in);
    return error;
  }
  std::vector<std::string> given_paths(const Manifest& m) {
    std::vector<std::string> out;
    for (size_t i = 0; i < m.samples().size(); ++i) out.push_back(m.sample_path(i));
    return out;
  }
};

TEST_F(SampleListTest, ALineListInItsOwnOrderWithAnyFileAndPathsUnderTheMountOrSource) {
  Manifest m = scan();
  ASSERT_EQ(use(m, "# the job's list\n\ndog/notes.txt\r\n/mnt/x/dog/1.jpg\n" + root_ + "/cat/1.jpg\n./cat/2.jpg\n"),
            "");
  EXPECT_EQ(sample_paths(m), (std::vector<std::string>{"dog/notes.txt", "dog/1.jpg", "cat/1.jpg", "cat/2.jpg"}));
  EXPECT_TRUE(m.classes().empty());
  EXPECT_FALSE(m.sample_root());  // a list: no walk of a folder, and no view of one
  EXPECT_FALSE(m.with_root("cat"));
}

TEST_F(SampleListTest, AJsonListOfPathsOrOfPathLabelPairsAsTorchvisionHasThem) {
  Manifest m = scan();
  ASSERT_EQ(use(m, R"( [["/mnt/x/dog/1.jpg", 1], ["cat/1.jpg", 0]] )"), "");
  EXPECT_EQ(sample_paths(m), (std::vector<std::string>{"dog/1.jpg", "cat/1.jpg"}));
  ASSERT_EQ(use(m, R"(["cat/2.jpg", "dog/alias.jpg"])"), "");
  // A file reached through a symlink keeps the path the job gives it (the published orders name it).
  // A file listed twice (here once through a symlink) is two samples, as in the job's Dataset; each keeps
  // the path the job gives it (the published orders name it).
  EXPECT_EQ(sample_paths(m), (std::vector<std::string>{"cat/2.jpg", "cat/2.jpg"}));
  EXPECT_EQ(given_paths(m), (std::vector<std::string>{"cat/2.jpg", "dog/alias.jpg"}));
  EXPECT_EQ(m.irregular_samples(), 0u);
  // A link that leads nowhere is a sample ImageFolder lists too (no read serves it): counted irregular.
  ASSERT_EQ(use(m, R"(["dog/dangling.jpg", "cat/1.jpg"])"), "");
  EXPECT_EQ(sample_paths(m), (std::vector<std::string>{"dog/dangling.jpg", "cat/1.jpg"}));
  EXPECT_EQ(m.irregular_samples(), 1u);
}

TEST_F(SampleListTest, EachBadEntryIsRefusedByWhereItIs) {
  Manifest m = scan();
  EXPECT_EQ(use(m, "cat/1.jpg\ncat/9.jpg\n"), "samples 'L' line 2: 'cat/9.jpg' is no file in SOURCE");
  EXPECT_EQ(use(m, "cat\n"), "samples 'L' line 1: 'cat' is a folder, not a file");
  EXPECT_NE(use(m, "/elsewhere/cat/1.jpg\n").find("line 1: '/elsewhere/cat/1.jpg' is under neither /mnt/x nor"),
            std::string::npos);
  EXPECT_EQ(use(m, R"(["cat/1.jpg", 3])"), "samples 'L' element 1 is neither a path nor a [path, label] pair");
  EXPECT_EQ(use(m, R"([["cat/1.jpg", 0], [], "x"])"),
            "samples 'L' element 1 is neither a path nor a [path, label] pair");
  EXPECT_EQ(use(m, R"([{"path": "cat/1.jpg"}])"), "samples 'L' element 0 is neither a path nor a [path, label] pair");
  EXPECT_NE(use(m, R"(["cat/1.jpg",)").find("samples 'L' is no JSON list (broken at byte"), std::string::npos);
  EXPECT_EQ(use(m, "# nothing\n"), "samples 'L' names no samples");
  EXPECT_EQ(use(m, ""), "samples 'L' names no samples");
  EXPECT_EQ(use(m, "[]"), "samples 'L' names no samples");
}

TEST(EntryTable, GivesBackEveryEntryAsAdded) {
  std::vector<Entry> in;
  Entry dir;
  dir.mode = S_IFDIR | 0750;
  dir.size = 4096;
  dir.first_child = 7;
  dir.child_count = 3;
  dir.subdir_count = 1;
  dir.mtime_ns = -5;
  in.push_back(dir);
  Entry file;
  file.mode = S_IFREG | 0644;
  file.size = 123456789012;
  file.name_off = (uint64_t{1} << 40) - 9;
  file.name_len = 65535;
  file.parent = 0xfffffffe;
  in.push_back(file);
  Entry link = file;
  link.mode = S_IFLNK | 0777;
  link.link_len = 40000;
  in.push_back(link);
  Entry odd = file;  // what only a damaged file holds, given back for validation to refuse
  odd.size = (uint64_t{1} << 63) + 5;
  odd.child_count = 2;
  in.push_back(odd);
  // Owners beyond 2^16 distinct combinations: the attribute index's high bits.
  for (uint32_t k = 0; k < 70000; ++k) {
    file.uid = k;
    file.gid = 70000 - k;
    file.size = k;
    in.push_back(file);
  }
  in.push_back(dir);
  Entry all_ones = file;  // every bit of mode, owner and group set (a damaged file's): a key like any other
  all_ones.mode = all_ones.uid = all_ones.gid = 0xffffffff;
  EntryTable first;
  first.push_back(all_ones);
  first.finish();
  ASSERT_TRUE(same(first[0], all_ones));
  in.push_back(all_ones);
  EntryTable t;
  for (const Entry& e : in) t.push_back(e);
  t.finish();
  ASSERT_EQ(t.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) ASSERT_TRUE(same(t[i], in[i])) << "entry " << i;
  EXPECT_EQ(t.mode(2), link.mode);
  EXPECT_EQ(t.parent(1), file.parent);
  EXPECT_EQ(t.name_off(1), file.name_off);
  EXPECT_EQ(t.link_len(2), 40000u);
  EntryTable big;
  file.name_off = uint64_t{1} << 40;
  EXPECT_THROW(big.push_back(file), std::runtime_error);
}

TEST(EntryTable, ADirectorysChildrenAreSetAfterIt) {
  Entry dir;
  dir.mode = S_IFDIR | 0755;
  dir.size = 4096;
  Entry file;
  file.mode = S_IFREG | 0644;
  EntryTable t;
  t.push_back(dir);
  t.push_back(file);
  t.push_back(dir);
  t.set_children(0, 1, 2, 1);
  t.set_children(2, 3, 0, 0);
  t.finish();
  EXPECT_EQ(t[0].first_child, 1u);
  EXPECT_EQ(t[0].child_count, 2u);
  EXPECT_EQ(t[0].subdir_count, 1u);
  EXPECT_EQ(t[0].size, 4096u);
  EXPECT_EQ(t[2].first_child, 3u);
  EXPECT_EQ(t[1].size, 0u);
}

TEST(ReallocArray, KeepsItsValuesAsItGrowsAndShrinks) {
  // 48 MiB: past glibc's largest mmap threshold, so the block is a mapping of its own, moved by mremap.
  ReallocArray<uint64_t> a;
  for (uint64_t i = 0; i < (6u << 20); ++i) a.push_back(i * 0x9e3779b97f4a7c15ull);
  ASSERT_EQ(a.size(), 6u << 20);
  EXPECT_GE(a.capacity(), a.size());
  a.shrink_to_fit();
  EXPECT_EQ(a.capacity(), a.size());
  for (uint64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], i * 0x9e3779b97f4a7c15ull) << i;
  ReallocArray<uint64_t> moved(std::move(a));
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): a moved-from array is empty
  EXPECT_EQ(moved.back(), ((6u << 20) - 1) * 0x9e3779b97f4a7c15ull);
  ReallocArray<char> text("abc", 3);
  text.resize(6);  // zero bytes after
  text.append("de", 2);
  EXPECT_EQ(view(text), std::string_view("abc\0\0\0de", 8));
  text.resize(2);
  EXPECT_EQ(view(text), "ab");
  text.shrink_to_fit();
  text.resize(0);
  text.shrink_to_fit();
  EXPECT_TRUE(text.empty());
  EXPECT_NE(text.data(), nullptr);  // as std::string's: memcpy and read(2) may be given it
  EXPECT_EQ(ReallocArray<int>().data(), ReallocArray<int>().end());
}

// Whether the mapping holding `p` asked for huge pages (smaps' VmFlags "hg": MADV_HUGEPAGE). Whether the
// kernel then finds free huge pages depends on the machine's memory at the time, not on us.
bool huge_pages_asked_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2) {  // a mapping's first line
      in = from <= at && at < to;
    } else if (in && line.rfind("VmFlags:", 0) == 0) {
      return (line + " ").find(" hg ") != std::string::npos;
    }
  }
  return false;
}

TEST(ReallocArray, ABlockSizedAtOnceAsksForHugePages) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator maps blocks its own way";
#endif
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string modes((std::istreambuf_iterator<char>(thp)), {});
  if (modes.empty() || modes.find("[never]") != std::string::npos) GTEST_SKIP() << "no transparent huge pages here";
  ReallocArray<char> a;
  a.resize(size_t{32} << 20);  // sized at once
  // Its middle: the advice splits the mapping at the 2 MiB boundaries inside, so its start is apart.
  EXPECT_TRUE(huge_pages_asked_at(a.data() + (size_t{16} << 20))) << "THP: " << modes;
}

TEST_F(ManifestTest, OneThreadOrManyGiveTheSameTree) {
  // Directories listed by many threads at once are still taken in entry order.
  for (int c = 0; c < 20; ++c)
    for (int i = 0; i < 150; ++i) file("c" + std::to_string(c) + "/f" + std::to_string(i) + ".png", std::string(i, 'x'));
  file("c3/deep/er/x.jpg", "123");
  link("../c1/f5.png", "c2/l.png");
  link("/nowhere", "c2/dangling.png");
  ASSERT_EQ(::mkfifo((root_ + "/c4/fifo").c_str(), 0600), 0);
  const Manifest plain = Manifest::scan(root_, default_extensions(), 1);
  const Manifest together = Manifest::scan(root_, default_extensions(), 16);
  EXPECT_EQ(together.size(), plain.size());
  EXPECT_EQ(together.serialize(), plain.serialize());
  EXPECT_EQ(sample_paths(together), sample_paths(plain));
  EXPECT_EQ(together.entry(together.resolve_relative("c1/f7.png")).size, 7u);
}

// Files' attributes later: the tree, the samples and (once filled) every attribute are the scan's.
TEST_F(ManifestTest, AttributesLaterGiveTheSameTreeOnceFilled) {
  for (int c = 0; c < 20; ++c)
    for (int i = 0; i < 150; ++i) file("c" + std::to_string(c) + "/f" + std::to_string(i) + ".png", std::string(i, 'x'));
  file("c3/deep/er/x.jpg", "123");
  ASSERT_EQ(::chmod((root_ + "/c3/f9.png").c_str(), 0600), 0);
  ASSERT_EQ(::chown((root_ + "/c5/f1.png").c_str(), 123, 456), 0);
  link("../c1/f5.png", "c2/l.png");
  ASSERT_EQ(::mkfifo((root_ + "/c4/fifo").c_str(), 0600), 0);
  const Manifest now = Manifest::scan(root_, default_extensions());
  const Manifest later = Manifest::scan(root_, default_extensions(), 16, Manifest::Attributes::kLater);
  EXPECT_FALSE(now.attributes_pending());
  ASSERT_TRUE(later.attributes_pending());
  EXPECT_EQ(sample_paths(later), sample_paths(now));
  const EntryId f7 = later.resolve_relative("c1/f7.png");
  EXPECT_EQ(later.mode(f7), uint32_t{S_IFREG});  // the type alone so far
  EXPECT_TRUE(S_ISDIR(later.entry(later.lookup(0, "c1")).mode));  // directories are stat-ed in the walk
  EXPECT_EQ(later.entry(later.resolve_relative("c4/fifo")).mode, now.entry(now.resolve_relative("c4/fifo")).mode);
  // One at once, before the fill.
  ASSERT_TRUE(later.ensure(f7));
  EXPECT_EQ(later.entry(f7).size, 7u);
  EXPECT_EQ(later.entry(f7).mtime_ns, now.entry(f7).mtime_ns);
  std::atomic<bool> stop{false};
  later.fill_attributes(stop, 4);
  EXPECT_FALSE(later.attributes_pending());
  EXPECT_EQ(later.gone_at_fill(), 0u);
  EXPECT_EQ(later.serialize(), now.serialize());
}

// The fill and readers asking for files one at once, together (TSan runs this), and a file gone before
// its attributes were asked for.
TEST_F(ManifestTest, AttributesAskedForWhileTheFillRunsAreTheFiles) {
  for (int c = 0; c < 8; ++c)
    for (int i = 0; i < 400; ++i) file("c" + std::to_string(c) + "/f" + std::to_string(i) + ".png", std::string(i % 97, 'x'));
  const Manifest m = Manifest::scan(root_, default_extensions(), 4, Manifest::Attributes::kLater);
  const EntryId gone = m.resolve_relative("c6/f10.png");
  ASSERT_NE(gone, kNoEntry);
  fs::remove(root_ + "/c6/f10.png");
  std::atomic<bool> stop{false};
  std::thread filler([&] { m.fill_attributes(stop, 4); });
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 3; ++t)
    readers.emplace_back([&, t] {
      for (size_t k = t; k < m.samples().size(); k += 3) {
        const EntryId id = m.samples()[k];
        if (id == gone) continue;
        const std::string name(m.name(id));
        const uint64_t want = std::stoull(name.substr(1, name.size() - 5)) % 97;
        if (!m.ensure(id) || m.entry(id).size != want || !S_ISREG(m.entry(id).mode)) wrong++;
      }
    });
  for (auto& r : readers) r.join();
  filler.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_FALSE(m.attributes_pending());
  EXPECT_FALSE(m.ensure(gone));
  EXPECT_EQ(m.gone_at_fill(), 1u);
}

TEST_F(ManifestTest, AnUnreadableDirectoryIsShownEmptyAndTheRestScanned) {
  for (int c = 0; c < 40; ++c) file("c" + std::to_string(c) + "/f.png");
  file("c7/deeper/g.png");
  ASSERT_EQ(::chmod((root_ + "/c7").c_str(), 0), 0);
  ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
  // Root reads anything: the scan runs in a child that is nobody. Exit codes name the failed check.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0)) ::_exit(10);
    try {
      const Manifest m = Manifest::scan(root_, default_extensions(), 16);
      if (m.samples().size() != 39) ::_exit(1);
      const EntryId c7 = m.lookup(0, "c7");
      if (c7 == kNoEntry || !S_ISDIR(m.entry(c7).mode) || m.entry(c7).child_count != 0) ::_exit(2);
      if (m.resolve_relative("c39/f.png") == kNoEntry) ::_exit(3);
      ::_exit(0);
    } catch (...) {
      ::_exit(4);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(ManifestTest, SerializedEntriesAreTheFileFormatsBytes) {
  file("b/2.jpg", "22");
  file("a/1.png", "1");
  link("../a/1.png", "b/l.jpg");
  const Manifest m = scan();
  const std::string bytes = m.serialize();
  ASSERT_GE(bytes.size(), 64 + m.size() * sizeof(Entry));
  for (EntryId id = 0; id < m.size(); ++id) {
    Entry e;
    std::memcpy(&e, bytes.data() + 64 + id * sizeof(Entry), sizeof(Entry));
    EXPECT_TRUE(same(e, m.entry(id))) << "entry " << id;
  }
  EXPECT_EQ(m.entry(0).child_count, 2u);
  EXPECT_EQ(m.entry(m.lookup(m.lookup(0, "b"), "2.jpg")).size, 2u);
}

TEST_F(ManifestTest, SerializedBytesComeBackTheSameAndDamageIsRefused) {
  // What node 0 broadcasts to the other nodes.
  file("b/2.jpg", "22");
  file("a/1.png", "1");
  link("../a/1.png", "b/l.jpg");
  const Manifest m = scan();
  const std::string bytes = m.serialize();
  const Manifest back = Manifest::deserialize(bytes, default_extensions(), root_);
  EXPECT_EQ(sample_paths(back), sample_paths(m));
  ASSERT_EQ(back.size(), m.size());
  for (EntryId id = 0; id < m.size(); ++id) {
    EXPECT_EQ(back.path(id), m.path(id));
    EXPECT_EQ(back.entry(id).size, m.entry(id).size);
  }
  std::string damaged = bytes;
  damaged[damaged.size() / 2] ^= 0x5a;
  EXPECT_THROW(Manifest::deserialize(damaged, default_extensions(), root_), std::runtime_error);
  EXPECT_THROW(Manifest::deserialize(bytes.substr(0, bytes.size() - 1), default_extensions(), root_), std::runtime_error);
  EXPECT_THROW(Manifest::deserialize("", default_extensions(), root_), std::runtime_error);
}

TEST_F(ManifestTest, AnEmptySourceHasNoNamesAndComesBackTheSame) {
  // No name at all: the name table is empty (and its bytes are still passed to the hash and the copy).
  const Manifest m = scan();
  ASSERT_EQ(m.size(), 1u);
  const Manifest back = Manifest::deserialize(m.serialize(), default_extensions(), root_);
  EXPECT_EQ(back.size(), 1u);
  EXPECT_EQ(back.serialize(), m.serialize());
  EXPECT_TRUE(back.samples().empty());
}

TEST_F(ManifestTest, TheIndexInPiecesIsTheSameBytesAndReadsBackAsItArrives) {
  // How the index goes to the other nodes: written in pieces as it is sent, read as the pieces arrive.
  for (int i = 0; i < 5000; ++i) file("c" + std::to_string(i % 7) + "/" + std::to_string(i) + ".jpg", std::string(i % 5, 'x'));
  link("../c1/1.jpg", "c2/l.jpg");
  const Manifest m = scan();
  std::string pieces;
  size_t calls = 0;
  m.serialize_to([&](const char* data, size_t len) {
    pieces.append(data, len);
    ++calls;
  });
  const std::string whole = m.serialize();
  EXPECT_EQ(pieces, whole);
  EXPECT_EQ(m.serialized_size(), whole.size());
  EXPECT_GT(calls, 3u);  // the entries in more than one piece
  // Read back through reads of odd lengths, as a receiver's pieces end anywhere.
  for (size_t step : {size_t{1}, size_t{7}, size_t{4096}, whole.size()}) {
    size_t at = 0;
    auto read = [&](char* to, size_t len) {
      if (len > whole.size() - at) throw std::runtime_error("past the end");
      for (size_t done = 0; done < len;) {
        const size_t n = std::min(step, len - done);
        std::memcpy(to + done, whole.data() + at, n);
        at += n;
        done += n;
      }
    };
    const Manifest back = Manifest::read_from(read, whole.size(), default_extensions(), root_);
    EXPECT_EQ(at, whole.size());
    EXPECT_EQ(back.serialize(), whole) << "reads of " << step;
    EXPECT_EQ(sample_paths(back), sample_paths(m));
  }
  // A size that does not match the header, or damage, is refused.
  size_t at = 0;
  auto read = [&](char* to, size_t len) {
    std::memcpy(to, whole.data() + at, std::min(len, whole.size() - at));
    at += len;
  };
  EXPECT_THROW(Manifest::read_from(read, whole.size() + 1, default_extensions(), root_), std::runtime_error);
  std::string damaged = whole;
  damaged[whole.size() - 3] ^= 1;
  at = 0;
  auto read_damaged = [&](char* to, size_t len) {
    std::memcpy(to, damaged.data() + at, len);
    at += len;
  };
  EXPECT_THROW(Manifest::read_from(read_damaged, damaged.size(), default_extensions(), root_), std::runtime_error);
}

}  // namespace
}  // namespace clairfs
