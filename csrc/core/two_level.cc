// all_reduce across hosts in two levels (Communicator::setLevels): a reduce-scatter inside each
// host over shared memory, an all_reduce of each rank's shard between hosts (one ring per local
// index, so each of a host's L ranks carries 1/L of the data over the network), then an
// all-gather inside each host. Each host sends 2(H-1)/H of the data between hosts, where a flat
// ring pushes 2(N-1)/N of it through every link that crosses hosts. Large tensors go in pieces,
// pipelined: the network carries one piece while shared memory reduces the next and gathers the
// one before (each level's calls keep one order on every rank).
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "ringcomm/communicator.h"
#include "ringcomm/error.h"

namespace ringcomm {
namespace {

// Bytes of one piece: big enough that a piece's three calls cost little beside its bytes,
// small enough that the first and last pieces, which nothing overlaps, are a small share.
constexpr size_t kPieceBytes = 4u << 20;

// Runs `step(k)` for k = 0, 1, ... in order on a thread of its own, as each is posted; `stop`
// makes a running step fail (the level's abort) when the caller gives up early.
class Lane {
 public:
  Lane(std::function<void(size_t)> step, std::function<void()> stop)
      : step_(std::move(step)), stop_(std::move(stop)), thread_([this] { loop(); }) {}
  ~Lane() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_ < posted_ && !error_) stop_();  // the caller failed: end the running step
      closing_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void post(size_t k) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      posted_ = k + 1;
    }
    changed_.notify_all();
  }
  // Waits until step k has run; rethrows what a step raised.
  void waitFor(size_t k) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ > k || error_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return closing_ || done_ < posted_; });
      if (done_ >= posted_ || error_) return;
      const size_t k = done_;
      lock.unlock();
      std::exception_ptr failed;
      try {
        step_(k);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed) error_ = failed;
      else ++done_;
      changed_.notify_all();
      if (failed) return;
    }
  }

  std::function<void(size_t)> step_;
  std::function<void()> stop_;
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t posted_ = 0, done_ = 0;
  bool closing_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace

void Communicator::setLevels(std::shared_ptr<Communicator> local, std::vector<int> localRanks,
                             std::shared_ptr<Communicator> cross, std::vector<int> crossRanks) {
  RC_CHECK(local && cross, "two levels need a communicator for each");
  RC_CHECK(static_cast<int>(localRanks.size()) == local->worldSize() &&
               static_cast<int>(crossRanks.size()) == cross->worldSize(),
           "each level needs the ranks of its members, one per member");
  RC_CHECK(local->worldSize() * cross->worldSize() == worldSize_, "levels of ",
           local->worldSize(), " ranks per host and ", cross->worldSize(), " hosts do not make ",
           worldSize_, " ranks");
  RC_CHECK(localRanks[local->rank()] == rank_ && crossRanks[cross->rank()] == rank_,
           "this rank is not the levels' own member");
  local_.comm = std::move(local), local_.ranks = std::move(localRanks);
  cross_.comm = std::move(cross), cross_.ranks = std::move(crossRanks);
}

bool Communicator::runsInTwoLevels(const CollectiveRequest& r) const {
  // Fewer elements than a host has ranks leave a rank no shard: the flat ring runs them.
  return local_.comm && r.collective == Collective::AllReduce &&
         r.count >= static_cast<size_t>(local_.comm->worldSize()) &&
         resolveAlgorithm(r.algorithm, r.collective, r.count * dataTypeSize(r.type)) ==
             Algorithm::Ring;
}

void Communicator::runInLevel(const Level& level, const CollectiveRequest& part) {
  try {
    level.comm->run(part);
  } catch (const Error& e) {
    std::string members;
    for (int r : level.ranks) members += (members.empty() ? "" : ", ") + std::to_string(r);
    rethrowWithPrefix(e, detail::concat(level.where, " (ranks ", members,
                                        "; rank k there is the k-th of these): "));
  }
}

void Communicator::runInTwoLevels(const CollectiveRequest& r) {
  const size_t hostRanks = local_.comm->worldSize();
  const size_t head = r.count / hostRanks * hostRanks;
  const size_t elementBytes = dataTypeSize(r.type);
  char* tensor = static_cast<char*>(r.output);
  if (head < r.count) {  // what does not split evenly (fewer than L elements): the flat ring
    CollectiveRequest rest = r;
    rest.output = tensor + head * elementBytes;
    rest.input = nullptr;
    rest.count = r.count - head;
    run(rest);
  }
  // Pieces of the even head, each a multiple of the host's rank count.
  const size_t perPiece = std::max<size_t>(1, kPieceBytes / (elementBytes * hostRanks)) * hostRanks;
  struct Piece {
    char* base;
    size_t shard;  // elements of each rank's shard of it
    char* mine;    // this rank's shard
  };
  std::vector<Piece> pieces;
  for (size_t first = 0; first < head; first += perPiece) {
    const size_t shardCount = std::min(perPiece, head - first) / hostRanks;
    char* base = tensor + first * elementBytes;
    pieces.push_back({base, shardCount, base + local_.comm->rank() * shardCount * elementBytes});
  }
  // AVG sums in the levels and divides once, by this communicator's world size.
  const RedOp sum = r.op == RedOp::Avg ? RedOp::Sum : r.op;
  auto reduceScatter = [&](const Piece& p) {
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto;
    part.collective = Collective::ReduceScatter, part.output = p.mine, part.input = p.base;
    part.count = p.shard, part.op = sum;
    runInLevel(local_, part);
  };
  auto acrossHosts = [&](const Piece& p) {
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto;
    part.collective = Collective::AllReduce, part.output = p.mine, part.input = nullptr;
    part.count = p.shard;
    part.avgDivisor = r.op == RedOp::Avg ? worldSize_ : 0;
    runInLevel(cross_, part);
  };
  auto allGather = [&](const Piece& p) {
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto;
    part.collective = Collective::AllGather, part.output = p.base, part.input = p.mine;
    part.count = p.shard, part.op = RedOp::Sum, part.wireType.reset();
    runInLevel(local_, part);
  };
  CallName call{"all_reduce", sequence_++, true};
  collective(r.stream, call, [&] {
    if (pieces.size() == 1) {
      reduceScatter(pieces[0]), acrossHosts(pieces[0]), allGather(pieces[0]);
      return;
    }
    // This thread runs the host's level (piece k's reduce-scatter, then piece k-1's
    // all-gather), the lane the network's, one piece behind.
    Lane lane([&](size_t k) { acrossHosts(pieces[k]); },
              [&] { cross_.comm->abort("the two-level all_reduce failed inside its host"); });
    for (size_t k = 0; k < pieces.size(); ++k) {
      reduceScatter(pieces[k]);
      lane.post(k);
      if (k > 0) lane.waitFor(k - 1), allGather(pieces[k - 1]);
    }
    lane.waitFor(pieces.size() - 1);
    allGather(pieces.back());
  });
}

}  // namespace ringcomm
