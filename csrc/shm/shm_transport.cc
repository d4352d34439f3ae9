#include "shm/shm_transport.h"

#include "ringcomm/error.h"

namespace ringcomm {

ShmTransport::ShmTransport(int rank, int worldSize, ShmOptions options)
    : rank_(rank),
      worldSize_(worldSize),
      next_((rank + 1) % worldSize),
      prev_((rank + worldSize - 1) % worldSize),
      options_(options),
      traffic_(worldSize) {
  options_.wait.stats = traffic_.waits();
  RC_CHECK(options.slotBytes >= 64, "shared-memory slots must hold at least 64 bytes");
  RC_CHECK(options.publishBytes >= 64, "shared-memory publications must hold at least 64 bytes");
  if (worldSize == 1) return;
  channels_.resize(worldSize);
  outgoing() = ShmChannel::create(options.slotBytes, options.slotCount, rank);
  boards_.resize(worldSize);
  boards_[rank] = ShmBoard::create(options.publishBytes, rank);
}

namespace {
constexpr char kNameSeparator = ' ';  // never in a shared-memory name we create
}  // namespace

std::string ShmTransport::channelName() const {
  if (channels_.empty()) return "";
  return channels_[rank_].name() + kNameSeparator + boards_[rank_].name();
}

void ShmTransport::connect(const std::vector<std::string>& names) {
  if (worldSize_ == 1) return;
  RC_CHECK(!incoming().valid(), "this shared-memory transport is already connected");
  RC_CHECK(names.size() == static_cast<size_t>(worldSize_), "connect needs ", worldSize_,
           " channel names, one per rank, not ", names.size());
  RC_CHECK(names[rank_] == channelName(), "connect: names[", rank_, "] is not this rank's channel");
  for (int r = 0; r < worldSize_; ++r) {
    if (r == rank_) continue;
    const size_t split = names[r].find(kNameSeparator);
    RC_CHECK(split != std::string::npos, "connect: rank ", r, "'s name '", names[r],
             "' names no publication board");
    try {
      channels_[r] = ShmChannel::attach(names[r].substr(0, split));
      boards_[r] = ShmBoard::attach(names[r].substr(split + 1));
    } catch (const Error& e) {
      rethrowWithPrefix(e, detail::concat("connecting to rank ", r, ": "));
    }
    others_.push_back(Peer{r, channels_[r].senderPid()});
  }
  incoming().claimReceiver();
}

void ShmTransport::unlinkNames() {
  for (ShmChannel& channel : channels_) channel.unlinkName();
  for (ShmBoard& board : boards_) board.unlinkName();
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
  traffic_.sent(peer, envelope.bytes);
}

const void* ShmTransport::acquireRecv(int peer, const Envelope& expected) {
  checkPeer(peer, prev_, "receives from");
  const Message& message = incoming().acquireRecv(expected, options_.wait, peer);
  RC_CHECK(message.originRank >= 0 && message.originRank < worldSize_, "rank ", peer,
           " sent a payload held by rank ", message.originRank);
  heldRank_ = message.originRank;
  heldIndex_ = message.payloadIndex;
  traffic_.received(peer, expected.bytes);
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
  traffic_.sent(to, envelope.bytes);  // by reference: `to` reads the bytes where they lie
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
  for (ShmBoard& board : boards_) board.abort(reason);
}

void ShmTransport::checkPhase(int phase) const {
  RC_CHECK(phase >= 0 && phase < ShmBoard::kPhases, "publication phase ", phase,
           " is not 0 or 1");
  RC_CHECK(!boards_.empty() && boards_[prev_].valid(),
           "the shared-memory transport is not connected");
}

void* ShmTransport::acquirePublish(int phase, size_t bytes) {
  checkPhase(phase);
  RC_CHECK(bytes <= options_.publishBytes, "a ", bytes, "-byte publication exceeds the ",
           options_.publishBytes, "-byte areas");
  if (phase == 0) ++round_;  // a round starts with phase 0 (see Transport)
  return boards_[rank_].area(phase, round_);
}

void ShmTransport::commitPublish(int phase, const Envelope& envelope) {
  checkPhase(phase);
  boards_[rank_].publish(phase, round_, envelope);
  traffic_.published(envelope.bytes);
}

const void* ShmTransport::acquirePublished(int peer, int phase, const Envelope& expected) {
  checkPhase(phase);
  RC_CHECK(peer >= 0 && peer < worldSize_, "rank ", peer, " is outside the world of ",
           worldSize_, " ranks");
  // A ring message waiting from the predecessor while this rank waits for a publication: the
  // predecessor runs a ring collective instead (it cannot have finished this one, which needs
  // the same publication), so say so instead of timing out.
  auto watch = [&] {
    const Message* stray = incoming().peek();
    if (stray != nullptr) throwEnvelopeMismatch(prev_, stray->envelope, expected);
  };
  const void* publication = boards_[peer].read(phase, round_, expected, options_.wait, watch);
  traffic_.received(peer, expected.bytes);
  return publication;
}

}  // namespace ringcomm
