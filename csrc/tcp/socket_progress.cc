// SocketTransport's progress thread: one poll() loop that accepts connections (checked in
// socket_greeting.cc), writes committed messages (and, once aborted, abort frames) and reads
// messages into free receive slots. It owns the connections; it takes the transport's lock to
// look at slots and counters, and lets go of it for every read and write (the data path is never
// held up by a copy into a socket).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "ringcomm/error.h"
#include "tcp/socket_transport.h"

namespace ringcomm {
namespace {

constexpr size_t kMaxAbortText = 16 << 10;  // reasons are a sentence or two

}  // namespace

void SocketTransport::progressLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  try {
    progressRounds(lock);
  } catch (const std::exception& e) {
    if (!aborted_.load()) {
      abortReason_ = detail::concat("rank ", rank_,
                                    " failed: its network progress thread stopped: ", e.what());
      aborted_.store(true);
    }
    changed_.notify_all();
  }
  connections_.clear();  // closes the sockets
  adopted_.clear();
  writeDropLog(dropLog_);
}

// Rings the eventfd the loop polls, so that it looks again (only needed while it sleeps in poll).
void SocketTransport::wake() {
  if (!polling_) return;
  const uint64_t one = 1;
  ssize_t ignored = ::write(wakeFd_.fd(), &one, sizeof(one));
  (void)ignored;
}

void SocketTransport::progressRounds(std::unique_lock<std::mutex>& lock) {
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;
  std::vector<std::string> dropLines;
  Clock::time_point nextHelloCheck;
  while (true) {
    const auto now = Clock::now();
    if (now >= nextHelloCheck) {  // not every round: rounds follow messages
      dropUngreeted(now);
      nextHelloCheck = now + std::chrono::milliseconds(100);
    }
    for (auto& c : adopted_) connections_.push_back(std::move(c));
    adopted_.clear();
    // Dead incoming connections go; outgoing ones stay (their links point at them), closed.
    for (auto& c : connections_)
      if (c->dead && c->outgoing) c->socket.reset();
    connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                      [](const auto& c) { return c->dead && !c->outgoing; }),
                       connections_.end());
    if (aborted_.load()) queueAbortFrames();
    if (stopping_ && (flushed() || Clock::now() >= lingerUntil_)) return;
    const bool accepting = now >= acceptAfter_;
    fds.assign({pollfd{wakeFd_.fd(), POLLIN, 0},
                pollfd{listener_.fd(), static_cast<short>(accepting ? POLLIN : 0), 0}});
    polled.clear();
    for (auto& c : connections_) {
      if (c->dead) continue;
      fds.push_back(pollfd{c->socket.fd(), interest(*c), 0});
      polled.push_back(c.get());
    }
    const int timeoutMillis = stopping_ || !accepting ? 20 : 1000;
    polling_ = true;
    dropLines.swap(dropLog_);
    lock.unlock();
    writeDropLog(dropLines);
    const int ready = poll(fds.data(), fds.size(), timeoutMillis);
    lock.lock();
    polling_ = false;
    if (ready <= 0) continue;
    if (fds[0].revents) {
      uint64_t count;
      ssize_t ignored = ::read(wakeFd_.fd(), &count, sizeof(count));
      (void)ignored;
    }
    for (size_t i = 0; i < polled.size(); ++i) {
      const pollfd& p = fds[i + 2];
      Connection& c = *polled[i];
      if (p.revents == 0 || c.dead) continue;
      if (p.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) {
        if (p.events & POLLIN) {
          readFrom(c, lock);
        } else {  // a connection held up by a full receive slot: only its failure
          int error = 0;
          socklen_t length = sizeof(error);
          getsockopt(c.socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
          lost(c, error ? detail::concat("reset its connection (", std::strerror(error), ")")
                        : std::string("closed its connection"));
        }
      }
      if (!c.dead && (p.revents & POLLOUT)) writeTo(c, lock);
    }
    // After the reads: the Hellos of connections accepted last round are read before newer
    // ones can push them out of the queue.
    if (fds[1].revents & POLLIN) acceptAll();
  }
}

short SocketTransport::interest(const Connection& c) const {
  if (!c.greeted) return POLLIN;
  const Link& link = *links_[c.peer];
  short events = 0;
  // Outgoing connections: the peer's abort frame or end; incoming ones: the next message while
  // there is a slot for it.
  if (c.outgoing || c.readState != Connection::kPayload || recvSlotFree(link, c.next))
    events |= POLLIN;
  const bool abortPending = c.abortDone < c.abortFrame.size();
  if (c.writing) return events;  // the data path writes: it wakes this thread if it leaves any
  if (c.outgoing && c.writeDone > 0) events |= POLLOUT;  // finish the message first
  else if (aborted_.load() ? abortPending : c.outgoing && c.next < link.committed)
    events |= POLLOUT;
  return events;
}

void SocketTransport::readFrom(Connection& c, std::unique_lock<std::mutex>& lock) {
  while (!c.dead) {
    char* into = nullptr;
    size_t want = 0;
    switch (c.readState) {
      case Connection::kHello:
        into = reinterpret_cast<char*>(&c.hello), want = sizeof(Hello);
        break;
      case Connection::kHeader:
        into = reinterpret_cast<char*>(&c.frame), want = sizeof(Frame);
        break;
      case Connection::kPayload: {
        Link& link = *links_[c.peer];
        if (!recvSlotFree(link, c.next)) return;  // read on once the slot is released
        into = link.recvSlots.data() + (c.next % options_.slotCount) * options_.slotBytes;
        want = c.frame.payloadBytes;
        break;
      }
      case Connection::kText:
        into = c.text.data(), want = c.text.size();
        break;
    }
    if (c.readDone < want) {
      int error = 0;
      lock.unlock();
      const ssize_t n = readSome(c.socket.fd(), into + c.readDone, want - c.readDone, error);
      lock.lock();
      if (n == kWouldBlock) return;
      if (n == kClosed) {
        const bool between = c.readDone == 0 && (c.readState == Connection::kHeader ||
                                                 c.readState == Connection::kHello);
        return lost(c, between ? "closed its connection"
                               : "closed its connection in the middle of a message");
      }
      if (n == kFailed)
        return lost(c, detail::concat("reset its connection (", std::strerror(error), ")"));
      c.readDone += static_cast<size_t>(n);
      if (c.readDone < want) continue;
    }
    frameRead(c);
  }
}

bool SocketTransport::frameRead(Connection& c) {
  c.readDone = 0;
  if (c.readState == Connection::kHello) {
    greeted(c);
    return !c.dead;
  }
  Link& link = *links_[c.peer];
  if (c.readState == Connection::kHeader) {
    const Frame& f = c.frame;
    // Only the sending direction of a connection carries messages.
    if (f.magic != kMagic || !((f.kind == kData && !c.outgoing) || f.kind == kAbort)) {
      lost(c, "sent something that is not a ringcomm frame");
      return false;
    }
    if (f.kind == kAbort) {
      if (f.payloadBytes == 0 || f.payloadBytes > kMaxAbortText) {
        lost(c, "sent a malformed abort frame");
        return false;
      }
      c.text.assign(f.payloadBytes, '\0');
      c.readState = Connection::kText;
      return true;
    }
    if (f.index != c.next || f.payloadBytes > options_.slotBytes ||
        f.payloadBytes != f.envelope.bytes) {
      lost(c, detail::concat("sent message ", f.index, " of ", f.payloadBytes,
                             " bytes where message ", c.next, " of at most ",
                             options_.slotBytes, " bytes was due"));
      return false;
    }
    c.readState = Connection::kPayload;  // zero bytes: completes once its slot is free
    return true;
  }
  if (c.readState == Connection::kPayload) {
    const size_t slot = c.next % options_.slotCount;
    link.recvEnvelopes[slot] = c.frame.envelope;
    link.recvFull[slot] = 1;
    c.next += options_.connectionsPerPeer;
  } else if (link.abortedBy.empty()) {  // kText: the peer aborted
    link.abortedBy = c.text;
  }
  c.readState = Connection::kHeader;
  changed_.notify_all();
  return true;
}

void SocketTransport::writeTo(Connection& c, std::unique_lock<std::mutex>& lock) {
  if (!c.greeted || c.writing) return;
  c.writing = true;
  writeWhileReady(c, lock);
  c.writing = false;
}

bool SocketTransport::writePending(const Connection& c) const {
  if (c.dead) return false;
  if (c.writeDone > 0) return true;
  if (aborted_.load()) return c.abortDone < c.abortFrame.size();
  return c.outgoing && c.next < links_[c.peer]->committed;
}

void SocketTransport::writeWhileReady(Connection& c, std::unique_lock<std::mutex>& lock) {
  Link& link = *links_[c.peer];
  while (!c.dead) {
    const bool message = c.outgoing && (c.writeDone > 0 ||
                                        (!aborted_.load() && c.next < link.committed));
    const size_t slot = c.next % options_.slotCount;
    iovec parts[2];
    int count = 1;
    size_t done = 0, total = 0;
    if (message) {
      const Frame& f = link.sendFrames[slot];  // stable while the slot is busy
      parts[0] = iovec{const_cast<Frame*>(&f), sizeof(Frame)};
      parts[1] = iovec{link.sendSlots.data() + slot * options_.slotBytes, f.payloadBytes};
      count = f.payloadBytes > 0 ? 2 : 1;
      done = c.writeDone, total = sizeof(Frame) + f.payloadBytes;
    } else if (c.abortDone < c.abortFrame.size()) {
      parts[0] = iovec{c.abortFrame.data(), c.abortFrame.size()};
      done = c.abortDone, total = c.abortFrame.size();
    } else {
      return;
    }
    iovec* first = nullptr;
    const int left = skipWritten(parts, count, done, &first);
    int error = 0;
    lock.unlock();
    const ssize_t n = writeSome(c.socket.fd(), first, left, error);
    lock.lock();
    if (n == kWouldBlock) return;
    if (n < 0) return lost(c, detail::concat("reset its connection (", std::strerror(error), ")"));
    done += static_cast<size_t>(n);
    if (!message) {
      c.abortDone = done;
      if (done == total) shutdown(c.socket.fd(), SHUT_WR);  // the frame is the last word
      continue;
    }
    c.writeDone = done;
    if (done < total) continue;
    link.sendBusy[slot] = 0;
    c.writeDone = 0;
    c.next += options_.connectionsPerPeer;
    changed_.notify_all();
  }
}

void SocketTransport::lost(Connection& c, const std::string& why) {
  if (!c.greeted) return drop(c, why);
  c.dead = true;  // its socket closes when the loop drops it
  Link& link = *links_[c.peer];
  const std::string what = detail::concat(describePeer(c.peer), " ", why);
  if (c.outgoing) {
    if (link.sendFailure.empty()) link.sendFailure = what;
  } else if (link.inClosed[c.index].empty()) {
    link.inClosed[c.index] = what;
  }
  changed_.notify_all();
}

void SocketTransport::queueAbortFrames() {
  for (auto& c : connections_) {
    if (c->dead || !c->abortFrame.empty()) continue;
    Frame f;
    std::memset(static_cast<void*>(&f), 0, sizeof(f));
    f.magic = kMagic;
    f.kind = kAbort;
    f.payloadBytes = abortReason_.size();
    c->abortFrame.assign(reinterpret_cast<const char*>(&f), sizeof(f));
    c->abortFrame += abortReason_;
  }
}

bool SocketTransport::flushed() const {
  for (const auto& c : connections_)
    if (c->greeted && writePending(*c)) return false;
  return true;
}

}  // namespace ringcomm
