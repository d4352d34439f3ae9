// Collectives across hosts in two levels (Communicator::setLevels). all_reduce: a reduce-scatter
// inside each host over shared memory, an all_reduce of each rank's shard between hosts (one ring
// per local index, so each of a host's L ranks carries 1/L of the data over the network), then
// an all-gather inside each host. Each host sends 2(H-1)/H of the data between hosts, where a flat
// ring pushes 2(N-1)/N of it through every link that crosses hosts. Large tensors go in pieces,
// pipelined: the network carries one piece while shared memory reduces the next and gathers the
// one before (each level's calls keep one order on every rank); reduce_scatter and all_gather
// likewise, in pieces of every block. The level between hosts runs the
// request's algorithm: the ring, recursive_doubling, or auto's pick between them by size.
// This file: setLevels, which collectives run in levels, and even hosts' collectives; hosts of
// unequal rank counts run through their leaders (two_level_uneven.cc).
#include <algorithm>

#include "core/lane.h"
#include "core/two_level.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"

namespace ringcomm {

void Communicator::setLevels(std::shared_ptr<Communicator> local,
                             std::shared_ptr<Communicator> cross,
                             std::vector<std::vector<int>> hostRanks,
                             std::optional<bool> unevenLeaders) {
  RC_CHECK(local, "two levels need a communicator inside the host");
  const size_t hosts = hostRanks.size();
  size_t ranks = 0;
  bool even = true;
  int host = -1, index = -1;
  std::vector<int> seen(worldSize_, 0);
  for (size_t h = 0; h < hosts; ++h) {
    RC_CHECK(!hostRanks[h].empty(), "host ", h, " has no ranks");
    ranks += hostRanks[h].size();
    even = even && hostRanks[h].size() == hostRanks[0].size();
    for (size_t i = 0; i < hostRanks[h].size(); ++i) {
      const int r = hostRanks[h][i];
      RC_CHECK(r >= 0 && r < worldSize_ && seen[r]++ == 0, "rank ", r,
               " is not a rank, or is on two hosts");
      if (r == rank_) host = static_cast<int>(h), index = static_cast<int>(i);
    }
  }
  RC_CHECK(ranks == static_cast<size_t>(worldSize_), "hosts of ", ranks, " ranks in all do not make ",
           worldSize_, " ranks");
  RC_CHECK(host >= 0 && local->rank() == index &&
               local->worldSize() == static_cast<int>(hostRanks[host].size()),
           "the levels do not put this rank where it is");
  // Even hosts: a level between hosts per local index. Uneven ones: one, of each host's first
  // rank (its leader), which the others do not join.
  const bool joins = even || index == 0;
  RC_CHECK(joins == (cross != nullptr), joins ? "this rank needs" : "only a host's first rank joins",
           " a communicator between hosts");
  RC_CHECK(!cross || (cross->worldSize() == static_cast<int>(hosts) && cross->rank() == host),
           "the level between hosts has ", cross ? cross->worldSize() : 0, " ranks, not the ",
           hosts, " hosts");
  local_.comm = std::move(local), local_.ranks = hostRanks[host];
  cross_.comm = std::move(cross), cross_.ranks.clear();
  for (const std::vector<int>& members : hostRanks) cross_.ranks.push_back(members[even ? index : 0]);
  hostRanks_ = std::move(hostRanks);
  host_ = static_cast<size_t>(host);
  largestHost_ = 0, hostFirst_.assign(hosts, 0);
  for (size_t h = 0; h < hosts; ++h) {
    largestHost_ = std::max(largestHost_, hostRanks_[h].size());
    if (h > 0) hostFirst_[h] = hostFirst_[h - 1] + hostRanks_[h - 1].size();
  }
  unevenHosts_ = !even;
  blocksThroughLeaders_ = unevenLeaders.value_or(leadersSendFewerBlocks(hostRanks_, worldSize_));
}

bool Communicator::runsInTwoLevels(const CollectiveRequest& r) const {
  if (!local_.comm || r.count == 0) return false;
  switch (r.collective) {
    case Collective::AllReduce:
      // Fewer elements than a host has ranks leave a rank no shard: the flat ring runs them
      // (uneven hosts shard nothing: their leaders carry whole pieces).
      if (!unevenHosts_ && r.count < static_cast<size_t>(local_.comm->worldSize())) return false;
      break;
    case Collective::ReduceScatter:
    case Collective::AllGather:
      if (unevenHosts_ && !blocksThroughLeaders_) return false;
      break;
    default:
      return false;
  }
  // An algorithm between hosts runs in the level between hosts (acrossHosts).
  if (r.algorithm == Algorithm::RecursiveDoubling) return true;
  const size_t blocks = r.collective == Collective::AllReduce ? 1 : worldSize_;
  return resolveAlgorithm(r.algorithm, r.collective, r.count * blocks * dataTypeSize(r.type)) ==
         Algorithm::Ring;
}

Algorithm Communicator::flatAlgorithm(Algorithm requested) const {
  // This communicator's own ring links neighbours only: what the levels do not run (fewer
  // elements than a host has ranks) takes the ring there.
  return local_.comm && requested == Algorithm::RecursiveDoubling ? Algorithm::Ring : requested;
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

void Communicator::allReduceInTwoLevels(const CollectiveRequest& r) {
  if (unevenHosts_) return allReduceThroughLeaders(r);
  const size_t hostRanks = local_.comm->worldSize();
  const size_t head = r.count / hostRanks * hostRanks;
  const size_t elementBytes = dataTypeSize(r.type);
  char* tensor = static_cast<char*>(r.output);
  if (head < r.count) {  // what does not split evenly (fewer than L elements): the flat ring
    CollectiveRequest rest = r;
    rest.algorithm = flatAlgorithm(r.algorithm);
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
    CollectiveRequest part = r;  // ring, auto or recursive_doubling: the request's, between hosts
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
  const CallName call = describe(r, sequence_++, "two_level");
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

void Communicator::reorderPiece(char* groups, char* ranks, size_t blockBytes, size_t offset,
                                size_t bytes, bool toGroups, const Slot& slot) {
  for (size_t h = 0; h < hostRanks_.size(); ++h)
    for (size_t i = 0; i < hostRanks_[h].size(); ++i) {
      char* inRanks = ranks + hostRanks_[h][i] * blockBytes + offset;
      char* inGroups = groups + slot(h, i) * bytes;
      if (toGroups) reducer_->copy(inGroups, nullptr, inRanks, bytes);
      else reducer_->copy(inRanks, nullptr, inGroups, bytes);
    }
}

std::vector<Communicator::BlockPiece> Communicator::blockPieces(const CollectiveRequest& r) {
  const size_t elementBytes = dataTypeSize(r.type), hosts = hostRanks_.size();
  if (scratch_.size() < worldSize_ * r.count * elementBytes)
    scratch_.resize(worldSize_ * r.count * elementBytes);
  // Every rank's blocks' pieces together make about kPieceBytes.
  const size_t perPiece = std::max<size_t>(1, kPieceBytes / (elementBytes * worldSize_));
  std::vector<BlockPiece> pieces;
  for (size_t first = 0; first < r.count; first += perPiece) {
    const size_t count = std::min(perPiece, r.count - first);
    char* groups = scratch_.data() + first * worldSize_ * elementBytes;  // earlier pieces are whole
    pieces.push_back({first, count, groups, groups + local_.comm->rank() * hosts * count * elementBytes});
  }
  return pieces;
}

// reduce_scatter, piece by piece (elements [first, first + count) of every block): the pieces
// in group order (each local index's H pieces together), reduced inside the host (this rank
// keeps its local index's group), then between hosts (it keeps its own block's piece). Each
// host sends (H-1)/H of the data between hosts; the lane carries piece k between hosts while
// the host reduces piece k+1.
void Communicator::reduceScatterInTwoLevels(const CollectiveRequest& r) {
  if (unevenHosts_) return reduceScatterThroughLeaders(r);
  const size_t elementBytes = dataTypeSize(r.type), hosts = hostRanks_.size();
  const std::vector<BlockPiece> pieces = blockPieces(r);
  const Slot groupOrder = [hosts](size_t h, size_t i) { return i * hosts + h; };
  char* input = static_cast<char*>(const_cast<void*>(r.input));
  auto inHost = [&](const BlockPiece& p) {
    reorderPiece(p.groups, input, r.count * elementBytes, p.first * elementBytes,
                 p.count * elementBytes, true, groupOrder);
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto;
    part.output = p.mine, part.input = p.groups, part.count = hosts * p.count;
    part.op = r.op == RedOp::Avg ? RedOp::Sum : r.op;  // AVG divides once, by N
    runInLevel(local_, part);
  };
  auto acrossHosts = [&](size_t k) {
    CollectiveRequest part = r;  // ring, auto or recursive_doubling: the request's
    part.output = static_cast<char*>(r.output) + pieces[k].first * elementBytes;
    part.input = pieces[k].mine, part.count = pieces[k].count;
    part.avgDivisor = r.op == RedOp::Avg ? worldSize_ : 0;
    runInLevel(cross_, part);
  };
  const CallName call = describe(r, sequence_++, "two_level");
  collective(r.stream, call, [&] {
    if (pieces.size() == 1) {
      inHost(pieces[0]), acrossHosts(0);
      return;
    }
    Lane lane(acrossHosts,
              [&] { cross_.comm->abort("the two-level reduce_scatter failed inside its host"); });
    for (size_t k = 0; k < pieces.size(); ++k) inHost(pieces[k]), lane.post(k);
    lane.waitFor(pieces.size() - 1);
  });
}

// all_gather, piece by piece: between hosts first (this rank's local index's group), then
// inside the host (every group), then from group order into rank order; the lane runs ahead
// between hosts while the host gathers the pieces that arrived. In place, piece k of the input
// is read before rank order's piece k is written, and no piece reads another's.
void Communicator::allGatherInTwoLevels(const CollectiveRequest& r) {
  if (unevenHosts_) return allGatherThroughLeaders(r);
  const size_t elementBytes = dataTypeSize(r.type), hosts = hostRanks_.size();
  const std::vector<BlockPiece> pieces = blockPieces(r);
  const Slot groupOrder = [hosts](size_t h, size_t i) { return i * hosts + h; };
  auto acrossHosts = [&](size_t k) {
    CollectiveRequest part = r;  // ring, auto or recursive_doubling: the request's
    part.input = static_cast<const char*>(r.input) + pieces[k].first * elementBytes;
    part.output = pieces[k].mine, part.count = pieces[k].count;
    runInLevel(cross_, part);
  };
  auto inHost = [&](const BlockPiece& p) {
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto;
    part.output = p.groups, part.input = p.mine, part.count = hosts * p.count;
    runInLevel(local_, part);
    reorderPiece(p.groups, static_cast<char*>(r.output), r.count * elementBytes,
                 p.first * elementBytes, p.count * elementBytes, false, groupOrder);
  };
  const CallName call = describe(r, sequence_++, "two_level");
  collective(r.stream, call, [&] {
    if (pieces.size() == 1) {
      acrossHosts(0), inHost(pieces[0]);
      return;
    }
    Lane lane(acrossHosts,
              [&] { cross_.comm->abort("the two-level all_gather failed inside its host"); });
    lane.post(pieces.size() - 1);  // every piece: the network runs ahead
    for (size_t k = 0; k < pieces.size(); ++k) lane.waitFor(k), inHost(pieces[k]);
  });
}

}  // namespace ringcomm
