// The communicator's state beside its calls: failed, aborted or closed (then it refuses further
// use), and what its transports, and its levels' transports, moved.
#include "ringcomm/communicator.h"

#include "ringcomm/error.h"

namespace ringcomm {

void Communicator::checkUsable() const {
  RC_CHECK(!closed_, "this ringcomm communicator is closed");
  if (aborted_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(abortMutex_);
    RC_THROW_AS(PeerError, "this ringcomm communicator was aborted and cannot be used again (",
                abortReason_, "); create a new one");
  }
  if (!failure_.empty())
    RC_THROW_AS(PeerError, "this ringcomm communicator failed earlier and cannot be used again (",
                failure_, "); create a new one");
}

void Communicator::failed(const std::string& why) {
  failure_ = why;
  if (links_) links_->abort(failure_);
  if (transport_) transport_->abort(failure_);
  for (const Level* level : {&local_, &cross_})
    if (level->comm) level->comm->abort(failure_);
}

std::string Communicator::failure() const {
  if (!failure_.empty() || !aborted_.load()) return failure_;
  std::lock_guard<std::mutex> lock(abortMutex_);
  return abortReason_;
}

void Communicator::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(abortMutex_);
  if (!aborted_.exchange(true)) abortReason_ = why;
  // Transports' aborts are safe beside their data path: shared memory sets flags peers and
  // this rank's waits check, NCCL's takes its own mutex.
  if (links_) links_->abort(why);
  if (transport_) transport_->abort(why);
  for (const Level* level : {&local_, &cross_})
    if (level->comm) level->comm->abort(why);
}

void Communicator::close() {
  std::lock_guard<std::mutex> lock(abortMutex_);
  closed_ = true;
  for (Level* level : {&local_, &cross_})
    if (level->comm) level->comm->close(), level->comm.reset();
  transport_.reset();  // unmaps shared memory, destroys NCCL communicators
  links_.reset();
  reducer_.reset();
}

TrafficStats Communicator::traffic() const {
  TrafficStats total(worldSize_);
  if (transport_) total += transport_->traffic();
  if (links_) total += links_->traffic();
  for (const Level* level : {&local_, &cross_}) {
    if (!level->comm) continue;
    // The level counts by its own ranks: name them by this communicator's.
    TrafficStats theirs = level->comm->traffic(), ours(worldSize_);
    for (size_t p = 0; p < level->ranks.size() && p < theirs.bytesSent.size(); ++p) {
      const int r = level->ranks[p];
      ours.bytesSent[r] = theirs.bytesSent[p], ours.bytesReceived[r] = theirs.bytesReceived[p];
      ours.messagesSent[r] = theirs.messagesSent[p];
      ours.messagesReceived[r] = theirs.messagesReceived[p];
    }
    theirs.bytesSent = ours.bytesSent, theirs.bytesReceived = ours.bytesReceived;
    theirs.messagesSent = ours.messagesSent, theirs.messagesReceived = ours.messagesReceived;
    total += theirs;
  }
  return total;
}

void Communicator::resetTraffic() {
  if (transport_) transport_->resetTraffic();
  if (links_) links_->resetTraffic();
  for (const Level* level : {&local_, &cross_})
    if (level->comm) level->comm->resetTraffic();
}

}  // namespace ringcomm
