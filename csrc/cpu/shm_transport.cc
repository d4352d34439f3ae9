#include "cpu/shm_transport.h"

#include "ringcomm/error.h"

namespace ringcomm {

ShmTransport::ShmTransport(int rank, int worldSize, ShmOptions options)
    : rank_(rank),
      worldSize_(worldSize),
      next_((rank + 1) % worldSize),
      prev_((rank + worldSize - 1) % worldSize),
      options_(options) {
  RC_CHECK(options.slotBytes >= 64, "shared-memory slots must hold at least 64 bytes");
  if (worldSize > 1) outgoing_ = ShmChannel::create(options.slotBytes, options.slotCount, rank);
}

void ShmTransport::connect(const std::string& predecessorChannel) {
  if (worldSize_ == 1) return;
  RC_CHECK(!incoming_.valid(), "this shared-memory transport is already connected");
  incoming_ = ShmChannel::attach(predecessorChannel);
}

void ShmTransport::checkPeer(int peer, int expected, const char* role) const {
  RC_CHECK(peer == expected, "the shared-memory ring only ", role, " rank ", expected,
           ", not rank ", peer);
  RC_CHECK(incoming_.valid(), "the shared-memory transport is not connected");
}

void* ShmTransport::acquireSend(int peer, size_t bytes) {
  checkPeer(peer, next_, "sends to");
  RC_CHECK(bytes <= options_.slotBytes, "a ", bytes, "-byte message exceeds the ",
           options_.slotBytes, "-byte slots");
  return outgoing_.acquireSend(options_.wait, peer);
}

void ShmTransport::commitSend(int peer, const Envelope& envelope) {
  checkPeer(peer, next_, "sends to");
  outgoing_.commitSend(envelope);
}

const void* ShmTransport::acquireRecv(int peer, const Envelope& expected) {
  checkPeer(peer, prev_, "receives from");
  return incoming_.acquireRecv(expected, options_.wait, peer);
}

void ShmTransport::releaseRecv(int peer) {
  checkPeer(peer, prev_, "receives from");
  incoming_.releaseRecv();
}

void ShmTransport::abort(const std::string& why) {
  const std::string reason = detail::concat("rank ", rank_, " failed: ", why);
  outgoing_.abort(reason);
  incoming_.abort(reason);
}

}  // namespace ringcomm
