// SocketTransport's data path (the caller's thread): slots taken and released, the waits for
// them, abort. Set-up, the connections to peers and tear-down are in socket_connections.cc; the
// progress thread that moves the bytes is in socket_progress.cc.
#include "tcp/socket_transport.h"

#include <algorithm>
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

void SocketTransport::checkPeer(int peer) const {
  RC_CHECK(peer >= 0 && peer < worldSize_, "peer ", peer, " is not a rank of this ", worldSize_,
           "-rank communicator");
  RC_CHECK(peer != rank_, "rank ", rank_, " cannot send to or receive from itself");
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
  const uint64_t freed = link.consumed++;
  link.recvFull[freed % options_.slotCount] = 0;
  // Only message `freed + slotCount` can have been held up for want of this slot (the progress
  // thread stops reading a connection there), and only once the message before it on the same
  // connection was read. Waking the thread for nothing costs every message a thread hand-over,
  // on a crowded machine a wait for a core.
  const uint64_t held = freed + options_.slotCount;
  const uint64_t connections = options_.connectionsPerPeer;
  const bool previousRead = held < connections + link.consumed ||
                            link.recvFull[(held - connections) % options_.slotCount];
  if (previousRead) wake();
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
