// Communicator: one rank's handle on a ring. Checks arguments, builds the plan, maps the caller's
// buffers onto the plan's logical buffer and runs it. Device-agnostic: the transport and reducer
// decide where bytes live. After any failure it refuses further use (peers may be mid-step).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ringcomm/algorithms.h"
#include "ringcomm/executor.h"
#include "ringcomm/flight_recorder.h"
#include "ringcomm/plan_cache.h"
#include "ringcomm/reducer.h"
#include "ringcomm/schedule.h"
#include "ringcomm/transport.h"

namespace ringcomm {

// Set by the caller (the Python layer passes CommOptions' resolved values).
struct CommunicatorOptions {
  size_t sliceBytes = 0;
  AlgorithmThresholds thresholds;  // what Auto picks (algorithms.h)
};

// One collective call, as NCCL's ncclInfo: what Communicator::run takes for every collective
// (kCollectives' planned rows). Addresses are raw device or host addresses; `count` counts
// elements of `type` in the buffer kCollectives' layout names: the tensor an in-place collective
// works on, else this rank's block. Fields a collective does not use keep their defaults.
struct CollectiveRequest {
  Collective collective = Collective::AllReduce;
  // In place (all_reduce, broadcast, reduce): the tensor is `output`, `input` null or the same.
  // Rooted gather and scatter use their whole-buffer side on the root only.
  void* output = nullptr;
  const void* input = nullptr;
  size_t count = 0;
  DataType type = DataType::Float32;
  RedOp op = RedOp::Sum;  // collectives that reduce
  int root = 0;           // rooted collectives: src (broadcast, scatter) or dst (reduce, gather)
  // Ring, OneShot, TwoShot, RecursiveDoubling (kAlgorithms says which collectives each plans) or Auto
  // (chooseAlgorithm with the options' thresholds). Every rank must pass the same.
  Algorithm algorithm = Algorithm::Ring;
  // What travels between ranks, where kCollectives allows a wire (all_reduce): float16 or
  // bfloat16 under float32 data halves the bytes while every hop still adds in float32.
  std::optional<DataType> wireType;
  // On a device transport the caller's cudaStream_t as an integer: the collective is ordered on
  // it and the host does not wait. Host transports ignore it.
  uintptr_t stream = 0;
  // AVG divides by this instead of the world size (0): a level of a two-level all_reduce
  // divides by the whole world's size, once.
  int avgDivisor = 0;
  // A device transport may record the call as a graph at the second call with this tag and
  // replay it: every rank passes the same tags, on buffers that stay the same from the second
  // call on (DDP's buckets). -1: never recorded.
  int64_t replayTag = -1;
};

// One send or receive of a batch (Communicator::sendRecvBatch).
struct PointToPointOp {
  bool send = false;     // else a receive
  void* data = nullptr;  // a send only reads it
  size_t count = 0;      // elements of `type`
  DataType type = DataType::Float32;
  int peer = -1;
  int tag = 0;
};

class Communicator {
 public:
  // Shared ownership so the Python layer can build the transport (it needs a name exchange
  // first) and hand it over.
  Communicator(int rank, int worldSize, std::shared_ptr<Transport> transport,
               std::shared_ptr<Reducer> reducer, CommunicatorOptions options);

  int rank() const { return rank_; }
  int worldSize() const { return worldSize_; }
  uint64_t sequence() const { return sequence_; }
  // What the ring's transport and the point-to-point links moved, summed (Transport::traffic).
  TrafficStats traffic() const;
  void resetTraffic();
  // Why it failed or was aborted; empty while it is usable.
  std::string failure() const;

  // Runs one collective. A bad request raises before anything is sent and leaves the
  // communicator usable; a failure while running poisons it (peers may be mid-step).
  void run(const CollectiveRequest& request);
  // The algorithm a collective of `bytes` (see chooseAlgorithm) runs with when `requested`:
  // depends only on what every rank shares, so all ranks agree. Raises (before anything is
  // sent) for an algorithm that does not plan the collective or cannot run on the transport.
  Algorithm resolveAlgorithm(Algorithm requested, Collective collective, size_t bytes) const;

  // Point-to-point and all-to-all (csrc/core/point_to_point.cc) run over `links`, a transport
  // that reaches every rank (the ring's reaches only its neighbours). Messages of one pair of
  // ranks are matched in order: a send's tag and count must equal the matching recv's (checked
  // on links that carry envelopes; NCCL carries none). `stream` as for collectives: on links
  // that move user buffers (NCCL) every call is stream-ordered, and a send completes only
  // together with its matching recv, as NCCL's do.
  void setPeerLinks(std::shared_ptr<Transport> links);
  void send(const void* data, size_t count, DataType type, int peer, int tag,
            uintptr_t stream = 0);
  void recv(void* data, size_t count, DataType type, int peer, int tag, uintptr_t stream = 0);
  // Several sends and receives, to and from any peers, as one unit, so that their order on a
  // rank does not matter (each pair's messages still match in order, as send and recv do, and a
  // batch's messages pair with single sends and receives too). On links that move user
  // buffers (NCCL) they are one group, ordered on `stream`; on staging links (shared memory)
  // they move one piece of every (peer, direction) per round, which waits in no cycle where
  // every rank's batch holds its pairs' matching messages. A receive's buffer must not
  // overlap another operation's: raised before anything is sent.
  void sendRecvBatch(const std::vector<PointToPointOp>& ops, uintptr_t stream = 0);
  // input holds sendCounts[p] elements for each rank p in rank order; output receives
  // recvCounts[p] from each rank p in rank order (this rank's block is copied locally).
  void allToAll(void* output, const void* input, const std::vector<size_t>& sendCounts,
                const std::vector<size_t>& recvCounts, DataType type, uintptr_t stream = 0);

  // Ranks grouped by host (the CPU path across hosts): `local` joins this host's ranks (shared
  // memory), `cross` the ranks with this rank's local index on every host (the network), and
  // all_reduce, reduce_scatter and all_gather run in two levels over them (csrc/core/
  // two_level.cc; uneven hosts: two_level_uneven.cc) while every other call runs on this
  // communicator's own ring.
  // hostRanks[h][i]: the rank of host h's i-th rank in this communicator (local is host h's,
  // in that order; cross has host h's member as its rank h). Hosts of unequal rank counts:
  // `cross` joins each host's first rank (its leader) and is null on the others: all_reduce
  // runs through the leaders, and so do reduce_scatter and all_gather where that sends fewer
  // bytes between hosts than the flat ring (`unevenLeaders` unset; true: always; false: never).
  // A host path: buffers are host memory.
  void setLevels(std::shared_ptr<Communicator> local, std::shared_ptr<Communicator> cross,
                 std::vector<std::vector<int>> hostRanks,
                 std::optional<bool> unevenLeaders = std::nullopt);

  // Keeps the last `calls` calls (flight_recorder.h; 0: none): flightRecord() returns them, and
  // an error a call raises ends with the last few.
  void setTraceBuffer(size_t calls);
  std::vector<CallRecord> flightRecord(size_t newest = SIZE_MAX) const {
    return recorder_->snapshot(newest);
  }
  // Called on the failing thread once a call has failed and is recorded (to write the record
  // out); what it raises is ignored.
  void setFailureHook(std::function<void()> hook) { onFailure_ = std::move(hook); }

  void setSliceBytes(size_t bytes);
  size_t sliceBytes() const { return options_.sliceBytes; }
  // Makes every wait of this communicator, on any thread, and every peer's fail promptly (peers
  // get a PeerError naming this rank and `why`), and this communicator refuse further use.
  // Unlike the rest, callable while another thread runs a collective: a Python thread that
  // waits for the worker running one and is interrupted (Ctrl-C) stops it this way.
  void abort(const std::string& why);
  void close();

 private:
  void checkUsable() const;
  // Raises, naming the field, for a request no rank of this communicator can run.
  void checkRequest(const CollectiveRequest& request) const;
  // Checks op and types, and fills the collective's spec and sequence number.
  void prepare(PlannedCollective& collective, RedOp op, DataType type, DataType wireType,
               int avgDivisor = 0);
  // One level of a two-level collective: its communicator and its members' ranks here.
  struct Level {
    std::shared_ptr<Communicator> comm;
    std::vector<int> ranks;
    const char* where;  // "inside this host", for errors
  };
  bool runsInTwoLevels(const CollectiveRequest& request) const;
  // The algorithm a request runs with on this communicator's own ring when it has levels: an
  // algorithm between hosts (recursive_doubling) takes the ring there.
  Algorithm flatAlgorithm(Algorithm requested) const;
  void allReduceInTwoLevels(const CollectiveRequest& request);
  // Uneven hosts: through each host's first rank.
  void allReduceThroughLeaders(const CollectiveRequest& request);
  void reduceScatterThroughLeaders(const CollectiveRequest& request);
  void allGatherThroughLeaders(const CollectiveRequest& request);
  void reduceScatterInTwoLevels(const CollectiveRequest& request);
  void allGatherInTwoLevels(const CollectiveRequest& request);
  // Where a layout puts host h's i-th rank's piece, in pieces: (i * H + h) for even levels'
  // group order (each local index's pieces together), hostFirst_[h] + i for host order, h * M
  // + i for host order padded to the largest host's M ranks.
  using Slot = std::function<size_t(size_t host, size_t index)>;
  // Copies piece [offset, offset + bytes) of every rank's block of `blockBytes` between rank
  // order in `ranks` and the layout `slot` in `groups` (host h's i-th rank's piece at
  // slot(h, i) * bytes).
  void reorderPiece(char* groups, char* ranks, size_t blockBytes, size_t offset, size_t bytes,
                    bool toGroups, const Slot& slot);
  // A two-level reduce_scatter or all_gather in pieces: elements [first, first + count) of
  // every block, their group order in the scratch (`groups`), this rank's group in it (`mine`).
  struct BlockPiece {
    size_t first = 0, count = 0;
    char* groups = nullptr;
    char* mine = nullptr;
  };
  std::vector<BlockPiece> blockPieces(const CollectiveRequest& request);
  // Runs `part` on `level`, naming the level and its ranks in any error.
  void runInLevel(const Level& level, const CollectiveRequest& part);
  // begin(stream, call), body, end(); on failure records it and aborts the transport.
  void collective(uintptr_t stream, const CallName& call, const std::function<void()>& body);
  // begin(stream, call), body, end() on `transport`; on failure records it and aborts every
  // transport.
  void bracket(Transport& transport, uintptr_t stream, const CallName& call,
               const std::function<void()>& body);
  // Runs the plan (inside collective()).
  void execute(const PlannedCollective& collective);
  Transport& peerLinks();
  // begin(stream, call), body, end() on the peer links; on failure aborts every transport.
  void overLinks(uintptr_t stream, const CallName& call, const std::function<void()>& body);
  // One pair's message, in slot-sized pieces; `other` sends or receives at the same time
  // (all-to-all), interleaved piece by piece so that neither side waits for the other's end.
  struct PairMessage;
  void exchange(PairMessage* out, PairMessage* in);
  void sendPiece(Transport& links, const PairMessage& message, size_t piece);
  void recvPiece(Transport& links, const PairMessage& message, size_t piece);
  // A batch's messages over staging links (sendRecvBatch).
  void exchangeBatch(Transport& links, const std::vector<PointToPointOp>& ops,
                     const std::vector<PairMessage>& messages);
  void failed(const std::string& why);  // records the failure, aborts every transport
  void reportFailure() noexcept;  // runs the failure hook
  // A collective request as its flight record names it.
  CallName describe(const CollectiveRequest& request, uint64_t sequence,
                    const char* algorithm) const;

  int rank_, worldSize_;
  std::shared_ptr<Transport> transport_;
  std::shared_ptr<Reducer> reducer_;
  CommunicatorOptions options_;
  uint64_t sequence_ = 0;
  bool closed_ = false;
  std::string failure_;
  std::atomic<bool> aborted_{false};
  // Guards abortReason_, and transport_ and links_ against close() while abort() reads them
  // (the data path, on the one thread that runs collectives, needs no lock).
  mutable std::mutex abortMutex_;
  std::string abortReason_;
  std::shared_ptr<Transport> links_;
  Level local_{nullptr, {}, "inside this host"}, cross_{nullptr, {}, "between hosts"};
  std::vector<std::vector<int>> hostRanks_;
  size_t host_ = 0;             // this rank's host, in hostRanks_
  size_t largestHost_ = 0;      // the largest host's ranks (M)
  std::vector<size_t> hostFirst_;  // host h's first rank's place in host order
  bool unevenHosts_ = false;  // hosts of unequal rank counts: one level between their leaders
  bool blocksThroughLeaders_ = false;  // uneven: reduce_scatter and all_gather through them too
  // Shared with a device transport, which marks calls done from its own thread.
  std::shared_ptr<FlightRecorder> recorder_ = std::make_shared<FlightRecorder>();
  FlightRecorder::Entry* current_ = nullptr;  // the running call's entry (the data thread's)
  std::function<void()> onFailure_;
  PlanCache plans_;  // the data path's, like scratch_
  Executor::Scratch executorScratch_;
  std::vector<char> scratch_;  // two-level reduce_scatter and all_gather's blocks, or a
                               // recursive-halving reduce_scatter's input; kept

  std::vector<uint64_t> sent_, received_;  // messages per peer: their envelopes' sequence
};

}  // namespace ringcomm
