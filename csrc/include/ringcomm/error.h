// ringcomm::Error: every failure is an exception carrying file:line and a sentence for the user.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ringcomm {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait that ran past its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Ranks called collectives that do not match (kind, count, dtype, op or root).
class MismatchError : public Error {
 public:
  using Error::Error;
};

// A peer process died or aborted the communicator.
class PeerError : public Error {
 public:
  using Error::Error;
};

// A call refused before it started anything (it would have been misuse): the communicator
// stays usable.
class RefusedError : public Error {
 public:
  using Error::Error;
};

// A wait given up because the process was asked to stop: a signal arrived (Ctrl-C) and the
// handler the embedding layer runs for it raised (see interrupt.h).
class InterruptedError : public Error {
 public:
  using Error::Error;
};

// Rethrows `e` as the same kind of error with `message` as its message.
[[noreturn]] inline void rethrowWithMessage(const Error& e, const std::string& message) {
  if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(message);
  if (dynamic_cast<const MismatchError*>(&e)) throw MismatchError(message);
  if (dynamic_cast<const PeerError*>(&e)) throw PeerError(message);
  if (dynamic_cast<const RefusedError*>(&e)) throw RefusedError(message);
  if (dynamic_cast<const InterruptedError*>(&e)) throw InterruptedError(message);
  throw Error(message);
}

// Rethrows `e` as the same kind of error with `prefix` in front of its message.
[[noreturn]] inline void rethrowWithPrefix(const Error& e, const std::string& prefix) {
  rethrowWithMessage(e, prefix + e.what());
}

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace ringcomm

#define RC_THROW_AS(ExcType, ...)                                                   \
  throw ExcType(::ringcomm::detail::concat(__VA_ARGS__, " [", __FILE__, ":", __LINE__, \
                                           "]"))
#define RC_THROW(...) RC_THROW_AS(::ringcomm::Error, __VA_ARGS__)
#define RC_CHECK(cond, ...)   \
  do {                        \
    if (!(cond)) {            \
      RC_THROW(__VA_ARGS__);  \
    }                         \
  } while (0)
