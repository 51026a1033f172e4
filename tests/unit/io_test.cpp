// The io_uring Ring against real files: a read longer than one request can ask for (4 GiB) is done
// whole, and an open of a FIFO does not wait for a writer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "io/uring.hpp"
#include "util/fs.hpp"

namespace clairfs {
namespace {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/var/tmp/clairfs-io-test-XXXXXX";
    path_ = ::mkdtemp(pattern);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<Ring::Completion> wait_for(Ring& ring, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    auto done = ring.reap_for(std::chrono::milliseconds(100));
    if (!done.empty()) return done;
  }
  return {};
}

TEST(Ring, ReadsAFileLongerThanFourGiBWhole) {
  TempDir dir;
  const std::string file = dir.path() + "/big";
  constexpr size_t kTail = 8192;
  constexpr size_t kSize = (size_t{4} << 30) + kTail;  // sparse: 4 GiB of holes, then the tail
  {
    UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd);
    std::string tail(kTail, 't');
    ASSERT_EQ(::pwrite(fd.get(), tail.data(), tail.size(), static_cast<off_t>(kSize - kTail)), static_cast<ssize_t>(kTail));
  }
  void* mem = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  (void)::madvise(mem, kSize, MADV_HUGEPAGE);  // 2 MiB faults, not a million 4 KiB ones
  char* buf = static_cast<char*>(mem);
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  Ring ring(4);
  ring.submit(fd.get(), buf, kSize, 7);
  auto done = wait_for(ring, std::chrono::seconds(120));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, 7u);
  EXPECT_EQ(done[0].result, static_cast<int64_t>(kSize));  // was 8192: the length cut to 32 bits
  EXPECT_EQ(buf[0], '\0');
  EXPECT_EQ(buf[(size_t{4} << 30) - 1], '\0');
  EXPECT_EQ(std::count(buf + kSize - kTail, buf + kSize, 't'), static_cast<std::ptrdiff_t>(kTail));
  ::munmap(mem, kSize);
}

TEST(Ring, OpensAFifoWithoutWaitingForAWriter) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir.path() + "/pipe").c_str(), 0600), 0);
  UniqueFd root(::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  Ring ring(4);
  ring.submit_open(root.get(), "pipe", 3);
  auto done = wait_for(ring, std::chrono::seconds(10));
  ASSERT_EQ(done.size(), 1u) << "the open of a FIFO still waits for a writer";
  ASSERT_GE(done[0].result, 0);
  UniqueFd opened(static_cast<int>(done[0].result));
  struct stat st {};
  ASSERT_EQ(::fstat(opened.get(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));  // what the caller checks before reading
}

}  // namespace
}  // namespace clairfs
