// Defaults of the optional Transport operations (transports that stage everything), and the
// envelope mismatch every transport raises.
#include "ringcomm/transport.h"

#include "ringcomm/error.h"

namespace ringcomm {

void throwEnvelopeMismatch(int peer, const Envelope& got, const Envelope& expected,
                           EnvelopeFrom from) {
  RC_THROW_AS(MismatchError, "collective mismatch: rank ", peer,
              from == EnvelopeFrom::Publication ? " published " : " sent ", describeEnvelope(got),
              " but this rank is running ", describeEnvelope(expected));
}

void Transport::forward(int from, int to, const Envelope&) {
  RC_THROW("this transport cannot forward a message from rank ", from, " to rank ", to,
           " in place");
}

void Transport::sendFrom(int, const void*, const Envelope& envelope) {
  RC_THROW("this transport cannot send from user buffers (", describeEnvelope(envelope), ")");
}

void Transport::recvInto(int, void*, const Envelope& expected) {
  RC_THROW("this transport cannot receive into user buffers (", describeEnvelope(expected), ")");
}

void Transport::sendRecvBatch(const std::vector<DirectMessage>& messages) {
  RC_THROW("this transport cannot move a batch of ", messages.size(),
           " messages from and into user buffers");
}

void* Transport::acquirePublish(int phase, size_t bytes) {
  RC_THROW("this transport has no publications (phase ", phase, ", ", bytes, " bytes)");
}

void Transport::commitPublish(int, const Envelope& envelope) {
  RC_THROW("this transport has no publications (", describeEnvelope(envelope), ")");
}

TrafficStats& TrafficStats::operator+=(const TrafficStats& other) {
  auto add = [](std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
    if (into.size() < from.size()) into.resize(from.size());
    for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
  };
  add(bytesSent, other.bytesSent);
  add(bytesReceived, other.bytesReceived);
  add(messagesSent, other.messagesSent);
  add(messagesReceived, other.messagesReceived);
  bytesPublished += other.bytesPublished;
  publications += other.publications;
  waits += other.waits;
  waitsEndedSpinning += other.waitsEndedSpinning;
  waitsEndedYielding += other.waitsEndedYielding;
  waitsEndedSleeping += other.waitsEndedSleeping;
  waitSeconds += other.waitSeconds;
  sleepingWaitSeconds += other.sleepingWaitSeconds;
  return *this;
}

const void* Transport::acquirePublished(int peer, int, const Envelope& expected) {
  RC_THROW("this transport has no publications (rank ", peer, ", ", describeEnvelope(expected), ")");
}

}  // namespace ringcomm
