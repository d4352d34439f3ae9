#include "tcp/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

void tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

Socket newSocket() {
  Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  RC_CHECK(s.valid(), "cannot create a TCP socket: ", std::strerror(errno));
  return s;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

sockaddr_in parseAddress(const std::string& address, const char* what) {
  sockaddr_in out{};
  out.sin_family = AF_INET;
  const size_t colon = address.rfind(':');
  RC_CHECK(colon != std::string::npos, what, " '", address, "' is not of the form ip:port");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  char* end = nullptr;
  const long number = std::strtol(port.c_str(), &end, 10);
  RC_CHECK(!port.empty() && *end == '\0' && number > 0 && number <= UINT16_MAX, what, " '",
           address, "' has no valid port");
  RC_CHECK(inet_pton(AF_INET, host.c_str(), &out.sin_addr) == 1, what, " '", address,
           "' does not start with an IPv4 address");
  out.sin_port = htons(static_cast<uint16_t>(number));
  return out;
}

std::string formatAddress(const sockaddr_in& address) {
  char host[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &address.sin_addr, host, sizeof(host));
  return detail::concat(host, ":", ntohs(address.sin_port));
}

Socket listenOn(const std::string& host, std::string& address) {
  sockaddr_in where{};
  where.sin_family = AF_INET;
  RC_CHECK(inet_pton(AF_INET, host.c_str(), &where.sin_addr) == 1, "listen host '", host,
           "' is not an IPv4 address");
  RC_CHECK(where.sin_addr.s_addr != htonl(INADDR_ANY), "listen host ", host,
           " is the wildcard: give the address the peers reach this host at");
  Socket s = newSocket();
  RC_CHECK(bind(s.fd(), reinterpret_cast<sockaddr*>(&where), sizeof(where)) == 0,
           "cannot listen on ", host, ": ", std::strerror(errno));
  RC_CHECK(listen(s.fd(), 128) == 0, "cannot listen on ", host, ": ", std::strerror(errno));
  socklen_t length = sizeof(where);
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&where), &length);
  address = formatAddress(where);
  return s;
}

Socket acceptPending(const Socket& listener, sockaddr_in& from, int& error) {
  socklen_t length = sizeof(from);
  const int fd = accept4(listener.fd(), reinterpret_cast<sockaddr*>(&from), &length,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
  error = fd < 0 && errno != EAGAIN && errno != EWOULDBLOCK ? errno : 0;
  if (fd < 0) return Socket();
  tune(fd);
  return Socket(fd);
}

Socket connectBefore(const sockaddr_in& address, std::chrono::steady_clock::time_point deadline,
                     const std::function<void()>& check, std::string& lastError) {
  using Clock = std::chrono::steady_clock;
  auto millisLeft = [&](int most) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(most, left.count())));
  };
  while (true) {
    check();
    Socket s = newSocket();
    int error = 0;
    if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
      error = errno;
      // In progress: wait for it in slices (a host that drops SYNs takes long to refuse).
      while (error == EINPROGRESS) {
        pollfd p{s.fd(), POLLOUT, 0};
        const int ready = poll(&p, 1, millisLeft(100));
        check();
        if (ready > 0) {
          socklen_t length = sizeof(error);
          getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
        } else if (Clock::now() >= deadline) {
          error = ETIMEDOUT;
        }
      }
    }
    if (error == 0) {
      tune(s.fd());
      return s;
    }
    lastError = std::strerror(error);
    if (Clock::now() >= deadline) return Socket();
    // Refused (not listening yet), unreachable for now: try again shortly.
    std::this_thread::sleep_for(std::chrono::milliseconds(millisLeft(50)));
  }
}

ssize_t readSome(int fd, void* data, size_t bytes, int& error) {
  while (true) {
    const ssize_t n = ::recv(fd, data, bytes, 0);
    if (n > 0) return n;
    if (n == 0) return kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return kWouldBlock;
    error = errno;
    return kFailed;
  }
}

ssize_t writeSome(int fd, const iovec* parts, int count, int& error) {
  msghdr message{};
  message.msg_iov = const_cast<iovec*>(parts);
  message.msg_iovlen = static_cast<size_t>(count);
  while (true) {
    const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n >= 0) return n == 0 ? kWouldBlock : n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return kWouldBlock;
    error = errno;
    return kFailed;
  }
}

int skipWritten(iovec* parts, int count, size_t done, iovec** first) {
  int i = 0;
  while (i < count && done >= parts[i].iov_len) done -= parts[i++].iov_len;
  if (i < count) {
    parts[i].iov_base = static_cast<char*>(parts[i].iov_base) + done;
    parts[i].iov_len -= done;
  }
  *first = parts + i;
  return count - i;
}

}  // namespace ringcomm
