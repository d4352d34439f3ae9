// The NCCL groups NcclTransport posts, each through runGroup (under the transport's mutex, then
// awaited until NCCL has enqueued it): the ring's queued sends with a receive (issue), a
// point-to-point batch, and the publications' exchange. The events each waits for and records
// are drawn at the top of nccl_transport.cc (slots) and above exchange() (publications).
#include "nccl/nccl_transport.h"

#include "ringcomm/error.h"

namespace ringcomm {

#define RC_GPU(call) check(api_->call, #call)

// A batch is one group: NCCL posts its operations together, so a send and its receive never
// wait for each other's group, whatever order the ranks list them in (two ranks that both
// send first would otherwise both wait for the other's receive: at the first exchange, which
// connects, and for messages larger than NCCL's buffers).
void NcclTransport::sendRecvBatch(const std::vector<DirectMessage>& messages) {
  checkUsable();
  bool any = false;  // zero-byte messages are skipped on both sides alike, as in issue()
  for (const DirectMessage& m : messages) {
    RC_CHECK(m.peer >= 0 && m.peer < options_.worldSize, m.send ? "send to" : "receive from",
             " rank ", m.peer, " outside the world");
    any = any || m.bytes > 0;
  }
  if (!any) return;
  flush();  // sends queued before the batch go out first: pairs keep their order
  // The group reads and writes the caller's buffers: after all compute so far (kernels may
  // still write what it sends or read what it overwrites), and later compute after it.
  RC_GPU(cudaEventRecord(computeAll_, compute_));
  RC_GPU(cudaStreamWaitEvent(commStream_, computeAll_, 0));
  std::vector<Link> peers;
  for (const DirectMessage& m : messages)
    if (m.bytes > 0) peers.push_back({m.peer, m.send});
  runGroup(
      peers,
      [&](ncclComm_t comm) {
        for (const DirectMessage& m : messages) {
          if (m.bytes == 0) continue;
          const ncclResult_t rc =
              m.send ? api_->ncclSend(m.data, m.bytes, ncclInt8, m.peer, comm, commStream_)
                     : api_->ncclRecv(m.data, m.bytes, ncclInt8, m.peer, comm, commStream_);
          if (!ncclPosted(rc)) return rc;
        }
        return ncclSuccess;
      },
      [&] {
        std::string what = detail::concat("exchanging a batch of ", messages.size(), " messages (");
        size_t named = 0;
        for (const DirectMessage& m : messages)
          if (m.bytes > 0 && named++ < 8)
            what += detail::concat(m.send ? "send to rank " : "receive from rank ", m.peer, "; ");
        return what + (named > 8 ? "...)" : ")");
      });
  RC_GPU(cudaEventRecord(commAll_, commStream_));
  RC_GPU(cudaStreamWaitEvent(compute_, commAll_, 0));
}

void NcclTransport::flush() {
  std::vector<QueuedSend> all = queue_.takeAll();
  if (!all.empty()) issue(all, nullptr);
}

template <typename Enqueue>
void NcclTransport::runGroup(const std::vector<Link>& peers, Enqueue enqueue,
                             const std::function<std::string()>& what) {
  for (const Link& link : peers)
    if (capturing_ && !connected(link)) {
      const std::string why = detail::concat(
          "a CUDA graph capture cannot hold the first ", link.send ? "send to" : "receive from",
          " rank ", link.peer, " (NCCL connects to it then): run this collective once before "
          "capturing, as a warm-up");
      abort(why);
      RC_THROW(why, where());
    }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) throwAborted();
    ncclResult_t rc = api_->ncclGroupStart();
    if (!ncclPosted(rc)) failNcclLocked(rc, what());
    rc = enqueue(comm_);
    const ncclResult_t ended = api_->ncclGroupEnd();  // also after a failed post: ends the group
    if (ncclPosted(rc)) rc = ended;
    if (!ncclPosted(rc)) failNcclLocked(rc, what());
  }
  // The first exchange with a peer connects to it, which waits for the peer.
  awaitNccl(what, options_.timeoutSeconds);
  for (const Link& link : peers) (link.send ? sendConnected_ : recvConnected_)[link.peer] = true;
}

void NcclTransport::issue(const std::vector<QueuedSend>& sends, const Receive* receive) {
  // Zero-byte messages are skipped on both sides alike (matching collectives agree on sizes).
  const bool receives = receive != nullptr && receive->bytes > 0;
  bool any = receives;
  for (const QueuedSend& s : sends) any = any || s.bytes > 0;
  if (!any) return;

  for (const QueuedSend& s : sends)
    if (s.bytes > 0) RC_GPU(cudaStreamWaitEvent(commStream_, sendReady(s.id), 0));
  if (receives && receive->slot >= 0 && recvFreePending_[receive->slot]) {
    RC_GPU(cudaStreamWaitEvent(commStream_, recvFree_[receive->slot], 0));
    recvFreePending_[receive->slot] = false;
  } else if (receives && receive->slot < 0) {
    RC_GPU(cudaEventRecord(computeAll_, compute_));
    RC_GPU(cudaStreamWaitEvent(commStream_, computeAll_, 0));
  }

  std::vector<Link> peers;
  for (const QueuedSend& s : sends)
    if (s.bytes > 0) peers.push_back({s.peer, true});
  if (receives) peers.push_back({receive->peer, false});
  runGroup(
      peers,
      [&](ncclComm_t comm) {
        for (const QueuedSend& s : sends) {
          if (s.bytes == 0) continue;
          const void* data = s.slot >= 0 ? sendSlot(s.slot) : s.src;
          const ncclResult_t rc =
              api_->ncclSend(data, s.bytes, ncclInt8, s.peer, comm, commStream_);
          if (!ncclPosted(rc)) return rc;
        }
        if (!receives) return ncclSuccess;
        return api_->ncclRecv(receive->dst, receive->bytes, ncclInt8, receive->peer, comm,
                              commStream_);
      },
      [&] {
        std::string what = "exchanging a message (";
        for (const QueuedSend& s : sends)
          if (s.bytes > 0) what += detail::concat("send to rank ", s.peer, "; ");
        return what + (receives ? detail::concat("receive from rank ", receive->peer, ")") : ")");
      });

  for (const QueuedSend& s : sends)
    if (s.bytes > 0 && s.slot >= 0) {
      RC_GPU(cudaEventRecord(sendFree_[s.slot], commStream_));
      sendFreePending_[s.slot] = true;
    }
  if (receives) {
    // Compute reads a slot, or may read the caller's bytes this receive wrote.
    cudaEvent_t filled = receive->slot >= 0 ? recvReady_[receive->slot] : commAll_;
    RC_GPU(cudaEventRecord(filled, commStream_));
    RC_GPU(cudaStreamWaitEvent(compute_, filled, 0));
  }
}

// -- publications (see publications.h) -----------------------------------------------------------
//   own area:    compute writes it    -> (all compute so far) -> the exchange group that sends it
//   peer copies: the exchange group   -> commAll              -> every kernel after it
// The group waits for all compute enqueued before it, so it also comes after every kernel that
// still reads the areas it overwrites (an earlier round's copies).

void NcclTransport::exchange(const std::vector<PublishOp>& ops, int phase) {
  flush();  // sends queued before it leave first, in the order their receivers expect
  RC_GPU(cudaEventRecord(computeAll_, compute_));
  RC_GPU(cudaStreamWaitEvent(commStream_, computeAll_, 0));
  std::vector<Link> peers;
  for (const PublishOp& op : ops) peers.push_back({op.peer, op.send});
  runGroup(
      peers,
      [&](ncclComm_t comm) {
        for (const PublishOp& op : ops) {
          const ncclResult_t rc =
              op.send ? api_->ncclSend(staging_ + op.offset, op.bytes, ncclInt8, op.peer, comm,
                                       commStream_)
                      : api_->ncclRecv(staging_ + op.offset, op.bytes, ncclInt8, op.peer, comm,
                                       commStream_);
          if (!ncclPosted(rc)) return rc;
        }
        return ncclSuccess;
      },
      [&] {
        return detail::concat("exchanging publications of phase ", phase, " with every rank (",
                              ops.front().bytes, " bytes each)");
      });
  RC_GPU(cudaEventRecord(commAll_, commStream_));
  RC_GPU(cudaStreamWaitEvent(compute_, commAll_, 0));
}

}  // namespace ringcomm
