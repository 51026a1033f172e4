// The NVMe tier on a real directory (under /var/tmp, a disk file system that punches holes, as NVMe's
// do): copies packed into slabs take their bytes, not whole blocks each; a copy let go gives its blocks
// back; the disk agrees with what the tier says it uses; damaged copies are caught; and where holes
// cannot be punched, each copy has a slab of its own.
#include "tiers/nvme.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "fakes/memory_source.hpp"
#include "io/io_loop.hpp"

namespace clairfs {
namespace {

using namespace std::chrono_literals;

std::vector<uint64_t> sizes(size_t n, uint64_t first) {
  std::vector<uint64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = first + i * 37 % 1500;
  return out;
}

struct NvmeTest : ::testing::Test {
  explicit NvmeTest(std::vector<uint64_t> s = sizes(200, 1800)) : tree(s) {
    if (!::mkdtemp(dir)) throw std::runtime_error("mkdtemp");
  }
  ~NvmeTest() override {
    tier.reset();
    std::filesystem::remove_all(dir);
  }
  void make(NvmeTier::Packing packing = NvmeTier::Packing::kWhereItCan, uint64_t capacity = 64 << 20,
            uint64_t slab_bytes = NvmeTier::kSlabBytes) {
    tier = std::make_unique<NvmeTier>(tree.manifest, dir, capacity, packing, slab_bytes);
  }
  // Offers file i (its room reserved first); true once written.
  bool offer(size_t i) {
    const EntryId id = tree.file(i);
    const std::string& b = tree.bytes(id);
    if (!tier->reserve(b.size())) return false;
    int rc = 1;
    tier->start_offer(io, id, std::make_shared<const Bytes>(b.begin(), b.end()), [&](int r) { rc = r; });
    for (int k = 0; k < 1000 && rc == 1; ++k) io.run(10ms);
    return rc == 0;
  }
  std::string fetch(size_t i, int* rc) {
    auto buf = std::make_shared<Bytes>(tree.bytes(tree.file(i)).size());
    *rc = tier->fetch(tree.file(i), buf);
    return std::string(buf->begin(), buf->end());
  }
  std::string start_fetch(size_t i, int* rc) {
    auto buf = std::make_shared<Bytes>(tree.bytes(tree.file(i)).size());
    *rc = 1;
    tier->start_fetch(io, tree.file(i), buf, [rc](int r) { *rc = r; });
    for (int k = 0; k < 1000 && *rc == 1; ++k) io.run(10ms);
    return std::string(buf->begin(), buf->end());
  }
  // What the tier's files take on the disk.
  uint64_t disk() const {
    uint64_t total = 0;
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
      struct stat st {};
      if (f.is_regular_file() && ::stat(f.path().c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
    }
    return total;
  }
  size_t slab_files() const {
    size_t n = 0;
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) n += f.is_regular_file();
    return n;
  }

  // This process's descriptors of the tier's slabs (`removed`: of slabs no longer in the directory).
  size_t open_slabs(bool removed) const {
    size_t n = 0;
    for (const auto& f : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(f.path(), ec).string();
      if (!ec && target.rfind(tier->path() + "/slab.", 0) == 0)
        n += !removed || target.find(" (deleted)") != std::string::npos;
    }
    return n;
  }

  char dir[40] = "/var/tmp/clairfs-nvme-test.XXXXXX";
  fakes::MemoryTree tree;
  IoLoop io{8};
  std::unique_ptr<NvmeTier> tier;
};

TEST_F(NvmeTest, PackedCopiesTakeTheirBytesAndTheDiskAgrees) {
  make();
  ASSERT_TRUE(tier->packs());
  for (size_t i = 0; i < tree.files(); ++i) ASSERT_TRUE(offer(i));
  const uint64_t block = 4096, bytes = tree.total();
  EXPECT_EQ(tier->files(), tree.files());
  EXPECT_EQ(tier->slabs(), 1u);
  // One block more than the bytes at most (whole blocks each would take 200 × 1 block ≥ 1.5× the bytes).
  EXPECT_LE(tier->used(), (bytes + block - 1) / block * block);
  EXPECT_EQ(disk(), tier->used());
  for (size_t i = 0; i < tree.files(); ++i) {
    int rc = 1;
    EXPECT_EQ(fetch(i, &rc), tree.bytes(tree.file(i)));
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(start_fetch(i, &rc), tree.bytes(tree.file(i)));
    EXPECT_EQ(rc, 0);
  }
}

// Copies of ~10 KB: one between two held ones frees the blocks it alone covers (one of ~2.5 KB frees none).
struct LargerCopies : NvmeTest {
  LargerCopies() : NvmeTest(sizes(200, 9000)) {}
};

TEST_F(LargerCopies, CopiesLetGoGiveTheirBlocksBackAndTheRestStaysRight) {
  make();
  for (size_t i = 0; i < tree.files(); ++i) ASSERT_TRUE(offer(i));
  const uint64_t full = tier->used();
  // Every other copy: the blocks each shares with a neighbour still held stay.
  uint64_t freed = 0;
  for (size_t i = 0; i < tree.files(); i += 2) freed += tier->erase(tree.file(i));
  EXPECT_EQ(tier->used(), full - freed);
  EXPECT_EQ(disk(), tier->used());
  EXPECT_GT(freed, full / 5);
  for (size_t i = 1; i < tree.files(); i += 2) {
    int rc = 1;
    EXPECT_EQ(fetch(i, &rc), tree.bytes(tree.file(i)));
    fetch(i - 1, &rc);
    EXPECT_EQ(rc, -ENOENT);
  }
  // New copies after the holes: appended, still right.
  for (size_t i = 0; i < tree.files(); i += 2) ASSERT_TRUE(offer(i));
  for (size_t i = 0; i < tree.files(); ++i) {
    int rc = 1;
    EXPECT_EQ(start_fetch(i, &rc), tree.bytes(tree.file(i)));
  }
  EXPECT_EQ(disk(), tier->used());
  for (size_t i = 0; i < tree.files(); ++i) tier->erase(tree.file(i));
  EXPECT_EQ(tier->used(), 0u);
  EXPECT_EQ(disk(), 0u);
  EXPECT_EQ(tier->checksum_failures(), 0u);
}

TEST_F(NvmeTest, ADamagedCopyIsCaughtAndTheOthersInItsSlabStillServe) {
  make();
  for (size_t i = 0; i < 10; ++i) ASSERT_TRUE(offer(i));
  const auto held = tier->copy_of(tree.file(3));
  ASSERT_TRUE(held);
  {
    std::fstream slab(std::string(tier->path()) + "/" + NvmeTier::slab_name(held->slab),
                      std::ios::in | std::ios::out | std::ios::binary);
    slab.seekp(static_cast<std::streamoff>(held->offset + held->size / 2));
    slab.put('\x5a' ^ tree.bytes(tree.file(3))[held->size / 2]);
  }
  int rc = 1;
  start_fetch(3, &rc);
  EXPECT_EQ(rc, -EIO);
  EXPECT_EQ(tier->checksum_failures(), 1u);
  EXPECT_FALSE(tier->copy_of(tree.file(3)));  // let go
  for (size_t i : {2, 4}) EXPECT_EQ(fetch(i, &rc), tree.bytes(tree.file(i)));
}

TEST_F(NvmeTest, WithoutHolesEachCopyHasASlabOfItsOwnRemovedWithIt) {
  make(NvmeTier::Packing::kNever);
  EXPECT_FALSE(tier->packs());
  for (size_t i = 0; i < 20; ++i) ASSERT_TRUE(offer(i));
  EXPECT_EQ(slab_files(), 20u);
  EXPECT_EQ(tier->used(), 20u * 4096);  // each file (1.8-3.3 KB) takes a block
  EXPECT_EQ(disk(), tier->used());
  for (size_t i = 0; i < 20; i += 2) tier->erase(tree.file(i));
  EXPECT_EQ(slab_files(), 10u);
  EXPECT_EQ(disk(), tier->used());
  int rc = 1;
  EXPECT_EQ(start_fetch(5, &rc), tree.bytes(tree.file(5)));
}

TEST_F(NvmeTest, ASlabGoneFromTheDiskIsLeftForANewOne) {
  make();
  for (size_t i = 0; i < 5; ++i) ASSERT_TRUE(offer(i));
  const auto held = tier->copy_of(tree.file(0));
  ASSERT_TRUE(held);
  ASSERT_EQ(::unlink((tier->path() + "/" + NvmeTier::slab_name(held->slab)).c_str()), 0);
  EXPECT_FALSE(offer(5));  // its write fails (counted), and the next copy goes to a new slab
  EXPECT_EQ(tier->write_failures(), 1u);
  EXPECT_TRUE(offer(6));
  int rc = 1;
  EXPECT_EQ(start_fetch(6, &rc), tree.bytes(tree.file(6)));
  start_fetch(1, &rc);  // one of the lost slab's: unreadable, counted, let go
  EXPECT_EQ(rc, -EIO);
  EXPECT_EQ(tier->read_failures(), 1u);
  EXPECT_FALSE(tier->copy_of(tree.file(1)));
}

// The reads of a slab's copies share one descriptor, opened at the first, and it is closed when the slab
// is removed (held open, the removed slab would keep its blocks).
TEST_F(NvmeTest, ASlabIsOpenedOnceForItsReadsAndClosedWhenItIsRemoved) {
  make(NvmeTier::Packing::kWhereItCan, 64 << 20, 16 << 10);
  for (size_t i = 0; i < 40; ++i) ASSERT_TRUE(offer(i));
  const uint64_t slabs = tier->slabs();
  ASSERT_GE(slabs, 4u);  // 1.8-3.3 KB copies, 16 KiB slabs
  EXPECT_EQ(open_slabs(false), 0u);
  for (size_t i = 0; i < 40; ++i) {
    int rc = 1;
    EXPECT_EQ(i % 2 ? fetch(i, &rc) : start_fetch(i, &rc), tree.bytes(tree.file(i)));
    EXPECT_EQ(rc, 0);
  }
  EXPECT_EQ(open_slabs(false), slabs);
  for (size_t i = 0; i < 40; ++i) tier->erase(tree.file(i));
  EXPECT_EQ(slab_files(), 1u);  // the slab copies go to next stays
  EXPECT_EQ(open_slabs(true), 0u);
  EXPECT_EQ(open_slabs(false), 1u);
  EXPECT_EQ(disk(), 0u);
}

// A slab someone else removed (a node's cleanup) is not read through the descriptor kept for it, which
// would keep its blocks: its copies fail as unreadable, and the descriptor is closed.
TEST_F(NvmeTest, ASlabRemovedBySomeoneElseIsNotReadThroughItsDescriptor) {
  make();
  for (size_t i = 0; i < 5; ++i) ASSERT_TRUE(offer(i));
  int rc = 1;
  EXPECT_EQ(start_fetch(0, &rc), tree.bytes(tree.file(0)));
  ASSERT_EQ(open_slabs(false), 1u);
  const auto held = tier->copy_of(tree.file(1));
  ASSERT_TRUE(held);
  ASSERT_EQ(::unlink((tier->path() + "/" + NvmeTier::slab_name(held->slab)).c_str()), 0);
  start_fetch(1, &rc);
  EXPECT_EQ(rc, -EIO);
  fetch(2, &rc);
  EXPECT_EQ(rc, -EIO);
  EXPECT_EQ(tier->read_failures(), 2u);
  EXPECT_EQ(open_slabs(false), 0u);
}

TEST_F(NvmeTest, TheCapacityHoldsAsCopiesAreReservedWholeBlocks) {
  make(NvmeTier::Packing::kWhereItCan, 40 * 4096);
  size_t written = 0;
  for (size_t i = 0; i < tree.files() && offer(i); ++i) ++written;
  EXPECT_GE(written, 55u);  // ~2.5 KB each: ~64 fit in 40 blocks (40 if each took a block)
  EXPECT_LE(tier->used(), tier->capacity());
  EXPECT_LE(disk(), tier->capacity());
}

}  // namespace
}  // namespace clairfs
