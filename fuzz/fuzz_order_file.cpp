// libFuzzer target: the order-file reader (order=list). Any input ends in an order or a UsageError naming
// the line; never a crash. Samples are named s0 .. s9.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "clairfs/oracle.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  auto resolve = [](const std::string& path) -> int64_t {
    return path.size() == 2 && path[0] == 's' && path[1] >= '0' && path[1] <= '9' ? path[1] - '0' : -1;
  };
  try {
    const clairfs::OrderList list = clairfs::parse_order_stream(in, "fuzz", 10, 3, resolve);
    for (const auto& section : list.sections) (void)section.first_epoch;
  } catch (const clairfs::UsageError&) {
  }
  return 0;
}
