#include "peer/links.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "util/log.hpp"

namespace clairfs {

// A peer's address, and what a node tells the others (PeerLinks::card).
namespace links_detail {
struct Address {
  sockaddr_storage sa{};
  socklen_t len = 0;
};
struct Card {
  uint16_t port = 0;
  uint64_t token = 0;
  std::vector<Address> addresses;
};
}  // namespace links_detail

namespace {

using links_detail::Address;
using links_detail::Card;
using Clock = std::chrono::steady_clock;

constexpr char kAck = 'A';      // the higher node's answer to a hello it took: the link is made
constexpr char kGoodbye = 'G';  // the daemon leaves: a close after it is no failure
constexpr uint64_t kCardVersion = 1;
// A card: version, port, token, address count, then three words an address: its family (AF_INET or
// AF_INET6), and an IPv4 address in the next word's low 32 bits (the third 0), or an IPv6 address's 16
// bytes in the two.
constexpr size_t kCardHead = 4;
constexpr size_t kAddressWords = 3;
constexpr size_t kMaxAddresses = 16;

enum State : uint8_t { kNone, kLinked, kLeft, kClosed };

std::string text_of(const Address& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.sa.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a.sa).sin_addr, host, sizeof host);
  else
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a.sa).sin6_addr, host, sizeof host);
  return host;
}

// This host's addresses a peer may reach it at: every interface that is up, loopback last (a peer on
// this host reaches that one too); IPv6 link-local ones left out (they need an interface to go by).
std::vector<Address> own_addresses(uint16_t port) {
  std::vector<Address> out, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    Address a;
    if (i->ifa_addr->sa_family == AF_INET) {
      auto& in = reinterpret_cast<sockaddr_in&>(a.sa);
      in = *reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      in.sin_port = htons(port);
      a.len = sizeof(sockaddr_in);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      auto& in6 = reinterpret_cast<sockaddr_in6&>(a.sa);
      in6 = *reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6.sin6_addr)) continue;
      in6.sin6_port = htons(port);
      in6.sin6_scope_id = 0;
      a.len = sizeof(sockaddr_in6);
    } else {
      continue;
    }
    ((i->ifa_flags & IFF_LOOPBACK) ? loopback : out).push_back(a);
  }
  freeifaddrs(list);
  out.insert(out.end(), loopback.begin(), loopback.end());
  if (out.size() > kMaxAddresses) out.resize(kMaxAddresses);
  return out;
}

void put(const Address& a, std::vector<uint64_t>& card) {
  card.push_back(a.sa.ss_family);
  if (a.sa.ss_family == AF_INET) {
    card.push_back(ntohl(reinterpret_cast<const sockaddr_in&>(a.sa).sin_addr.s_addr));
    card.push_back(0);
  } else {
    uint64_t w[2];
    std::memcpy(w, &reinterpret_cast<const sockaddr_in6&>(a.sa).sin6_addr, sizeof w);
    card.push_back(w[0]);
    card.push_back(w[1]);
  }
}

// A card as another node wrote it; nullopt if it cannot be read.
std::optional<Card> read_card(const std::vector<uint64_t>& w) {
  if (w.size() < kCardHead || w[0] != kCardVersion || w[1] == 0 || w[1] > 65535 || w[3] > kMaxAddresses ||
      w.size() != kCardHead + kAddressWords * w[3])
    return std::nullopt;
  Card c;
  c.port = static_cast<uint16_t>(w[1]);
  c.token = w[2];
  for (size_t k = 0; k < w[3]; ++k) {
    const uint64_t family = w[kCardHead + kAddressWords * k];
    const uint64_t a = w[kCardHead + kAddressWords * k + 1], b = w[kCardHead + kAddressWords * k + 2];
    Address addr;
    if (family == AF_INET) {
      if (a > UINT32_MAX || b != 0) return std::nullopt;
      auto& in = reinterpret_cast<sockaddr_in&>(addr.sa);
      in.sin_family = AF_INET;
      in.sin_port = htons(c.port);
      in.sin_addr.s_addr = htonl(static_cast<uint32_t>(a));
      addr.len = sizeof(sockaddr_in);
    } else if (family == AF_INET6) {
      auto& in6 = reinterpret_cast<sockaddr_in6&>(addr.sa);
      in6.sin6_family = AF_INET6;
      in6.sin6_port = htons(c.port);
      std::memcpy(&in6.sin6_addr, &a, sizeof a);
      std::memcpy(reinterpret_cast<char*>(&in6.sin6_addr) + sizeof a, &b, sizeof b);
      addr.len = sizeof(sockaddr_in6);
    } else {
      return std::nullopt;
    }
    c.addresses.push_back(addr);
  }
  return c;
}

int milliseconds_until(Clock::time_point t, Clock::time_point now) {
  return t <= now ? 0 : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(t - now).count());
}

}  // namespace

struct PeerLinks::Shared {
  UniqueFd listener, epoll, wake;
  uint16_t port = 0;
  uint64_t token = 0;
  std::vector<std::optional<Card>> cards;
  std::unique_ptr<std::atomic<uint8_t>[]> state;
  std::atomic<uint64_t> closures{0};
  std::atomic<bool> stop{false};
};

PeerLinks::PeerLinks(int node, int nodes) : node_(node), nodes_(nodes), shared_(std::make_unique<Shared>()) {
  Shared& s = *shared_;
  s.state.reset(new std::atomic<uint8_t>[static_cast<size_t>(nodes)]);
  for (int i = 0; i < nodes; ++i) s.state[static_cast<size_t>(i)] = kNone;
  while (s.token == 0)
    if (getrandom(&s.token, sizeof s.token, 0) != static_cast<ssize_t>(sizeof s.token))
      throw std::runtime_error(std::string("no random token for the peer links: ") + std::strerror(errno));
  // One socket for IPv4 and IPv6 where the host has IPv6, else IPv4 alone.
  int family = AF_INET6;
  s.listener = UniqueFd(::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.listener)
    family = AF_INET, s.listener = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.listener) throw std::runtime_error(std::string("no socket for the peer links: ") + std::strerror(errno));
  sockaddr_storage any{};
  socklen_t len;
  if (family == AF_INET6) {
    const int off = 0;
    setsockopt(s.listener.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    reinterpret_cast<sockaddr_in6&>(any).sin6_family = AF_INET6;  // any address, a port the kernel picks
    len = sizeof(sockaddr_in6);
  } else {
    reinterpret_cast<sockaddr_in&>(any).sin_family = AF_INET;
    len = sizeof(sockaddr_in);
  }
  if (::bind(s.listener.get(), reinterpret_cast<sockaddr*>(&any), len) != 0 ||
      ::listen(s.listener.get(), SOMAXCONN) != 0 ||
      ::getsockname(s.listener.get(), reinterpret_cast<sockaddr*>(&any), &len) != 0)
    throw std::runtime_error(std::string("cannot listen for the peer links: ") + std::strerror(errno));
  s.port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(any).sin6_port
                                    : reinterpret_cast<sockaddr_in&>(any).sin_port);
  s.epoll = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  s.wake = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!s.epoll || !s.wake)
    throw std::runtime_error(std::string("no epoll for the peer links: ") + std::strerror(errno));
}

PeerLinks::~PeerLinks() {
  shared_->stop = true;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(shared_->wake.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

std::vector<uint64_t> PeerLinks::card() const {
  const std::vector<Address> mine = own_addresses(shared_->port);
  std::vector<uint64_t> c{kCardVersion, shared_->port, shared_->token, mine.size()};
  for (const Address& a : mine) put(a, c);
  return c;
}

void PeerLinks::start(const std::vector<std::vector<uint64_t>>& cards) {
  shared_->cards.resize(static_cast<size_t>(nodes_));
  for (int i = 0; i < nodes_ && i < static_cast<int>(cards.size()); ++i)
    if (i != node_) shared_->cards[static_cast<size_t>(i)] = read_card(cards[static_cast<size_t>(i)]);
  thread_ = std::thread([this] { run(); });
}

bool PeerLinks::closed(int node) const {
  return node >= 0 && node < nodes_ && shared_->state[static_cast<size_t>(node)].load() == kClosed;
}
bool PeerLinks::left(int node) const {
  return node >= 0 && node < nodes_ && shared_->state[static_cast<size_t>(node)].load() == kLeft;
}
uint64_t PeerLinks::closures() const { return shared_->closures.load(); }

// The thread: every socket is nonblocking and watched by one epoll; each has a role.
void PeerLinks::run() {
  Shared& s = *shared_;
  struct Socket {
    // kDialing: connecting to a higher node; kHeard: its hello sent, waiting for the ack; kShowing: a
    // lower node's connection, waiting for its hello; kLink: made.
    enum Role { kDialing, kHeard, kShowing, kLink } role;
    int node = -1;  // the peer (kShowing: not known until its token is read)
    UniqueFd fd;
    size_t tried = 0;  // kDialing: the address tried
    Clock::time_point deadline;
    char got[16] = {};  // kShowing: what came of the 16 bytes
    size_t have = 0;
  };
  std::unordered_map<int, Socket> sockets;  // by fd
  size_t pending = 0;                       // kShowing ones
  const auto watch = [&](int fd, uint32_t events, bool again) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    epoll_ctl(s.epoll.get(), again ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
  };
  const auto drop = [&](int fd) {
    epoll_ctl(s.epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
    if (sockets.at(fd).role == Socket::kShowing) --pending;
    if (sockets.at(fd).role == Socket::kLink) made_--;
    sockets.erase(fd);  // closes it
  };
  const auto linked = [&](Socket& k, int node) {
    k.role = Socket::kLink;
    k.node = node;
    s.state[static_cast<size_t>(node)] = kLinked;
    made_++;
    watch(k.fd.get(), EPOLLIN | EPOLLRDHUP, true);
  };
  // Dials `node` at its next address; false when none is left.
  const auto dial = [&](int node, size_t from) {
    const Card& c = *s.cards[static_cast<size_t>(node)];
    for (size_t a = from; a < c.addresses.size(); ++a) {
      const Address& addr = c.addresses[a];
      UniqueFd fd(::socket(addr.sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      if (!fd) continue;
      const int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.sa), addr.len);
      if (rc != 0 && errno != EINPROGRESS) continue;
      const int f = fd.get();
      Socket k{Socket::kDialing, node, std::move(fd), a, Clock::now() + std::chrono::milliseconds(kConnectMs)};
      sockets.emplace(f, std::move(k));
      watch(f, EPOLLOUT, false);
      return true;
    }
    std::string where;
    for (const Address& addr : c.addresses) where += (where.empty() ? "" : ", ") + text_of(addr);
    log_warning("no link to peer node " + std::to_string(node) + " (port " + std::to_string(c.port) + " at " +
                (where.empty() ? "no address" : where) + "): its death is found by pings alone");
    return false;
  };
  // A socket that failed or took too long goes; a dial then tries the node's next address.
  const auto give_up = [&](int fd) {
    const Socket& k = sockets.at(fd);
    const bool dialing = k.role == Socket::kDialing || k.role == Socket::kHeard;
    const int node = k.node;
    const size_t next = k.tried + 1;
    drop(fd);
    if (dialing) dial(node, next);
  };
  watch(s.listener.get(), EPOLLIN, false);
  watch(s.wake.get(), EPOLLIN, false);
  for (int j = node_ + 1; j < nodes_; ++j)
    if (s.cards[static_cast<size_t>(j)]) dial(j, 0);

  epoll_event events[32];
  while (!s.stop.load()) {
    const Clock::time_point now = Clock::now();
    int wait = -1;
    for (auto& [fd, k] : sockets)
      if (k.role != Socket::kLink)
        wait = wait < 0 ? milliseconds_until(k.deadline, now) : std::min(wait, milliseconds_until(k.deadline, now));
    const int n = ::epoll_wait(s.epoll.get(), events, 32, wait);
    if (n < 0 && errno != EINTR) {
      log_warning(std::string("the peer links stopped (epoll: ") + std::strerror(errno) +
                  "): deaths are found by pings alone");
      return;
    }
    for (int e = 0; e < std::max(n, 0); ++e) {
      const int fd = events[e].data.fd;
      if (fd == s.wake.get()) continue;
      if (fd == s.listener.get()) {
        for (;;) {
          const int in = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (in < 0) break;
          if (pending >= kMaxPending) {
            ::close(in);
            continue;
          }
          Socket k{Socket::kShowing, -1, UniqueFd(in), 0, Clock::now() + std::chrono::milliseconds(kHandshakeMs)};
          sockets.emplace(in, std::move(k));
          ++pending;
          watch(in, EPOLLIN | EPOLLRDHUP, false);
        }
        continue;
      }
      auto it = sockets.find(fd);
      if (it == sockets.end()) continue;
      Socket& k = it->second;
      if (k.role == Socket::kDialing) {
        int error = 0;
        socklen_t elen = sizeof error;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &elen);
        const uint64_t hello[2] = {static_cast<uint64_t>(node_), s.cards[static_cast<size_t>(k.node)]->token};
        if (error == 0 && ::send(fd, hello, sizeof hello, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof hello)) {
          k.role = Socket::kHeard;  // (a close before the ack is no death: the other may be busy, or not it)
          k.deadline = Clock::now() + std::chrono::milliseconds(kHandshakeMs);
          watch(fd, EPOLLIN | EPOLLRDHUP, true);
        } else {
          give_up(fd);
        }
      } else if (k.role == Socket::kHeard) {
        char buf[64];
        const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
        if (got < 0 && errno == EAGAIN) continue;
        if (got > 0 && buf[0] == kAck) {
          linked(k, k.node);
          if (std::memchr(buf + 1, kGoodbye, static_cast<size_t>(got - 1)))
            s.state[static_cast<size_t>(k.node)] = kLeft;
        } else {
          give_up(fd);
        }
      } else if (k.role == Socket::kShowing) {
        const ssize_t got = ::recv(fd, k.got + k.have, sizeof k.got - k.have, 0);
        if (got <= 0) {
          if (got < 0 && errno == EAGAIN) continue;
          drop(fd);
          continue;
        }
        k.have += static_cast<size_t>(got);
        if (k.have < sizeof k.got) continue;
        uint64_t hello[2];
        std::memcpy(hello, k.got, sizeof hello);
        // A lower node, this node's token, and no link from it yet: a peer's. Anything else is not.
        if (hello[0] < static_cast<uint64_t>(node_) && hello[1] == s.token &&
            s.state[static_cast<size_t>(hello[0])].load() == kNone && ::send(fd, &kAck, 1, MSG_NOSIGNAL) == 1) {
          --pending;
          linked(k, static_cast<int>(hello[0]));
        } else {
          drop(fd);
        }
      } else {
        // A link carries nothing but a goodbye; its end is a close.
        char buf[64];
        ssize_t got;
        while ((got = ::recv(fd, buf, sizeof buf, 0)) > 0)
          if (std::memchr(buf, kGoodbye, static_cast<size_t>(got))) s.state[static_cast<size_t>(k.node)] = kLeft;
        if (got < 0 && errno == EAGAIN) continue;
        if (s.state[static_cast<size_t>(k.node)].load() != kLeft) {
          s.state[static_cast<size_t>(k.node)] = kClosed;
          s.closures++;
        }
        drop(fd);
      }
    }
    // Dials and handshakes that took too long.
    const Clock::time_point after = Clock::now();
    std::vector<int> late;
    for (auto& [fd, k] : sockets)
      if (k.role != Socket::kLink && after >= k.deadline) late.push_back(fd);
    for (int fd : late) {
      give_up(fd);
    }
  }
  // The end: a goodbye on every link, then the close.
  // (Also where the hello went and the ack has not come: the other side may have taken it.)
  for (auto& [fd, k] : sockets) {
    if (k.role != Socket::kLink && k.role != Socket::kHeard) continue;
    if (::send(fd, &kGoodbye, 1, MSG_NOSIGNAL) != 1)
      log_debug("no goodbye on the link to peer node " + std::to_string(k.node) + ": " + std::strerror(errno));
  }
  sockets.clear();
}

}  // namespace clairfs
