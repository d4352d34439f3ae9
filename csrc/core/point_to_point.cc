// Point-to-point messages and all-to-all over the communicator's peer links. Through staging
// links (shared memory) a message travels in slot-sized pieces, each with an envelope naming the
// collective, the pair's message number, the tag (in `root`), the count and the piece's offset,
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

// A point-to-point call as its flight record names it (peer -1: several).
CallName pairCall(const char* name, DataType type, size_t count, int peer) {
  CallName call{name};
  call.dtype = dataTypeName(type), call.count = count, call.peer = peer;
  return call;
}

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
  Collective collective;
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
    e.collective = static_cast<int32_t>(collective);
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
  links_->reportCompletionTo(recorder_);
  sent_.assign(worldSize_, 0);
  received_.assign(worldSize_, 0);
}

Transport& Communicator::peerLinks() {
  checkUsable();
  RC_CHECK(links_ != nullptr, "this communicator has no point-to-point links (setPeerLinks)");
  return *links_;
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
    if (out && i < out->pieces()) sendPiece(links, *out, i);
    if (in && i < in->pieces()) recvPiece(links, *in, i);
  }
}

void Communicator::sendPiece(Transport& links, const PairMessage& m, size_t piece) {
  const Envelope e = m.envelope(piece);
  void* slot = links.acquireSend(m.peer, e.bytes);
  if (e.bytes) reducer_->copy(slot, nullptr, m.data + e.offset * m.elemSize(), e.bytes);
  links.commitSend(m.peer, e);
}

void Communicator::recvPiece(Transport& links, const PairMessage& m, size_t piece) {
  const Envelope e = m.envelope(piece);
  const void* message = links.acquireRecv(m.peer, e);
  if (e.bytes) reducer_->copy(m.data + e.offset * m.elemSize(), nullptr, message, e.bytes);
  links.releaseRecv(m.peer);
}

void Communicator::send(const void* data, size_t count, DataType type, int peer, int tag,
                        uintptr_t stream) {
  RC_CHECK(peer >= 0 && peer < worldSize_ && peer != rank_, "send: dst=", peer,
           " is not another rank of this ", worldSize_, "-rank communicator");
  Transport& links = peerLinks();
  PairMessage out{peer, static_cast<char*>(const_cast<void*>(data)), count, type,
                  Collective::SendRecv, tag, sent_[peer]++, pieceElems(links, count, type)};
  overLinks(stream, pairCall("send", type, count, peer), [&] { exchange(&out, nullptr); });
}

void Communicator::recv(void* data, size_t count, DataType type, int peer, int tag,
                        uintptr_t stream) {
  RC_CHECK(peer >= 0 && peer < worldSize_ && peer != rank_, "recv: src=", peer,
           " is not another rank of this ", worldSize_, "-rank communicator");
  Transport& links = peerLinks();
  PairMessage in{peer, static_cast<char*>(data), count, type, Collective::SendRecv, tag,
                 received_[peer]++, pieceElems(links, count, type)};
  overLinks(stream, pairCall("recv", type, count, peer), [&] { exchange(nullptr, &in); });
}

namespace {

// Raises when a receive's bytes overlap another operation's: the batch's operations run at
// once (one NCCL group), so the result would depend on timing.
void checkNoOverlap(const std::vector<PointToPointOp>& ops) {
  struct Range {
    uintptr_t begin, end;
    size_t op;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].count > 0) {
      const auto begin = reinterpret_cast<uintptr_t>(ops[i].data);
      ranges.push_back({begin, begin + ops[i].count * dataTypeSize(ops[i].type), i});
    }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.op < b.op);
  });
  // Sweep by start: a range overlaps an earlier one iff it starts before that one's end. The
  // furthest-reaching earlier range, and the furthest-reaching earlier receive, are the ones
  // to compare with.
  const Range* reach = nullptr;
  const Range* receiveReach = nullptr;
  auto describe = [&](const Range& r) {
    const PointToPointOp& op = ops[r.op];
    return detail::concat("#", r.op, " (", op.send ? "send to" : "recv from", " rank ", op.peer,
                          ")");
  };
  for (const Range& r : ranges) {
    const Range* other = !ops[r.op].send ? reach : receiveReach;
    RC_CHECK(other == nullptr || r.begin >= other->end, "batch_isend_irecv: the buffer of ",
             describe(r), " overlaps that of ", describe(*other),
             ": a receive's buffer must not overlap any other buffer of the batch");
    if (reach == nullptr || r.end > reach->end) reach = &r;
    if (!ops[r.op].send && (receiveReach == nullptr || r.end > receiveReach->end))
      receiveReach = &r;
  }
}

}  // namespace

void Communicator::sendRecvBatch(const std::vector<PointToPointOp>& ops, uintptr_t stream) {
  for (size_t i = 0; i < ops.size(); ++i)
    RC_CHECK(ops[i].peer >= 0 && ops[i].peer < worldSize_ && ops[i].peer != rank_,
             "batch_isend_irecv: #", i, " names ", ops[i].send ? "dst=" : "src=", ops[i].peer,
             ", not another rank of this ", worldSize_, "-rank communicator");
  checkNoOverlap(ops);
  Transport& links = peerLinks();
  if (ops.empty()) return;
  // Numbered per pair in batch order, as singles are: batch and single messages pair up.
  std::vector<PairMessage> messages;
  messages.reserve(ops.size());
  for (const PointToPointOp& op : ops) {
    uint64_t& sequence = op.send ? sent_[op.peer] : received_[op.peer];
    messages.push_back(PairMessage{op.peer, static_cast<char*>(op.data), op.count, op.type,
                                   Collective::SendRecv, op.tag, sequence++,
                                   pieceElems(links, op.count, op.type)});
  }
  CallName batch{"batch_isend_irecv"};
  batch.count = ops.size();  // operations
  overLinks(stream, batch, [&] {
    if (!links.movesUserBuffers()) return exchangeBatch(links, ops, messages);
    std::vector<DirectMessage> direct;
    direct.reserve(ops.size());
    for (size_t i = 0; i < ops.size(); ++i)
      direct.push_back(DirectMessage{ops[i].send, ops[i].peer, ops[i].data,
                                     ops[i].count * dataTypeSize(ops[i].type)});
    links.sendRecvBatch(direct);
  });
}

// Staging links hold a few pieces per pair, and a send waits for room, so a batch cannot send
// everything before it receives. Each (direction, peer) is a lane carrying its messages in
// batch order (a pair's pieces must arrive in order); round k moves the k-th piece of every
// lane, sends before receives. Where every rank's batch holds its pairs' matching messages,
// nothing waits in a cycle: a rank in round k waits for a receive only on a peer that has not
// yet sent round k's piece (an earlier round, or earlier among round k's sends), and for room
// only on a peer that has not yet received a piece of an earlier round. Anything else waits
// with the links' timeout.
void Communicator::exchangeBatch(Transport& links, const std::vector<PointToPointOp>& ops,
                                 const std::vector<PairMessage>& messages) {
  struct Lane {
    bool send;
    int peer;
    std::vector<const PairMessage*> messages;
    size_t next = 0, piece = 0;  // the message, and its piece, that moves next
  };
  std::vector<Lane> lanes;  // send lanes first: a round sends before it receives
  for (const bool send : {true, false}) {
    std::vector<int> laneOf(worldSize_, -1);  // by peer
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].send != send) continue;
      int& lane = laneOf[ops[i].peer];
      if (lane < 0) {
        lane = static_cast<int>(lanes.size());
        lanes.push_back(Lane{send, ops[i].peer, {}});
      }
      lanes[lane].messages.push_back(&messages[i]);
    }
  }
  for (bool moved = true; moved;) {
    moved = false;
    for (Lane& lane : lanes) {
      if (lane.next == lane.messages.size()) continue;
      const PairMessage& m = *lane.messages[lane.next];
      if (lane.send)
        sendPiece(links, m, lane.piece);
      else
        recvPiece(links, m, lane.piece);
      moved = true;
      if (++lane.piece == m.pieces()) lane.piece = 0, ++lane.next;
    }
  }
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
  size_t sent = 0;  // elements, for the flight record
  for (size_t c : sendCounts) sent += c;
  if (n == 1) {
    checkUsable();
    collective(stream, pairCall("all_to_all", type, sent, -1), copyOwnBlock);  // no links
    return;
  }
  Transport& links = peerLinks();
  overLinks(stream, pairCall("all_to_all", type, sent, -1), [&] {
    copyOwnBlock();
    // Step k: send to rank + k while receiving from rank - k, so every rank is busy with one
    // sender and one receiver at a time.
    for (size_t k = 1; k < n; ++k) {
      const int to = static_cast<int>((rank_ + k) % n), from = static_cast<int>((rank_ + n - k) % n);
      PairMessage sending{to, in + sendAt[to] * elem, sendCounts[to], type, Collective::AllToAll, 0,
                          sent_[to]++, pieceElems(links, sendCounts[to], type)};
      PairMessage receiving{from, out + recvAt[from] * elem, recvCounts[from], type,
                            Collective::AllToAll, 0, received_[from]++,
                            pieceElems(links, recvCounts[from], type)};
      exchange(&sending, &receiving);
    }
  });
}

}  // namespace ringcomm
