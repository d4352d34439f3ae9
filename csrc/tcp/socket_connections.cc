// SocketTransport's set-up and tear-down: the listener and the progress thread, the peers'
// addresses, a pair's slots (allocated when it first talks), and the connections this rank makes
// to a peer at its first send to it, each greeted with a Hello that carries the secret.
#include "tcp/socket_transport.h"

#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ringcomm/error.h"
#include "ringcomm/interrupt.h"

namespace ringcomm {

SocketTransport::SocketTransport(int rank, int worldSize, SocketOptions options,
                                 const std::string& listenHost, const std::string& secret)
    : rank_(rank), worldSize_(worldSize), options_(options), secret_(secret),
      traffic_(std::max(worldSize, 0)) {
  RC_CHECK(secret.size() == kSecretBytes, "the communicator's secret must be ", kSecretBytes,
           " bytes, not ", secret.size());
  RC_CHECK(worldSize >= 1 && rank >= 0 && rank < worldSize, "rank ", rank,
           " is outside the world of ", worldSize, " ranks");
  RC_CHECK(options.slotBytes >= 8, "socket slots must hold at least 8 bytes, not ",
           options.slotBytes);
  RC_CHECK(options.slotCount >= 2, "a socket link needs at least 2 slots, not ",
           options.slotCount);
  RC_CHECK(options.connectionsPerPeer >= 1 && options.connectionsPerPeer <= 64,
           "connections per peer must be 1 to 64, not ", options.connectionsPerPeer);
  RC_CHECK(options.timeoutSeconds > 0, "the timeout must be positive, not ",
           options.timeoutSeconds);
  listener_ = listenOn(listenHost, address_);
  wakeFd_ = Socket(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  RC_CHECK(wakeFd_.valid(), "cannot create an eventfd: ", std::strerror(errno));
  for (int peer = 0; peer < worldSize; ++peer) links_.push_back(std::make_unique<Link>());
  progress_ = std::thread([this] { progressLoop(); });
}

SocketTransport::~SocketTransport() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // Sends already committed still go out (a send returns once handed over), for up to the
    // timeout; after an abort only the abort frames, briefly.
    const auto linger = std::chrono::duration<double>(
        aborted_ ? std::min(options_.timeoutSeconds, 1.0) : options_.timeoutSeconds);
    lingerUntil_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(linger);
    polling_ = true;  // wake it whatever it does
    wake();
  }
  progress_.join();
}

void SocketTransport::connect(const std::vector<std::string>& addresses,
                              const std::vector<std::string>& labels) {
  RC_CHECK(addresses.size() == static_cast<size_t>(worldSize_) && labels.size() == addresses.size(),
           "connect needs an address and a label for each of the ", worldSize_, " ranks, got ",
           addresses.size(), " and ", labels.size());
  RC_CHECK(addresses[rank_] == address_, "rank ", rank_, "'s entry is ", addresses[rank_],
           ", not its own address ", address_);
  std::vector<sockaddr_in> parsed;
  for (int r = 0; r < worldSize_; ++r)
    parsed.push_back(parseAddress(addresses[r], detail::concat("rank ", r, "'s address").c_str()));
  std::lock_guard<std::mutex> lock(mutex_);
  addresses_ = std::move(parsed);
  labels_ = labels;
}

std::string SocketTransport::describePeer(int peer) const {
  if (addresses_.empty()) return detail::concat("rank ", peer);
  return detail::concat("rank ", peer, " (", labels_[peer], ", ", formatAddress(addresses_[peer]),
                        ")");
}

void SocketTransport::allocateSend(Link& link) {
  if (!link.sendBusy.empty()) return;
  link.sendSlots.resize(options_.slotBytes * options_.slotCount);
  link.sendFrames.resize(options_.slotCount);
  link.sendBusy.assign(options_.slotCount, 0);
}

void SocketTransport::allocateRecv(Link& link) {
  if (!link.recvFull.empty()) return;
  link.recvSlots.resize(options_.slotBytes * options_.slotCount);
  link.recvEnvelopes.resize(options_.slotCount);
  link.recvFull.assign(options_.slotCount, 0);
}

void SocketTransport::ensureOutgoing(int peer) {
  sockaddr_in where{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (links_[peer]->outgoing) return;
    if (aborted_.load()) throwAborted();
    RC_CHECK(!addresses_.empty(), "rank ", rank_,
             " sends before connect(): it does not know the peers' addresses yet");
    where = addresses_[peer];
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options_.timeoutSeconds));
  auto check = [&] {
    if (aborted_.load()) {
      std::lock_guard<std::mutex> lock(mutex_);
      throwAborted();
    }
    if (interruptRequested())
      RC_THROW_AS(InterruptedError, "interrupted by a signal while connecting to ",
                  describePeer(peer));
  };
  std::vector<std::unique_ptr<Connection>> made;
  for (uint32_t i = 0; i < options_.connectionsPerPeer; ++i) {
    std::string lastError = "no attempt";
    Socket socket = connectBefore(where, deadline, check, lastError);
    if (!socket.valid())
      RC_THROW_AS(TimeoutError, "timed out after ", options_.timeoutSeconds, " s connecting to ",
                  describePeer(peer), " (connection ", i, "): ", lastError);
    // A fresh connection's send buffer is empty: the hello goes out whole at once.
    Hello hello{kMagic, rank_, worldSize_, i, options_.connectionsPerPeer, {}};
    std::memcpy(hello.secret, secret_.data(), kSecretBytes);
    iovec part{const_cast<Hello*>(&hello), sizeof(hello)};
    int error = 0;
    if (writeSome(socket.fd(), &part, 1, error) != static_cast<ssize_t>(sizeof(hello)))
      RC_THROW_AS(PeerError, "cannot greet ", describePeer(peer), ": ",
                  error ? std::strerror(error) : "short write");
    auto c = std::make_unique<Connection>();
    c->socket = std::move(socket);
    c->peer = peer;
    c->index = i;
    c->outgoing = c->greeted = true;
    c->next = i;
    made.push_back(std::move(c));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Link& link = *links_[peer];
  allocateSend(link);
  link.outgoing = true;
  for (auto& c : made) {
    link.out.push_back(c.get());
    adopted_.push_back(std::move(c));
  }
  wake();
}

}  // namespace ringcomm
