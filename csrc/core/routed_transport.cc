#include "ringcomm/routed_transport.h"

#include <algorithm>

#include "ringcomm/error.h"

namespace ringcomm {

RoutedTransport::RoutedTransport(int rank, std::vector<std::shared_ptr<Transport>> byPeer)
    : rank_(rank), byPeer_(std::move(byPeer)) {
  for (const auto& transport : byPeer_) {
    if (!transport || std::count(distinct_.begin(), distinct_.end(), transport.get())) continue;
    distinct_.push_back(transport.get());
  }
  RC_CHECK(!distinct_.empty(), "a routed transport needs a transport for some peer");
  // Every link's message must fit the smallest of them; a wave fits every link's slots.
  maxMessageBytes_ = distinct_.front()->maxMessageBytes();
  columnsPerWave_ = distinct_.front()->columnsPerWave();
  for (Transport* transport : distinct_) {
    maxMessageBytes_ = std::min(maxMessageBytes_, transport->maxMessageBytes());
    columnsPerWave_ = std::min(columnsPerWave_, transport->columnsPerWave());
  }
}

Transport& RoutedTransport::to(int peer) const {
  RC_CHECK(peer >= 0 && peer < static_cast<int>(byPeer_.size()) && byPeer_[peer], "rank ", rank_,
           " has no link to rank ", peer);
  return *byPeer_[peer];
}

void* RoutedTransport::acquireSend(int peer, size_t bytes) { return to(peer).acquireSend(peer, bytes); }

void RoutedTransport::commitSend(int peer, const Envelope& envelope) {
  to(peer).commitSend(peer, envelope);
}

const void* RoutedTransport::acquireRecv(int peer, const Envelope& expected) {
  return to(peer).acquireRecv(peer, expected);
}

void RoutedTransport::releaseRecv(int peer) { to(peer).releaseRecv(peer); }

void RoutedTransport::abort(const std::string& why) {
  for (Transport* transport : distinct_) transport->abort(why);
}

void RoutedTransport::begin(uintptr_t stream, const CallName& call) {
  for (Transport* transport : distinct_) transport->begin(stream, call);
}

void RoutedTransport::end() {
  for (Transport* transport : distinct_) transport->end();
}

TrafficStats RoutedTransport::traffic() const {
  TrafficStats total(static_cast<int>(byPeer_.size()));
  for (Transport* transport : distinct_) total += transport->traffic();
  return total;
}

void RoutedTransport::resetTraffic() {
  for (Transport* transport : distinct_) transport->resetTraffic();
}

}  // namespace ringcomm
