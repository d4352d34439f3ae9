// SocketTransport's data path (the caller's thread): set-up, slots, waits, abort. The progress
// thread that moves the bytes is in socket_progress.cc.
#include "tcp/socket_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <type_traits>

#include "ringcomm/error.h"
#include "ringcomm/interrupt.h"
#include "ringcomm/types.h"

namespace ringcomm {

static_assert(std::is_trivially_copyable_v<SocketTransport::Frame> &&
                  std::is_trivially_copyable_v<SocketTransport::Hello>,
              "frames go on the wire as they are");

namespace {

// Waits wake this often to ask the interrupt hook (the hook wants no lock of ours held).
constexpr auto kWaitSlice = std::chrono::milliseconds(200);

}  // namespace

SocketTransport::SocketTransport(int rank, int worldSize, SocketOptions options,
                                 const std::string& listenHost)
    : rank_(rank), worldSize_(worldSize), options_(options), traffic_(std::max(worldSize, 0)) {
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

void SocketTransport::checkPeer(int peer) const {
  RC_CHECK(peer >= 0 && peer < worldSize_, "peer ", peer, " is not a rank of this ", worldSize_,
           "-rank communicator");
  RC_CHECK(peer != rank_, "rank ", rank_, " cannot send to or receive from itself");
}

std::string SocketTransport::describePeer(int peer) const {
  if (addresses_.empty()) return detail::concat("rank ", peer);
  return detail::concat("rank ", peer, " (", labels_[peer], ", ", formatAddress(addresses_[peer]),
                        ")");
}

void SocketTransport::wake() {
  if (!polling_) return;
  const uint64_t one = 1;
  ssize_t ignored = ::write(wakeFd_.fd(), &one, sizeof(one));
  (void)ignored;
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

void SocketTransport::throwAborted() const {
  RC_THROW_AS(PeerError, "the ring was aborted: ", abortReason_);
}

template <typename Ready, typename Before, typename After, typename What>
void SocketTransport::waitFor(std::unique_lock<std::mutex>& lock, int peer, Ready ready,
                              Before before, After after, What what) {
  const Link& link = *links_[peer];
  auto failures = [&] {
    if (aborted_.load()) throwAborted();
    if (!link.abortedBy.empty())
      RC_THROW_AS(PeerError, describePeer(peer), " aborted: ", link.abortedBy);
    before();
  };
  failures();
  if (ready()) return;
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(options_.timeoutSeconds));
  auto asked = start;
  while (true) {
    changed_.wait_until(lock, std::min(deadline, Clock::now() + kWaitSlice));
    failures();
    if (ready()) break;
    after();
    const auto now = Clock::now();
    if (now >= deadline)
      RC_THROW_AS(TimeoutError, "timed out after ", options_.timeoutSeconds,
                  " s waiting for ", describePeer(peer), " to ", what());
    // Not at every wake-up (other peers' messages wake this wait too): the hook may take the
    // interpreter's lock.
    if (now - asked < kWaitSlice / 4) continue;
    asked = now;
    lock.unlock();
    const bool stop = interruptRequested();
    lock.lock();
    if (stop)
      RC_THROW_AS(InterruptedError, "interrupted by a signal while waiting for ",
                  describePeer(peer), " to ", what());
  }
  traffic_.waits()->note(WaitStats::kSleeping, Clock::now() - start);
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
    const Hello hello{kMagic, rank_, worldSize_, i, options_.connectionsPerPeer};
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

void* SocketTransport::acquireSend(int peer, size_t bytes) {
  checkPeer(peer);
  RC_CHECK(bytes <= options_.slotBytes, "a ", bytes, "-byte message exceeds the ",
           options_.slotBytes, "-byte slots");
  ensureOutgoing(peer);
  std::unique_lock<std::mutex> lock(mutex_);
  Link& link = *links_[peer];
  const size_t slot = link.committed % options_.slotCount;
  waitFor(
      lock, peer, [&] { return link.sendBusy[slot] == 0; },
      [&] {
        if (!link.sendFailure.empty()) RC_THROW_AS(PeerError, link.sendFailure);
      },
      [] {},
      [&] {
        return detail::concat("take messages (all ", options_.slotCount,
                              " send slots to it hold unsent messages)");
      });
  return link.sendSlots.data() + slot * options_.slotBytes;
}

void SocketTransport::commitSend(int peer, const Envelope& envelope) {
  RC_CHECK(envelope.bytes <= options_.slotBytes, "a ", envelope.bytes,
           "-byte message exceeds the ", options_.slotBytes, "-byte slots");
  {
    std::unique_lock<std::mutex> lock(mutex_);
    Link& link = *links_[peer];
    Connection& c = *link.out[link.committed % options_.connectionsPerPeer];
    const size_t slot = link.committed % options_.slotCount;
    Frame& frame = link.sendFrames[slot];
    std::memset(static_cast<void*>(&frame), 0, sizeof(frame));  // no stray bytes on the wire
    frame.magic = kMagic;
    frame.kind = kData;
    frame.index = link.committed++;
    frame.payloadBytes = envelope.bytes;
    frame.envelope = envelope;
    link.sendBusy[slot] = 1;
    // Straight into the socket when it takes it; the progress thread writes what is left.
    if (!aborted_.load()) writeTo(c, lock);
    if (writePending(c)) wake();
  }
  traffic_.sent(peer, envelope.bytes);
}

const void* SocketTransport::acquireRecv(int peer, const Envelope& expected) {
  checkPeer(peer);
  std::unique_lock<std::mutex> lock(mutex_);
  Link& link = *links_[peer];
  const uint64_t message = link.consumed;
  const size_t slot = message % options_.slotCount;
  const size_t connection = message % options_.connectionsPerPeer;
  waitFor(
      lock, peer, [&] { return !link.recvFull.empty() && link.recvFull[slot]; }, [] {},
      [&] {
        // Messages sent before the connection closed are still read; this one was not sent.
        if (!link.inClosed.empty() && !link.inClosed[connection].empty())
          RC_THROW_AS(PeerError, link.inClosed[connection],
                      " while this rank waits for it to send ", describeEnvelope(expected));
        // A peer that went away before it connected back shows on this rank's connections.
        const bool connected = !link.inConnected.empty() && link.inConnected[connection];
        if (!connected && !link.sendFailure.empty())
          RC_THROW_AS(PeerError, link.sendFailure,
                      " while this rank waits for it to connect and send ",
                      describeEnvelope(expected));
      },
      [&] {
        const bool connected = !link.inConnected.empty() && link.inConnected[connection];
        return detail::concat(connected ? "send " : "connect and send ",
                              describeEnvelope(expected));
      });
  checkEnvelope(peer, link.recvEnvelopes[slot], expected);
  lock.unlock();
  traffic_.received(peer, expected.bytes);
  return link.recvSlots.data() + slot * options_.slotBytes;
}

void SocketTransport::releaseRecv(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  Link& link = *links_[peer];
  link.recvFull[link.consumed % options_.slotCount] = 0;
  ++link.consumed;
  wake();
}

std::optional<int> SocketTransport::arrivedTag(int peer) const {
  checkPeer(peer);
  std::lock_guard<std::mutex> lock(mutex_);
  const Link& link = *links_[peer];
  const size_t slot = link.consumed % options_.slotCount;
  if (link.recvFull.empty() || !link.recvFull[slot]) return std::nullopt;
  const Envelope& next = link.recvEnvelopes[slot];
  if (next.collective != static_cast<int32_t>(Collective::SendRecv)) return std::nullopt;
  return next.root;  // point-to-point envelopes carry the tag as their root
}

void SocketTransport::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!aborted_.load()) {
    abortReason_ = detail::concat("rank ", rank_, " failed: ", why);
    aborted_.store(true);
  }
  changed_.notify_all();
  wake();
}

}  // namespace ringcomm
