// Collectives across hosts in two levels (Communicator::setLevels). all_reduce: a reduce-scatter
// inside each host over shared memory, an all_reduce of each rank's shard between hosts (one ring
// per local index, so each of a host's L ranks carries 1/L of the data over the network), then
// an all-gather inside each host. Each host sends 2(H-1)/H of the data between hosts, where a flat
// ring pushes 2(N-1)/N of it through every link that crosses hosts. Large tensors go in pieces,
// pipelined: the network carries one piece while shared memory reduces the next and gathers the
// one before (each level's calls keep one order on every rank); reduce_scatter and all_gather
// likewise, in pieces of every block. The level between hosts runs the
// request's algorithm: the ring, recursive_doubling, or auto's pick between them by size.
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/lane.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"

namespace ringcomm {
namespace {

// Bytes of one piece: big enough that a piece's three calls cost little beside its bytes,
// small enough that the first and last pieces, which nothing overlaps, are a small share.
constexpr size_t kPieceBytes = 4u << 20;

size_t hostOf(const std::vector<std::vector<int>>& hostRanks, int rank) {
  for (size_t h = 0; h < hostRanks.size(); ++h)
    if (std::find(hostRanks[h].begin(), hostRanks[h].end(), rank) != hostRanks[h].end()) return h;
  return 0;
}

size_t largestHost(const std::vector<std::vector<int>>& hostRanks) {
  size_t largest = 0;
  for (const std::vector<int>& members : hostRanks) largest = std::max(largest, members.size());
  return largest;
}

// Uneven hosts: reduce_scatter and all_gather through the leaders carry each host's group of
// blocks padded to the largest host's M ranks, so a leader sends (H-1)M blocks between hosts.
// The flat ring sends N-1 blocks over each of its links, so a host sends (N-1) per link of the
// ring that leaves it. The leaders run where their busiest host sends fewer blocks than the
// flat ring's; where it is a tie (2 hosts, the smaller of one rank: M = N-1) the flat ring
// runs, without the steps inside the host (the option uneven_leaders may say always or never).
bool leadersSendFewerBlocks(const std::vector<std::vector<int>>& hostRanks, int worldSize) {
  std::vector<int> onHost(worldSize);
  for (size_t h = 0; h < hostRanks.size(); ++h)
    for (int r : hostRanks[h]) onHost[r] = static_cast<int>(h);
  std::vector<size_t> leaving(hostRanks.size(), 0);  // the flat ring's links out of each host
  for (int r = 0; r < worldSize; ++r)
    if (onHost[r] != onHost[(r + 1) % worldSize]) ++leaving[onHost[r]];
  const size_t flat = *std::max_element(leaving.begin(), leaving.end()) * (worldSize - 1);
  return (hostRanks.size() - 1) * largestHost(hostRanks) < flat;
}

// Pieces 0..n-1 through a host's leader: `collect(k)` inside the host, `across(k)` between
// hosts on the leader's lane, `spread(k)` inside the host. The lane carries piece k while the
// host collects piece k+1 and spreads piece k-1; every rank of a host makes its calls inside
// the host in that one order.
void throughLeaders(size_t n, bool leader, const std::function<void(size_t)>& collect,
                    const std::function<void(size_t)>& across,
                    const std::function<void(size_t)>& spread, const std::function<void()>& stop) {
  if (leader && n == 1) {
    collect(0), across(0), spread(0);
    return;
  }
  std::optional<Lane> lane;
  if (leader) lane.emplace(across, stop);
  for (size_t k = 0; k < n; ++k) {
    collect(k);
    if (lane) lane->post(k);
    if (k == 0) continue;
    if (lane) lane->waitFor(k - 1);
    spread(k - 1);
  }
  if (lane) lane->waitFor(n - 1);
  spread(n - 1);
}

// A piece of a reduce_scatter or all_gather through the leaders: elements [first, first + count)
// of every block, in padded host order (host h's i-th rank's piece at (h M + i) count, M the
// largest host's ranks) at `groups`, and this host's group of them at `group`.
struct HostPiece {
  size_t first, count;
  char* groups;
  char* group;
};

// The pieces, in `scratch`: every piece's groups, then (reduce_scatter's output between
// hosts) a host group of every piece, kept apart from the groups it reduces.
std::vector<HostPiece> hostPieces(size_t count, size_t elementBytes, size_t hosts, size_t largest,
                                  size_t host, bool groupApart, std::vector<char>& scratch) {
  const size_t groupsBytes = hosts * largest * count * elementBytes;
  const size_t bytes = groupsBytes + (groupApart ? largest * count * elementBytes : 0);
  if (scratch.size() < bytes) scratch.resize(bytes);
  const size_t perPiece = std::max<size_t>(1, kPieceBytes / (elementBytes * hosts * largest));
  std::vector<HostPiece> pieces;
  for (size_t first = 0; first < count; first += perPiece) {
    const size_t n = std::min(perPiece, count - first);
    char* groups = scratch.data() + first * hosts * largest * elementBytes;
    char* group = groupApart ? scratch.data() + groupsBytes + first * largest * elementBytes
                             : groups + host * largest * n * elementBytes;
    pieces.push_back({first, n, groups, group});
  }
  return pieces;
}

}  // namespace

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

// Hosts of unequal rank counts: a reduce to the host's first rank (its leader) over shared
// memory, an all_reduce between the leaders, a broadcast from the leader. Each host sends
// 2(H-1)/H of the data between hosts, as in even levels, all through its leader. Pipelined in
// pieces (throughLeaders).
void Communicator::allReduceThroughLeaders(const CollectiveRequest& r) {
  const size_t elementBytes = dataTypeSize(r.type);
  const size_t perPiece = std::max<size_t>(1, kPieceBytes / elementBytes);
  char* tensor = static_cast<char*>(r.output);
  struct Piece {
    char* base;
    size_t count;
  };
  std::vector<Piece> pieces;
  for (size_t first = 0; first < r.count; first += perPiece)
    pieces.push_back({tensor + first * elementBytes, std::min(perPiece, r.count - first)});
  auto inHost = [&](const Piece& p, Collective collective) {
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto;
    part.collective = collective, part.output = p.base, part.input = nullptr, part.count = p.count;
    part.root = 0, part.wireType.reset();  // the leader's data stays exact until the network
    part.op = collective == Collective::Broadcast ? RedOp::Sum
              : r.op == RedOp::Avg               ? RedOp::Sum  // AVG divides once, by N
                                                 : r.op;
    runInLevel(local_, part);
  };
  auto acrossHosts = [&](size_t k) {
    CollectiveRequest part = r;  // ring, auto or recursive_doubling: the request's
    part.output = pieces[k].base, part.input = nullptr, part.count = pieces[k].count;
    part.avgDivisor = r.op == RedOp::Avg ? worldSize_ : 0;
    runInLevel(cross_, part);
  };
  const CallName call = describe(r, sequence_++, "two_level");
  collective(r.stream, call, [&] {
    throughLeaders(
        pieces.size(), cross_.comm != nullptr,
        [&](size_t k) { inHost(pieces[k], Collective::Reduce); }, acrossHosts,
        [&](size_t k) { inHost(pieces[k], Collective::Broadcast); },
        [&] { cross_.comm->abort("the all_reduce failed inside its host"); });
  });
}

void Communicator::reorderPiece(char* groups, char* ranks, size_t blockBytes, size_t offset,
                                size_t bytes, bool toGroups) {
  const size_t hosts = hostRanks_.size();
  for (size_t h = 0; h < hosts; ++h)
    for (size_t i = 0; i < hostRanks_[h].size(); ++i) {
      char* inRanks = ranks + hostRanks_[h][i] * blockBytes + offset;
      char* inGroups = groups + (i * hosts + h) * bytes;
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
  char* input = static_cast<char*>(const_cast<void*>(r.input));
  auto inHost = [&](const BlockPiece& p) {
    reorderPiece(p.groups, input, r.count * elementBytes, p.first * elementBytes,
                 p.count * elementBytes, true);
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
                 p.first * elementBytes, p.count * elementBytes, false);
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

// Uneven hosts' reduce_scatter, piece by piece: every rank puts its input's pieces in padded
// host order, the host reduces them to its leader, the leaders reduce_scatter the host groups
// (each keeps its own host's), and the leader scatters its host's pieces to their ranks. AVG
// sums inside the host and divides once, by N, between hosts. In place, piece k of this rank's
// block is written after every piece k of the input was read, and no piece reads another's.
void Communicator::reduceScatterThroughLeaders(const CollectiveRequest& r) {
  const size_t elementBytes = dataTypeSize(r.type), largest = largestHost(hostRanks_);
  const size_t hosts = hostRanks_.size(), host = hostOf(hostRanks_, rank_);
  const std::vector<HostPiece> pieces =
      hostPieces(r.count, elementBytes, hosts, largest, host, true, scratch_);
  const char* input = static_cast<const char*>(r.input);
  auto toGroups = [&](const HostPiece& p) {
    const size_t bytes = p.count * elementBytes;
    for (size_t h = 0; h < hosts; ++h)
      for (size_t i = 0; i < largest; ++i) {
        char* slot = p.groups + (h * largest + i) * bytes;
        if (i < hostRanks_[h].size())
          reducer_->copy(slot, nullptr,
                         input + (hostRanks_[h][i] * r.count + p.first) * elementBytes, bytes);
        else
          std::memset(slot, 0, bytes);  // padding: reduced, never read
      }
  };
  auto collect = [&](size_t k) {
    toGroups(pieces[k]);
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto, part.collective = Collective::Reduce, part.root = 0;
    part.output = pieces[k].groups, part.input = nullptr;
    part.count = hosts * largest * pieces[k].count;
    part.op = r.op == RedOp::Avg ? RedOp::Sum : r.op, part.wireType.reset();
    runInLevel(local_, part);
  };
  auto across = [&](size_t k) {
    CollectiveRequest part = r;  // ring, auto or recursive_doubling: the request's
    part.output = pieces[k].group, part.input = pieces[k].groups;
    part.count = largest * pieces[k].count;
    part.avgDivisor = r.op == RedOp::Avg ? worldSize_ : 0;
    runInLevel(cross_, part);
  };
  auto spread = [&](size_t k) {
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto, part.collective = Collective::Scatter, part.root = 0;
    part.op = RedOp::Sum, part.wireType.reset();
    part.input = pieces[k].group;
    part.output = static_cast<char*>(r.output) + pieces[k].first * elementBytes;
    part.count = pieces[k].count;
    runInLevel(local_, part);
  };
  const CallName call = describe(r, sequence_++, "two_level");
  collective(r.stream, call, [&] {
    throughLeaders(pieces.size(), cross_.comm != nullptr, collect, across, spread,
                   [&] { cross_.comm->abort("the reduce_scatter failed inside its host"); });
  });
}

// Uneven hosts' all_gather, piece by piece: the host gathers its ranks' pieces to its leader,
// the leaders all_gather the host groups (padded to the largest host's ranks), the leader
// broadcasts them inside the host, and every rank puts them in rank order. In place, piece k
// of this rank's block is read before rank order's piece k is written.
void Communicator::allGatherThroughLeaders(const CollectiveRequest& r) {
  const size_t elementBytes = dataTypeSize(r.type), largest = largestHost(hostRanks_);
  const size_t hosts = hostRanks_.size(), host = hostOf(hostRanks_, rank_);
  const std::vector<HostPiece> pieces =
      hostPieces(r.count, elementBytes, hosts, largest, host, false, scratch_);
  auto collect = [&](size_t k) {
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto, part.collective = Collective::Gather, part.root = 0;
    part.input = static_cast<const char*>(r.input) + pieces[k].first * elementBytes;
    part.output = pieces[k].group, part.count = pieces[k].count;
    runInLevel(local_, part);
  };
  auto across = [&](size_t k) {
    CollectiveRequest part = r;  // ring, auto or recursive_doubling: the request's
    part.input = pieces[k].group, part.output = pieces[k].groups;
    part.count = largest * pieces[k].count;
    runInLevel(cross_, part);
  };
  auto spread = [&](size_t k) {
    const HostPiece& p = pieces[k];
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto, part.collective = Collective::Broadcast, part.root = 0;
    part.output = p.groups, part.input = nullptr, part.count = hosts * largest * p.count;
    runInLevel(local_, part);
    const size_t bytes = p.count * elementBytes;
    char* output = static_cast<char*>(r.output);
    for (size_t h = 0; h < hosts; ++h)
      for (size_t i = 0; i < hostRanks_[h].size(); ++i)
        reducer_->copy(output + (hostRanks_[h][i] * r.count + p.first) * elementBytes, nullptr,
                       p.groups + (h * largest + i) * bytes, bytes);
  };
  const CallName call = describe(r, sequence_++, "two_level");
  collective(r.stream, call, [&] {
    throughLeaders(pieces.size(), cross_.comm != nullptr, collect, across, spread,
                   [&] { cross_.comm->abort("the all_gather failed inside its host"); });
  });
}

}  // namespace ringcomm
