// all_reduce across hosts in two levels (Communicator::setLevels): a reduce-scatter inside each
// host over shared memory, an all_reduce of each rank's shard between hosts (one ring per local
// index, so each of a host's L ranks carries 1/L of the data over the network), then an
// all-gather inside each host. Each host sends 2(H-1)/H of the data between hosts, where a flat
// ring pushes 2(N-1)/N of it through every link that crosses hosts.
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"

namespace ringcomm {

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
  const size_t shard = r.count / hostRanks, head = shard * hostRanks;
  const size_t elementBytes = dataTypeSize(r.type);
  char* tensor = static_cast<char*>(r.output);
  if (head < r.count) {  // what does not split evenly (fewer than L elements): the flat ring
    CollectiveRequest rest = r;
    rest.output = tensor + head * elementBytes;
    rest.input = nullptr;
    rest.count = r.count - head;
    run(rest);
  }
  char* mine = tensor + local_.comm->rank() * shard * elementBytes;
  // AVG sums in the levels and divides once, by this communicator's world size.
  const RedOp sum = r.op == RedOp::Avg ? RedOp::Sum : r.op;
  CallName call{"all_reduce", sequence_++, true};
  collective(r.stream, call, [&] {
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto;
    part.collective = Collective::ReduceScatter, part.output = mine, part.input = tensor;
    part.count = shard, part.op = sum;
    runInLevel(local_, part);
    part.collective = Collective::AllReduce, part.input = nullptr, part.op = r.op;
    part.avgDivisor = r.op == RedOp::Avg ? worldSize_ : 0;
    runInLevel(cross_, part);
    part.collective = Collective::AllGather, part.output = tensor, part.input = mine;
    part.op = RedOp::Sum, part.wireType.reset(), part.avgDivisor = 0;
    runInLevel(local_, part);
  });
}

}  // namespace ringcomm
