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
  if (worldSize == 1) return;
  channels_.resize(worldSize);
  outgoing() = ShmChannel::create(options.slotBytes, options.slotCount, rank);
}

std::string ShmTransport::channelName() const {
  return channels_.empty() ? "" : channels_[rank_].name();
}

void ShmTransport::connect(const std::vector<std::string>& names) {
  if (worldSize_ == 1) return;
  RC_CHECK(!incoming().valid(), "this shared-memory transport is already connected");
  RC_CHECK(names.size() == static_cast<size_t>(worldSize_), "connect needs ", worldSize_,
           " channel names, one per rank, not ", names.size());
  RC_CHECK(names[rank_] == channelName(), "connect: names[", rank_, "] is not this rank's channel");
  for (int r = 0; r < worldSize_; ++r) {
    if (r == rank_) continue;
    channels_[r] = ShmChannel::attach(names[r]);
    others_.push_back(Peer{r, channels_[r].senderPid()});
  }
  incoming().claimReceiver();
}

void ShmTransport::unlinkNames() {
  for (ShmChannel& channel : channels_) channel.unlinkName();
}

void ShmTransport::checkPeer(int peer, int expected, const char* role) const {
  RC_CHECK(peer == expected, "the shared-memory ring only ", role, " rank ", expected,
           ", not rank ", peer);
  RC_CHECK(!channels_.empty() && channels_[prev_].valid(),
           "the shared-memory transport is not connected");
}

void* ShmTransport::acquireSend(int peer, size_t bytes) {
  checkPeer(peer, next_, "sends to");
  RC_CHECK(bytes <= options_.slotBytes, "a ", bytes, "-byte message exceeds the ",
           options_.slotBytes, "-byte slots");
  return outgoing().acquireSend(options_.wait, peer, others_);
}

void ShmTransport::commitSend(int peer, const Envelope& envelope) {
  checkPeer(peer, next_, "sends to");
  outgoing().commitSend(envelope);
}

const void* ShmTransport::acquireRecv(int peer, const Envelope& expected) {
  checkPeer(peer, prev_, "receives from");
  const Message& message = incoming().acquireRecv(expected, options_.wait, peer);
  RC_CHECK(message.originRank >= 0 && message.originRank < worldSize_, "rank ", peer,
           " sent a payload held by rank ", message.originRank);
  heldRank_ = message.originRank;
  heldIndex_ = message.payloadIndex;
  // The message's own envelope was checked; a forwarded one must still name a held payload.
  RC_CHECK(heldRank_ == prev_ || channels_[heldRank_].slotHeader(heldIndex_).envelope == expected,
           "rank ", peer, " forwarded a payload that rank ", heldRank_, " no longer holds");
  return channels_[heldRank_].payload(heldIndex_);
}

void ShmTransport::forward(int from, int to, const Envelope& envelope) {
  checkPeer(from, prev_, "receives from");
  checkPeer(to, next_, "sends to");
  outgoing().acquireForward(options_.wait, to);
  channels_[heldRank_].hold(heldIndex_);  // for the next reader, before it can see the message
  outgoing().commitForward(envelope, heldRank_, heldIndex_);
}

void ShmTransport::releaseRecv(int peer) {
  checkPeer(peer, prev_, "receives from");
  channels_[heldRank_].letGo(heldIndex_);
  incoming().releaseRecv();
}

void ShmTransport::abort(const std::string& why) {
  // Every channel, not just this rank's two: a rank waiting for a slot that a reader far round
  // the ring still holds learns of the failure at once.
  const std::string reason = detail::concat("rank ", rank_, " failed: ", why);
  for (ShmChannel& channel : channels_) channel.abort(reason);
}

}  // namespace ringcomm
