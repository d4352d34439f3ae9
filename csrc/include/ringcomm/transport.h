// Transport: moves messages between ring neighbours. Zero-copy shaped: the executor writes a
// message straight into the transport's send slot and reads one straight out of its receive slot,
// so a reduction can read the incoming slice and write the outgoing one in a single pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace ringcomm {

// Every message says which collective and which slice it carries, so a rank that called something
// different, or runs the slices in another order, is caught at its first message instead of
// hanging or corrupting data.
struct Envelope {
  uint64_t sequence = 0;  // collectives run so far on this communicator
  int32_t collective = 0;
  int32_t dataType = 0;
  int32_t op = 0;
  int32_t root = 0;
  int32_t wireType = 0;
  int32_t algorithm = 0;  // Algorithm: ranks that chose differently must not pair up
  uint64_t count = 0;
  uint64_t bytes = 0;   // payload of this message
  uint64_t offset = 0;  // first element it carries, in the plan's logical buffer

  bool operator==(const Envelope& other) const {
    return sequence == other.sequence && collective == other.collective &&
           dataType == other.dataType && op == other.op && root == other.root &&
           wireType == other.wireType && algorithm == other.algorithm && count == other.count && bytes == other.bytes &&
           offset == other.offset;
  }
};

// "all_reduce #12 (count 1000, float32, sum, root 0, 4000-byte message at element 0)": for
// error messages.
std::string describeEnvelope(const Envelope& envelope);

// How a peer's envelope reached this rank, for the mismatch message.
enum class EnvelopeFrom { Message, Publication };

// MismatchError "collective mismatch: rank <peer> sent <got> but this rank is running
// <expected>" ("published" for a publication): the one message every transport that carries
// envelopes raises, so a rank that called something else is named the same way everywhere.
[[noreturn]] void throwEnvelopeMismatch(int peer, const Envelope& got, const Envelope& expected,
                                        EnvelopeFrom from = EnvelopeFrom::Message);

inline void checkEnvelope(int peer, const Envelope& got, const Envelope& expected,
                          EnvelopeFrom from = EnvelopeFrom::Message) {
  if (!(got == expected)) throwEnvelopeMismatch(peer, got, expected, from);
}

// What a transport moved and how long it waited, counted where it moves and waits (not
// computed from a formula). Per peer rank; publications are counted once when written and,
// by each reader, as bytes received from the rank that wrote them. A message forwarded by
// reference counts as sent to the rank it is forwarded to (that rank reads the bytes where
// they were first written).
struct TrafficStats {
  std::vector<uint64_t> bytesSent, bytesReceived, messagesSent, messagesReceived;  // by peer
  uint64_t bytesPublished = 0, publications = 0;
  // Waits that were not over at once: how many, for how long, and the phase each ended in
  // (spinning, yielding, asleep on the futex) with the time of those that ended asleep.
  uint64_t waits = 0, waitsEndedSpinning = 0, waitsEndedYielding = 0, waitsEndedSleeping = 0;
  double waitSeconds = 0, sleepingWaitSeconds = 0;

  explicit TrafficStats(int worldSize = 0)
      : bytesSent(worldSize), bytesReceived(worldSize), messagesSent(worldSize),
        messagesReceived(worldSize) {}
  TrafficStats& operator+=(const TrafficStats& other);
};

// A collective a device transport may record once and replay: the caller's tag and every
// request field that shapes its device work but the buffers, so the same calls give the same
// keys on every rank (NCCL requires a pair's sides to be captured alike). The buffers are
// checked at each replay instead: a tag promises the same ones.
struct ReplayKey {
  int collective = 0, type = 0, op = 0, root = 0, algorithm = 0, wireType = -1;
  size_t count = 0, sliceBytes = 0;
  int64_t tag = -1;
  const void* output = nullptr;  // not part of the key
  const void* input = nullptr;

  bool operator<(const ReplayKey& o) const {
    return std::tie(tag, collective, type, op, root, algorithm, wireType, count, sliceBytes) <
           std::tie(o.tag, o.collective, o.type, o.op, o.root, o.algorithm, o.wireType, o.count,
                    o.sliceBytes);
  }
};

class FlightRecorder;

// What a bracketed call is, for messages: "all_reduce" and its sequence number ("all_reduce #3"),
// or a point-to-point call's name ("send"). `name` is a string literal.
struct CallName {
  const char* name = "a call";
  uint64_t sequence = 0;
  bool numbered = false;
  const ReplayKey* replay = nullptr;  // set when the collective may be recorded and replayed
  // For the flight record (names are string literals; null: does not apply).
  const char* dtype = nullptr;
  size_t count = 0;  // elements per rank
  const char* op = nullptr;  // reducing collectives
  const char* algorithm = nullptr;
  int peer = -1;  // point-to-point: the other rank; a rooted collective: its root
  // The call's flight record entry (set by the communicator): a transport whose work completes
  // on a device after end() reports it done by this number (FlightRecorder::deviceDone).
  uint64_t record = 0;
};

// One message of a batch moved straight from or into the caller's buffer (sendRecvBatch).
struct DirectMessage {
  bool send = false;  // else a receive
  int peer = -1;
  void* data = nullptr;  // a send only reads it
  size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // What this transport has moved since it was made or last reset (transports that do not
  // count return empty vectors).
  virtual TrafficStats traffic() const { return TrafficStats(); }
  virtual void resetTraffic() {}

  // Largest payload of one message.
  virtual size_t maxMessageBytes() const = 0;
  // Slice columns the executor runs each step over before the next step (1: column by column).
  // A wave of W columns lets a rank send W messages per step without waiting for its neighbour,
  // so ranks that share a core switch once per wave instead of once per message. The ring stays
  // deadlock-free while W is below the messages a link can hold.
  virtual size_t columnsPerWave() const { return 1; }
  // Room for a message of `bytes` to `peer`; waits (with the timeout) for a free slot.
  virtual void* acquireSend(int peer, size_t bytes) = 0;
  // Publishes the message written into the slot from acquireSend.
  virtual void commitSend(int peer, const Envelope& envelope) = 0;
  // The next message from `peer`, which must match `expected` (same collective, same size):
  // waits (with the timeout) until it arrives, raises MismatchError when it does not match.
  virtual const void* acquireRecv(int peer, const Envelope& expected) = 0;
  // Whether forward() can pass a received message on without copying it (shared memory: the
  // next rank reads it where it was first written).
  virtual bool forwardsInPlace() const { return false; }
  // Passes the message acquired from `from` (not yet released) on to `to` unchanged.
  virtual void forward(int from, int to, const Envelope& envelope);
  // Gives the slot of the message from acquireRecv back to `peer`.
  virtual void releaseRecv(int peer) = 0;
  // Whether acquireSend/acquireRecv take any peer, not only the ring's neighbours (TCP's
  // sockets do): recursive_doubling needs it.
  virtual bool reachesEveryPeer() const { return false; }
  // Makes every peer's pending and future waits on this transport fail promptly.
  virtual void abort(const std::string& why) = 0;

  // Brackets one collective. `stream` is the caller's queue of device work (a cudaStream_t as an
  // integer; host transports ignore it): the collective runs after the work queued there, and
  // work queued there later sees its result. `call` names it, for errors raised after begin()
  // returned (a device collective still running past the timeout). end() follows a collective
  // that succeeded; after a failure the communicator calls abort() instead.
  virtual void begin(uintptr_t stream, const CallName& call) { (void)stream, (void)call; }
  virtual void end() {}
  // Whether a call's work still runs (on a device) when end() returns: such a transport tells
  // the recorder given here when it sees a call's work done (FlightRecorder::deviceDone).
  virtual bool completesOnDevice() const { return false; }
  virtual void reportCompletionTo(std::shared_ptr<FlightRecorder> recorder) { (void)recorder; }
  // Launches a recording of `call` (call.replay: what begin() may record) on `stream` instead of
  // running it, when the transport has one: true then, and the collective needs no executor.
  virtual bool replay(uintptr_t stream, const CallName& call) {
    (void)stream, (void)call;
    return false;
  }

  // Copy-only steps without staging: a transport that can send from and receive into the
  // caller's buffers (NCCL on device memory) returns true, and the executor then moves steps
  // that neither reduce nor convert with sendFrom/recvInto instead of through slots.
  virtual bool movesUserBuffers() const { return false; }
  // Sends envelope.bytes from `src` to `peer`; `src` stays untouched until the collective ends.
  virtual void sendFrom(int peer, const void* src, const Envelope& envelope);
  // Receives the next message from `peer` straight into `dst`.
  virtual void recvInto(int peer, void* dst, const Envelope& expected);
  // Sends and receives, to and from any peers, straight from and into the caller's buffers as
  // one unit (only where movesUserBuffers()): a transport that pairs operations and blocks a
  // send until its receive is posted (NCCL) posts them in one group, so that no order of them
  // can wait on another. Messages of one pair keep their order, also after earlier messages.
  virtual void sendRecvBatch(const std::vector<DirectMessage>& messages);

  // Publications: what the one-hop algorithms (one_shot, two_shot; see Algorithm) run on instead
  // of ring messages. In one round every rank publishes up to publishBytes() per phase (0, then
  // 1), and every rank reads every rank's publication of a phase (its own included) whole.
  // Shared memory reads them in place, where they were written; a message-passing transport
  // (NCCL) exchanges them with every peer in one group. A publication stays readable until the
  // rank that wrote it publishes that phase again two rounds later: every round reads every
  // rank's phase 0, so by then all ranks have moved on (double buffering, no extra barrier).
  // Largest publication per rank and phase; 0: this transport has none.
  virtual size_t publishBytes() const { return 0; }
  // Room for this rank's publication of `phase` in the round that starts with phase 0's.
  virtual void* acquirePublish(int phase, size_t bytes);
  // Makes it readable by every rank; `envelope` describes it (range, size, collective).
  virtual void commitPublish(int phase, const Envelope& envelope);
  // `peer`'s publication of `phase` in this round (waits, with the timeout, for it), which must
  // match `expected`, else MismatchError. Valid until this rank's next commitPublish(0).
  virtual const void* acquirePublished(int peer, int phase, const Envelope& expected);
  // Every rank's publication size of `phase` this round (bytesPerRank[r]; this rank's own entry
  // is not used), declared after the round's acquirePublish(0) and before the phase's first
  // acquirePublished: a transport that posts receives (NCCL) needs them all at once, and
  // two_shot's chunks differ by rank. Shared memory reads sizes from the headers: no-op.
  virtual void expectPublished(int phase, const std::vector<size_t>& bytesPerRank) {
    (void)phase, (void)bytesPerRank;
  }
};

}  // namespace ringcomm
