// Point-to-point messages and all-to-all over the communicator's peer links. Through staging
// links (shared memory) a message travels in slot-sized pieces, each with an envelope naming the
// primitive, the pair's message number, the tag (in `root`), the count and the piece's offset,
// so a receive that does not match what was sent (another tag, another count, or an
// all-to-all against a recv) fails at once.
// Links that move user buffers (NCCL) send each message whole, straight from and into the
// caller's buffers, with no envelope: NCCL checks neither tags nor counts, so there a mismatch
// is not detected (NCCL requires a send and its receive to name the same count; another tag
// goes unnoticed). An all-to-all step's send and receive share one NCCL group, so every rank's
// k-th group holds its partners' k-th operations and the steps cannot deadlock.
#include <algorithm>

#include "ringcomm/communicator.h"
#include "ringcomm/error.h"

namespace ringcomm {
namespace {

// Elements per piece: slot-sized through staging links, the whole message on direct ones.
size_t pieceElems(const Transport& links, size_t count, DataType type) {
  if (links.movesUserBuffers()) return std::max<size_t>(1, count);
  return links.maxMessageBytes() / dataTypeSize(type);
}

}  // namespace

struct Communicator::PairMessage {
  int peer;
  char* data;
  size_t count;
  DataType type;
  Primitive primitive;
  int tag;
  uint64_t sequence;
  size_t pieceElems;

  size_t pieces() const { return std::max<size_t>(1, (count + pieceElems - 1) / pieceElems); }
  size_t elemSize() const { return dataTypeSize(type); }
  size_t first(size_t piece) const { return std::min(count, piece * pieceElems); }
  size_t length(size_t piece) const { return std::min(count, first(piece) + pieceElems) - first(piece); }

  Envelope envelope(size_t piece) const {
    Envelope e;
    e.sequence = sequence;
    e.primitive = static_cast<int32_t>(primitive);
    e.dataType = e.wireType = static_cast<int32_t>(type);
    e.root = tag;
    e.count = count;
    e.bytes = length(piece) * elemSize();
    e.offset = first(piece);
    return e;
  }
};

void Communicator::setPeerLinks(std::shared_ptr<Transport> links) {
  RC_CHECK(links != nullptr, "setPeerLinks needs a transport");
  std::lock_guard<std::mutex> lock(abortMutex_);  // abort() may read links_ meanwhile
  links_ = std::move(links);
  sent_.assign(worldSize_, 0);
  received_.assign(worldSize_, 0);
}

TrafficStats Communicator::traffic() const {
  TrafficStats total(worldSize_);
  if (transport_) total += transport_->traffic();
  if (links_) total += links_->traffic();
  return total;
}

void Communicator::resetTraffic() {
  if (transport_) transport_->resetTraffic();
  if (links_) links_->resetTraffic();
}

Transport& Communicator::peerLinks() {
  checkUsable();
  RC_CHECK(links_ != nullptr, "this communicator has no point-to-point links (setPeerLinks)");
  return *links_;
}

void Communicator::failed(const std::string& why) {
  failure_ = why;
  if (links_) links_->abort(failure_);
  if (transport_) transport_->abort(failure_);
}

void Communicator::overLinks(uintptr_t stream, const CallName& call,
                             const std::function<void()>& body) {
  bracket(peerLinks(), stream, call, body);
}

void Communicator::exchange(PairMessage* out, PairMessage* in) {
  Transport& links = peerLinks();
  if (links.movesUserBuffers()) {  // one piece each: sendFrom queues, recvInto joins its group
    if (out) links.sendFrom(out->peer, out->data, out->envelope(0));
    if (in) links.recvInto(in->peer, in->data, in->envelope(0));
    return;
  }
  const size_t pieces = std::max(out ? out->pieces() : 0, in ? in->pieces() : 0);
  for (size_t i = 0; i < pieces; ++i) {
    if (out && i < out->pieces()) {
      const Envelope e = out->envelope(i);
      void* slot = links.acquireSend(out->peer, e.bytes);
      if (e.bytes) reducer_->copy(slot, nullptr, out->data + e.offset * out->elemSize(), e.bytes);
      links.commitSend(out->peer, e);
    }
    if (in && i < in->pieces()) {
      const Envelope e = in->envelope(i);
      const void* message = links.acquireRecv(in->peer, e);
      if (e.bytes) reducer_->copy(in->data + e.offset * in->elemSize(), nullptr, message, e.bytes);
      links.releaseRecv(in->peer);
    }
  }
}

void Communicator::send(const void* data, size_t count, DataType type, int peer, int tag,
                        uintptr_t stream) {
  RC_CHECK(peer >= 0 && peer < worldSize_ && peer != rank_, "send: dst=", peer,
           " is not another rank of this ", worldSize_, "-rank communicator");
  Transport& links = peerLinks();
  PairMessage out{peer, static_cast<char*>(const_cast<void*>(data)), count, type,
                  Primitive::SendRecv, tag, sent_[peer]++, pieceElems(links, count, type)};
  overLinks(stream, CallName{"send"}, [&] { exchange(&out, nullptr); });
}

void Communicator::recv(void* data, size_t count, DataType type, int peer, int tag,
                        uintptr_t stream) {
  RC_CHECK(peer >= 0 && peer < worldSize_ && peer != rank_, "recv: src=", peer,
           " is not another rank of this ", worldSize_, "-rank communicator");
  Transport& links = peerLinks();
  PairMessage in{peer, static_cast<char*>(data), count, type, Primitive::SendRecv, tag,
                 received_[peer]++, pieceElems(links, count, type)};
  overLinks(stream, CallName{"recv"}, [&] { exchange(nullptr, &in); });
}

void Communicator::allToAll(void* output, const void* input, const std::vector<size_t>& sendCounts,
                            const std::vector<size_t>& recvCounts, DataType type,
                            uintptr_t stream) {
  const size_t n = static_cast<size_t>(worldSize_);
  RC_CHECK(sendCounts.size() == n && recvCounts.size() == n, "all_to_all needs ", n,
           " send and receive counts (one per rank), got ", sendCounts.size(), " and ",
           recvCounts.size());
  RC_CHECK(sendCounts[rank_] == recvCounts[rank_], "all_to_all: this rank sends itself ",
           sendCounts[rank_], " elements but expects ", recvCounts[rank_]);
  std::vector<size_t> sendAt(n + 1, 0), recvAt(n + 1, 0);
  for (size_t p = 0; p < n; ++p) {
    sendAt[p + 1] = sendAt[p] + sendCounts[p];
    recvAt[p + 1] = recvAt[p] + recvCounts[p];
  }
  const size_t elem = dataTypeSize(type);
  char* out = static_cast<char*>(output);
  char* in = static_cast<char*>(const_cast<void*>(input));
  // A block received into bytes a later step still sends would be overwritten first.
  const auto o = reinterpret_cast<uintptr_t>(out), i = reinterpret_cast<uintptr_t>(in);
  RC_CHECK(recvAt[n] == 0 || sendAt[n] == 0 || o + recvAt[n] * elem <= i ||
               i + sendAt[n] * elem <= o,
           "all_to_all: input and output must not overlap");
  auto copyOwnBlock = [&] {
    if (sendCounts[rank_])
      reducer_->copy(out + recvAt[rank_] * elem, nullptr, in + sendAt[rank_] * elem,
                     sendCounts[rank_] * elem);
  };
  if (n == 1) {
    checkUsable();
    collective(stream, CallName{"all_to_all"}, copyOwnBlock);  // the ring's transport: no links
    return;
  }
  Transport& links = peerLinks();
  overLinks(stream, CallName{"all_to_all"}, [&] {
    copyOwnBlock();
    // Step k: send to rank + k while receiving from rank - k, so every rank is busy with one
    // sender and one receiver at a time.
    for (size_t k = 1; k < n; ++k) {
      const int to = static_cast<int>((rank_ + k) % n), from = static_cast<int>((rank_ + n - k) % n);
      PairMessage sending{to, in + sendAt[to] * elem, sendCounts[to], type, Primitive::AllToAll, 0,
                          sent_[to]++, pieceElems(links, sendCounts[to], type)};
      PairMessage receiving{from, out + recvAt[from] * elem, recvCounts[from], type,
                            Primitive::AllToAll, 0, received_[from]++,
                            pieceElems(links, recvCounts[from], type)};
      exchange(&sending, &receiving);
    }
  });
}

}  // namespace ringcomm
