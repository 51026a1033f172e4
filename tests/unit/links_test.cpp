// The peers' links over real TCP on this host: made from the cards alone, a goodbye told from a death,
// a killed process's link seen closed within a fraction of a second, and a stranger without the token
// never taken for a peer.
#include "peer/links.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

namespace clairfs {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Waits up to `limit` for `done`; how long it took, or nullopt.
std::optional<Clock::duration> within(Clock::duration limit, const std::function<bool()>& done) {
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < limit) {
    if (done()) return Clock::now() - t0;
    std::this_thread::sleep_for(1ms);
  }
  return std::nullopt;
}

TEST(PeerLinks, ThreeNodesLinkEveryPairAndAGoodbyeIsNoDeath) {
  PeerLinks a(0, 3), b(1, 3);
  std::optional<PeerLinks> c(std::in_place, 2, 3);
  const std::vector<std::vector<uint64_t>> cards{a.card(), b.card(), c->card()};
  a.start(cards), b.start(cards), c->start(cards);
  ASSERT_TRUE(within(5s, [&] { return a.made() == 2 && b.made() == 2 && c->made() == 2; }));
  c.reset();  // node 2 leaves: a goodbye on its links, then the close
  ASSERT_TRUE(within(2s, [&] { return a.left(2) && b.left(2); }));
  EXPECT_TRUE(within(2s, [&] { return a.made() == 1 && b.made() == 1; }));  // each still linked to the other
  EXPECT_FALSE(a.closed(2));
  EXPECT_FALSE(b.closed(2));
  EXPECT_EQ(a.closures(), 0u);
  EXPECT_FALSE(a.closed(1));
}

TEST(PeerLinks, AKilledProcesssLinkIsSeenClosedWithinAFractionOfASecond) {
  // Node 1 in a child process, the cards passed through pipes.
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const auto send_card = [](int fd, const std::vector<uint64_t>& card) {
    const uint64_t n = card.size();
    return write(fd, &n, sizeof n) == sizeof n &&
           write(fd, card.data(), n * sizeof(uint64_t)) == static_cast<ssize_t>(n * sizeof(uint64_t));
  };
  const auto take_card = [](int fd) {
    uint64_t n = 0;
    if (read(fd, &n, sizeof n) != sizeof n || n > 100) return std::vector<uint64_t>{};
    std::vector<uint64_t> card(n);
    if (read(fd, card.data(), n * sizeof(uint64_t)) != static_cast<ssize_t>(n * sizeof(uint64_t))) card.clear();
    return card;
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    PeerLinks mine(1, 2);
    if (!send_card(to_parent[1], mine.card())) _exit(1);
    const std::vector<uint64_t> theirs = take_card(to_child[0]);
    mine.start({theirs, mine.card()});
    for (;;) pause();  // until killed
  }
  PeerLinks links(0, 2);
  const std::vector<uint64_t> theirs = take_card(to_parent[0]);
  ASSERT_FALSE(theirs.empty());
  ASSERT_TRUE(send_card(to_child[1], links.card()));
  links.start({links.card(), theirs});
  const bool made = within(5s, [&] { return links.made() == 1; }).has_value();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(made);
  const auto took = within(2s, [&] { return links.closed(1); });
  ASSERT_TRUE(took);
  EXPECT_LT(*took, 250ms);
  EXPECT_EQ(links.closures(), 1u);
  EXPECT_FALSE(links.left(1));
  EXPECT_EQ(links.made(), 0);  // none standing
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

TEST(PeerLinks, AConnectionWithoutTheTokenIsNeverTakenForAPeer) {
  PeerLinks a(0, 2), b(1, 2);
  const std::vector<std::vector<uint64_t>> cards{a.card(), b.card()};
  // A stranger on this host connects to node 1's port and says it is node 0, with a wrong token.
  b.start({cards[0], cards[1]});
  const uint16_t port = static_cast<uint16_t>(cards[1][1]);
  const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(s, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  const uint64_t hello[2] = {0, cards[0][2] ^ 1};
  ASSERT_EQ(send(s, hello, sizeof hello, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof hello));
  char c;
  EXPECT_EQ(recv(s, &c, 1, 0), 0);  // closed, no ack
  close(s);
  EXPECT_EQ(b.made(), 0);
  // Node 0 itself, with the right token, is still taken after that.
  a.start({cards[0], cards[1]});
  EXPECT_TRUE(within(5s, [&] { return a.made() == 1 && b.made() == 1; }));
  EXPECT_FALSE(b.closed(0));
}

}  // namespace
}  // namespace clairfs
