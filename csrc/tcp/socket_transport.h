// A transport over TCP that reaches any peer rank, for ranks on different hosts: the same object
// serves as a ring transport (the executor sends to the next rank, receives from the previous)
// and as point-to-point links (Communicator::setPeerLinks).
//
// Wire: each ordered pair of ranks talks over `connectionsPerPeer` connections, made by the
// sender the first time it sends to the peer (each starts with a Hello naming the sender); a
// message is a Frame (magic, the Envelope, payload size) followed by its payload, message k of
// the pair on connection k % C, so that slices pipeline across connections and the receiver
// restores the order by number. The receiving direction of a connection carries nothing but an
// abort frame, so a rank that aborts can tell its senders too.
//
// Slots: per peer and direction `slotCount` slots of `slotBytes` (allocated when the pair first
// talks). A send fills a send slot and returns; a progress thread writes it out and frees the
// slot. The same thread reads each connection's next message into receive slot k % slotCount
// once the message that held it was released, and stops reading a connection while that slot is
// held (TCP's flow control then holds the sender). So a send never waits on the peer's receive
// call, only on free slots: with every rank sending a wave of slotCount / 2 messages before it
// receives, a ring cannot deadlock (the shared-memory ring holds slotCount messages per link;
// this one holds twice that plus the kernel's buffers).
//
// Threads: one progress thread per transport (socket_progress.cc) runs a poll() loop over the
// listener, every connection and an eventfd the data path writes when it commits a send or
// releases a slot (one thread, not one per connection: hosts with few cores run a rank per
// core). The data path waits on a condition variable with the deadline, waking a few times a
// second to check the interrupt hook (ringcomm/interrupt.h) without holding its lock.
//
// Strangers: a listener is reachable by anything on its network, so an incoming connection
// counts as a peer's only once its Hello carries this communicator's secret (drawn at set-up,
// shared through the rendezvous store; compared in constant time), a rank of this world other
// than this one and a connection index not yet taken. Anything else, and a connection that sends
// no complete Hello within kHelloSeconds, is dropped before it touches a link and, with logDrops,
// logged with its address (socket_greeting.cc). At most kMaxAwaitingHello connections await
// their Hello: a newer one pushes the oldest out, so a flood costs bounded memory and cannot
// starve a real peer, whose Hello follows its connect at once.
//
// Failures: a wait ends with TimeoutError naming the peer (rank, label, address) and what it
// awaited; with PeerError at once when the peer aborted (its abort frame), when the connection
// a due message travels on was closed or reset (messages that arrived before still read), or
// when this transport was aborted. abort() sends "rank R failed: why" on every open
// connection (after the message being written, if any) and then shuts the connection down.
// Destruction writes out committed sends for up to the timeout (after an abort: the abort
// frames, for up to a second), then joins the thread and closes every socket.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ringcomm/transport.h"
#include "ringcomm/traffic_counters.h"
#include "tcp/tcp_socket.h"

namespace ringcomm {

struct SocketOptions {
  size_t slotBytes;
  uint32_t slotCount;
  uint32_t connectionsPerPeer;
  double timeoutSeconds;
  bool logDrops;  // a line on stderr for each stranger's connection dropped
};

class SocketTransport : public Transport {
 public:
  // Listens on `listenHost` (the IPv4 address peers reach this rank at; not the wildcard), on a
  // port the kernel picks; `secret` (kSecretBytes, the same on every rank) admits peers.
  SocketTransport(int rank, int worldSize, SocketOptions options, const std::string& listenHost,
                  const std::string& secret);
  ~SocketTransport() override;

  // "ip:port", for the peers' connect().
  std::string address() const { return address_; }
  // Every rank's address() (this rank's included) and a label per rank for error messages (its
  // host name, say). Connections to a peer are made on the first send to it; incoming ones are
  // accepted whenever they come, also before this call.
  void connect(const std::vector<std::string>& addresses, const std::vector<std::string>& labels);
  // The tag of the next send/recv message from `peer`, if it has arrived (nothing is taken).
  std::optional<int> arrivedTag(int peer) const;

  size_t maxMessageBytes() const override { return options_.slotBytes; }
  size_t columnsPerWave() const override {
    return std::max<size_t>(1, options_.slotCount / 2);
  }
  bool reachesEveryPeer() const override { return true; }
  void* acquireSend(int peer, size_t bytes) override;
  void commitSend(int peer, const Envelope& envelope) override;
  const void* acquireRecv(int peer, const Envelope& expected) override;
  void releaseRecv(int peer) override;
  void abort(const std::string& why) override;

  // How many incoming connections were dropped before they counted (strangers, idle ones).
  uint64_t dropped() const;

  TrafficStats traffic() const override { return traffic_.snapshot(); }
  void resetTraffic() override { traffic_.reset(); }

  // On the wire (both ends run the same build).
  struct Frame {
    uint64_t magic;
    uint32_t kind;  // kData or kAbort
    uint32_t unused;
    uint64_t index;         // the pair's message number (data)
    uint64_t payloadBytes;  // what follows: the message, or the abort's reason
    Envelope envelope;
  };
  static constexpr size_t kSecretBytes = 16;
  struct Hello {
    uint64_t magic;
    int32_t rank, worldSize;
    uint32_t connection, connections;
    uint8_t secret[kSecretBytes];
  };
  static constexpr uint64_t kMagic = 0x72696e67746370ULL;  // "ringtcp", frames and hellos
  static constexpr uint32_t kData = 1, kAbort = 2;
  static constexpr double kHelloSeconds = 5;  // or the timeout, if shorter
  static constexpr size_t kMaxAwaitingHello = 64;

 private:
  using Clock = std::chrono::steady_clock;

  struct Connection;
  // One peer, both directions; guarded by mutex_.
  struct Link {
    // Sending: slots, the frame of the message in each, which hold unsent messages.
    bool outgoing = false;  // connections made
    std::vector<Connection*> out;  // them, by index (kept, dead or alive, until the end)
    std::vector<char> sendSlots;
    std::vector<Frame> sendFrames;
    std::vector<uint8_t> sendBusy;
    uint64_t committed = 0;
    std::string sendFailure;  // the peer closed or reset a connection this rank sends on
    // Receiving: slots, the envelope of the message in each, which hold unreleased messages.
    std::vector<char> recvSlots;
    std::vector<Envelope> recvEnvelopes;
    std::vector<uint8_t> recvFull;
    uint64_t consumed = 0;
    std::vector<uint8_t> inConnected;      // by connection
    std::vector<std::string> inClosed;     // by connection: why it ended, once it did
    std::string abortedBy;                 // the peer's abort frame
  };

  // One socket, owned by the progress thread (adopted_ hands new outgoing ones over). The
  // thread that commits a send writes it to an idle connection itself (one thread hand-over
  // less per message); whoever writes marks the connection `writing`.
  struct Connection {
    Socket socket;
    int peer = -1;
    uint32_t index = 0;
    bool outgoing = false, greeted = false, dead = false;
    bool writing = false;  // a thread writes to it (the progress thread, or a direct send)
    uint64_t next = 0;  // the message this connection writes or reads next
    size_t writeDone = 0;
    enum { kHello, kHeader, kPayload, kText } readState = kHeader;
    size_t readDone = 0;
    Hello hello{};
    std::string from;           // incoming: the remote "ip:port", for the log
    Clock::time_point helloBy;  // incoming: dropped if not greeted by then
    Frame frame{};
    std::string text;
    std::string abortFrame;  // queued once this rank aborts
    size_t abortDone = 0;
  };

  void checkPeer(int peer) const;
  std::string describePeer(int peer) const;  // "rank 2 (host-b, 10.0.0.2:41234)"
  void wake();                               // the progress thread, if it sleeps in poll
  void ensureOutgoing(int peer);
  void allocateSend(Link& link);
  void allocateRecv(Link& link);
  [[noreturn]] void throwAborted() const;
  // Waits until ready(): `before` may raise before each look, `after` when it was not ready.
  template <typename Ready, typename Before, typename After, typename What>
  void waitFor(std::unique_lock<std::mutex>& lock, int peer, Ready ready, Before before,
               After after, What what);

  // The progress thread (socket_progress.cc).
  void progressLoop();
  void progressRounds(std::unique_lock<std::mutex>& lock);
  short interest(const Connection& c) const;
  // Incoming connections until their Hello is checked (socket_greeting.cc).
  void acceptAll();
  void dropUngreeted(Clock::time_point now);
  void drop(Connection& c, const std::string& why);
  void writeDropLog(std::vector<std::string>& lines) const;
  void readFrom(Connection& c, std::unique_lock<std::mutex>& lock);
  bool frameRead(Connection& c);
  // Writes what is pending on `c` until the socket is full, unless another thread writes to it.
  void writeTo(Connection& c, std::unique_lock<std::mutex>& lock);
  void writeWhileReady(Connection& c, std::unique_lock<std::mutex>& lock);
  bool writePending(const Connection& c) const;
  void greeted(Connection& c);
  void lost(Connection& c, const std::string& why);
  void queueAbortFrames();
  bool flushed() const;
  bool recvSlotFree(const Link& link, uint64_t message) const {
    return !link.recvFull.empty() && message < link.consumed + options_.slotCount;
  }

  const int rank_, worldSize_;
  const SocketOptions options_;
  std::string address_;
  const std::string secret_;
  Socket listener_, wakeFd_;
  TrafficCounters traffic_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;  // a slot filled or freed, a failure, an abort
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<sockaddr_in> addresses_;
  std::vector<std::string> labels_;
  std::atomic<bool> aborted_{false};
  std::string abortReason_;
  bool polling_ = false, stopping_ = false;
  uint64_t dropped_ = 0, unlogged_ = 0;
  std::vector<std::string> dropLog_;  // lines to print once the lock is let go
  double logBudget_ = 0;              // lines the log may take now (socket_greeting.cc)
  Clock::time_point loggedAt_;
  Clock::time_point acceptAfter_;     // out of descriptors: accept again from then
  Clock::time_point lingerUntil_;
  std::vector<std::unique_ptr<Connection>> adopted_, connections_;
  std::thread progress_;
};

}  // namespace ringcomm
