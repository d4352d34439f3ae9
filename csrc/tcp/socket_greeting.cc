// SocketTransport's incoming connections until they count as a peer's: accepted, read up to
// their Hello, checked, or dropped (and logged) before they touch any link. Runs on the progress
// thread under the transport's lock, at connect time only: the data path never comes here.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ringcomm/error.h"
#include "tcp/constant_time.h"
#include "tcp/socket_transport.h"

namespace ringcomm {
namespace {

// Drops are logged from a budget of kLogBurst lines that refills at kLogPerSecond: every one of
// a few hundred strangers is named, and a flood cannot fill a disk.
constexpr double kLogBurst = 500, kLogPerSecond = 10;

}  // namespace

uint64_t SocketTransport::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

void SocketTransport::acceptAll() {
  const auto wait = std::min(options_.timeoutSeconds, kHelloSeconds);
  const auto helloWithin = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(wait));
  // At most a queue's worth per round: the loop then reads the Hellos of those accepted.
  for (size_t i = 0; i < kMaxAwaitingHello; ++i) {
    sockaddr_in from{};
    int error = 0;
    Socket socket = acceptPending(listener_, from, error);
    if (!socket.valid()) {
      // Out of descriptors: the listener stays readable, so pause accepting instead of spinning.
      if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM)
        acceptAfter_ = Clock::now() + std::chrono::milliseconds(100);
      return;
    }
    // A full queue lets the oldest go: a flood cannot keep a real peer's Hello from being read.
    Connection* oldest = nullptr;
    size_t awaiting = 0;
    for (auto& c : connections_) {
      if (c->dead || c->greeted) continue;
      ++awaiting;
      if (!oldest || c->helloBy < oldest->helloBy) oldest = c.get();
    }
    if (awaiting >= kMaxAwaitingHello)
      drop(*oldest, detail::concat("it was the oldest of ", awaiting,
                                   " connections awaiting their hello"));
    auto c = std::make_unique<Connection>();
    c->socket = std::move(socket);
    c->from = formatAddress(from);
    c->helloBy = Clock::now() + helloWithin;
    c->readState = Connection::kHello;
    connections_.push_back(std::move(c));
  }
}

void SocketTransport::dropUngreeted(Clock::time_point now) {
  for (auto& c : connections_)
    if (!c->dead && !c->greeted && now >= c->helloBy)
      drop(*c, detail::concat("no complete hello within ",
                              std::min(options_.timeoutSeconds, kHelloSeconds), " s"));
}

void SocketTransport::greeted(Connection& c) {
  const Hello& h = c.hello;
  if (h.magic != kMagic) return drop(c, "its hello has the wrong magic");
  if (!constantTimeEqual(h.secret, secret_.data(), kSecretBytes))
    return drop(c, detail::concat("its hello (as rank ", h.rank,
                                  ") lacks this communicator's secret"));
  if (h.rank < 0 || h.rank >= worldSize_ || h.rank == rank_)
    return drop(c, detail::concat("its hello names rank ", h.rank, ", not a peer in this ",
                                  worldSize_, "-rank world"));
  const uint32_t count = options_.connectionsPerPeer;
  Link& link = *links_[h.rank];
  if (h.connection < count && !link.inConnected.empty() && link.inConnected[h.connection])
    return drop(c, detail::concat("rank ", h.rank, "'s connection ", h.connection,
                                  " is connected already"));
  allocateRecv(link);
  if (link.inConnected.empty()) {
    link.inConnected.assign(count, 0);
    link.inClosed.assign(count, std::string());
  }
  c.peer = h.rank;
  c.index = h.connection < count ? h.connection : 0;
  c.greeted = true;
  c.next = c.index;
  c.readState = Connection::kHeader;
  // It knows the secret: a rank of this communicator set up otherwise, a failure of its link.
  if (h.worldSize != worldSize_ || h.connections != count || h.connection >= count) {
    return lost(c, detail::concat("connected as connection ", h.connection, " of ",
                                  h.connections, " in a world of ", h.worldSize,
                                  " ranks (this rank has ", worldSize_, " ranks and ", count,
                                  " connections per peer)"));
  }
  link.inConnected[c.index] = 1;
  changed_.notify_all();
}

void SocketTransport::drop(Connection& c, const std::string& why) {
  c.dead = true;  // its socket closes when the loop drops it; no link saw it
  ++dropped_;
  if (!options_.logDrops) return;
  const auto now = Clock::now();
  const double refill = kLogPerSecond * std::chrono::duration<double>(now - loggedAt_).count();
  logBudget_ = dropped_ == 1 ? kLogBurst : std::min(kLogBurst, logBudget_ + refill);
  loggedAt_ = now;
  if (logBudget_ < 1) {
    ++unlogged_;
    return;
  }
  logBudget_ -= 1;
  dropLog_.push_back(detail::concat(
      "rank ", rank_, " of ", worldSize_, " (listening on ", address_,
      ") dropped a connection from ", c.from, ": ", why,
      unlogged_ ? detail::concat(" (and ", unlogged_, " more since the last line)") : ""));
  unlogged_ = 0;
}

// The same shape as the Python logger's lines (ringcomm/observe/log.py), written straight to
// stderr: this thread never takes the interpreter's lock.
void SocketTransport::writeDropLog(std::vector<std::string>& lines) const {
  if (lines.empty()) return;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  for (const auto& line : lines)
    std::fprintf(stderr, "%s:%d ringcomm INFO %s\n", host, static_cast<int>(getpid()),
                 line.c_str());
  std::fflush(stderr);
  lines.clear();
}

}  // namespace ringcomm
