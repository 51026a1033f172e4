// The io_uring Ring against real files: a read asked for with a length past 4 GiB is not cut short,
// and an open of a FIFO does not wait for a writer.
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

// A read asked for with a length past 4 GiB reads all the file has: the length was once cut to 32 bits,
// and 4 GiB + 8 KiB read as 8 KiB. The buffer is 4 GiB + 8 KiB of address space of which the kernel
// writes only the file's 16 KiB (backing the whole buffer took over 30 s on a fresh VM).
TEST(Ring, ALengthPastFourGiBIsNotCutTo32Bits) {
  TempDir dir;
  const std::string file = dir.path() + "/small";
  constexpr size_t kFile = 16384;
  constexpr size_t kLength = (size_t{4} << 30) + 8192;  // as 32 bits: 8192
  {
    UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd);
    std::string bytes(kFile, 't');
    ASSERT_EQ(::write(fd.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(kFile));
  }
  void* mem = ::mmap(nullptr, kLength, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  char* buf = static_cast<char*>(mem);
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  Ring ring(4);
  ring.submit(fd.get(), buf, kLength, 7);
  auto done = wait_for(ring, std::chrono::seconds(30));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, 7u);
  EXPECT_EQ(done[0].result, static_cast<int64_t>(kFile));  // was 8192
  EXPECT_EQ(std::count(buf, buf + kFile, 't'), static_cast<std::ptrdiff_t>(kFile));
  ::munmap(mem, kLength);
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
