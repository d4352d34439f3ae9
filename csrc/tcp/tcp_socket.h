// TCP sockets for the network transport: an owned descriptor, IPv4 "ip:port" addresses, a
// listener on an ephemeral port, accept, connect with retries until a deadline, and
// non-blocking reads and writes that say whether they moved bytes, would block, or found the
// connection gone. Every socket here is non-blocking with TCP_NODELAY (messages are written
// whole, header and payload in one call: Nagle would only delay them).
#pragma once

#include <netinet/in.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <functional>
#include <string>

namespace ringcomm {

// An owned file descriptor, closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// "a.b.c.d:port" <-> sockaddr_in. parseAddress raises a ringcomm::Error naming `what`.
sockaddr_in parseAddress(const std::string& address, const char* what);
std::string formatAddress(const sockaddr_in& address);

// A listener on `host` (an IPv4 address the peers can reach, not the wildcard) and a port the
// kernel picks; `address` gets "host:port".
Socket listenOn(const std::string& host, std::string& address);

// The next pending connection (non-blocking, TCP_NODELAY) and its remote address, or an
// invalid Socket when none is waiting or accept failed (`error`: its errno, or 0).
Socket acceptPending(const Socket& listener, sockaddr_in& from, int& error);

// Connects to `address`, retrying refused or unreachable attempts every few tens of ms until
// `deadline`. `check` runs between attempts and in the waits (a few times a second at least):
// it may raise to give up (abort, interrupt). Returns an invalid Socket at the deadline, with
// the last attempt's failure in `lastError`.
Socket connectBefore(const sockaddr_in& address, std::chrono::steady_clock::time_point deadline,
                     const std::function<void()>& check, std::string& lastError);

// Outcome of one non-blocking read or write: bytes moved (> 0), or one of these.
enum : ssize_t { kWouldBlock = -1, kClosed = -2, kFailed = -3 };

// Reads up to `bytes`; kClosed at end of stream; kFailed (errno kept in `error`) on a reset.
ssize_t readSome(int fd, void* data, size_t bytes, int& error);
// Writes from the buffers (never raises SIGPIPE); kFailed with `error` when the peer is gone.
ssize_t writeSome(int fd, const iovec* parts, int count, int& error);
// Advances `parts` past `done` bytes; returns how many parts are left (from *first).
int skipWritten(iovec* parts, int count, size_t done, iovec** first);

}  // namespace ringcomm
