#include "shm/shm_p2p.h"

#include "ringcomm/error.h"
#include "ringcomm/types.h"

namespace ringcomm {

ShmPeerLinks::ShmPeerLinks(int rank, int worldSize, ShmOptions options)
    : rank_(rank),
      worldSize_(worldSize),
      options_(options),
      traffic_(std::max(worldSize, 0)),
      outgoing_(worldSize),
      incoming_(worldSize),
      heldPayload_(worldSize, 0) {
  RC_CHECK(worldSize >= 1 && rank >= 0 && rank < worldSize, "rank ", rank,
           " is outside the world of ", worldSize, " ranks");
  options_.wait.stats = traffic_.waits();
  RC_CHECK(options.slotBytes >= 64, "shared-memory slots must hold at least 64 bytes");
}

void ShmPeerLinks::checkPeer(int peer) const {
  RC_CHECK(peer >= 0 && peer < worldSize_, "peer ", peer, " is not a rank of this ", worldSize_,
           "-rank communicator");
  RC_CHECK(peer != rank_, "rank ", rank_, " cannot send to or receive from itself");
}

std::string ShmPeerLinks::createOutgoing(int peer) {
  checkPeer(peer);
  RC_CHECK(!outgoing_[peer].valid(), "the link to rank ", peer, " already exists");
  outgoing_[peer] = ShmChannel::create(options_.slotBytes, options_.slotCount, rank_);
  return outgoing_[peer].name();
}

void ShmPeerLinks::attachIncoming(int peer, const std::string& name) {
  checkPeer(peer);
  RC_CHECK(!incoming_[peer].valid(), "the link from rank ", peer, " is already attached");
  ShmChannel channel = ShmChannel::attach(name);
  channel.claimReceiver();
  incoming_[peer] = std::move(channel);
}

void ShmPeerLinks::unlinkIncoming(int peer) {
  checkPeer(peer);
  incoming_[peer].unlinkName();
}

bool ShmPeerLinks::hasOutgoing(int peer) const {
  checkPeer(peer);
  return outgoing_[peer].valid();
}

bool ShmPeerLinks::hasIncoming(int peer) const {
  checkPeer(peer);
  return incoming_[peer].valid();
}

std::optional<int> ShmPeerLinks::arrivedTag(int peer) const {
  if (!hasIncoming(peer)) return std::nullopt;
  const Message* next = incoming_[peer].peek();
  if (next == nullptr || next->envelope.collective != static_cast<int32_t>(Collective::SendRecv))
    return std::nullopt;
  return next->envelope.root;  // point-to-point envelopes carry the tag as their root
}

void* ShmPeerLinks::acquireSend(int peer, size_t bytes) {
  RC_CHECK(hasOutgoing(peer), "no link to rank ", peer, " was set up");
  RC_CHECK(bytes <= options_.slotBytes, "a ", bytes, "-byte message exceeds the ",
           options_.slotBytes, "-byte slots");
  return outgoing_[peer].acquireSend(options_.wait, peer, {});  // no payload is forwarded
}

void ShmPeerLinks::commitSend(int peer, const Envelope& envelope) {
  outgoing_[peer].commitSend(envelope);
  traffic_.sent(peer, envelope.bytes);
}

const void* ShmPeerLinks::acquireRecv(int peer, const Envelope& expected) {
  RC_CHECK(hasIncoming(peer), "no link from rank ", peer, " was set up");
  const Message& message = incoming_[peer].acquireRecv(expected, options_.wait, peer);
  heldPayload_[peer] = message.payloadIndex;
  traffic_.received(peer, expected.bytes);
  return incoming_[peer].payload(message.payloadIndex);
}

void ShmPeerLinks::releaseRecv(int peer) {
  incoming_[peer].letGo(heldPayload_[peer]);
  incoming_[peer].releaseRecv();
}

void ShmPeerLinks::abort(const std::string& why) {
  const std::string reason = detail::concat("rank ", rank_, " failed: ", why);
  for (ShmChannel& channel : outgoing_) channel.abort(reason);
  for (ShmChannel& channel : incoming_) channel.abort(reason);
}

}  // namespace ringcomm
