// Two levels on hosts of unequal rank counts (Communicator::setLevels; even hosts and the
// entry points: two_level.cc): one level between hosts, of each host's first rank (its leader).
// all_reduce: a reduce onto the leader, an all_reduce between the leaders, a broadcast.
// reduce_scatter and all_gather (where the byte rule or the option uneven_leaders takes them
// here): every host's ranks share the host's work (a reduce-scatter inside the host, a gather
// of the shards onto the leader; all_gather: a broadcast of the real blocks only), and the
// leaders exchange each host's blocks padded to the largest host's. Pipelined in pieces
// (throughLeaders): the leader's lane carries piece k between hosts while the host works on
// the pieces beside it.
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/lane.h"
#include "core/two_level.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"

namespace ringcomm {

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
  size_t largest = 0;
  for (const std::vector<int>& members : hostRanks) largest = std::max(largest, members.size());
  return (hostRanks.size() - 1) * largest < flat;
}

namespace {

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
// of every block. `groups` holds them in host order (host h's i-th rank's piece at slot
// hostFirst[h] + i) or, on a leader between hosts, padded host order (at h M + i, M the largest
// host's ranks); `group` is this host's group in padded order (reduce_scatter's output between
// hosts: kept apart from the groups it reduces). `share`: each local rank's shard of host order
// inside the host (reduce_scatter: host order padded to L shards, L the host's ranks).
struct HostPiece {
  size_t first, count;
  char* groups;
  char* group;
  size_t share;
};

// The pieces, in `scratch`: every piece's groups (room for the padded order, and for host
// order's L shards), then (groupApart) a host group of every piece.
std::vector<HostPiece> hostPieces(size_t count, size_t elementBytes, size_t hosts, size_t largest,
                                  size_t host, size_t ranks, size_t localRanks, bool groupApart,
                                  std::vector<char>& scratch) {
  const size_t perPiece = std::max<size_t>(1, kPieceBytes / (elementBytes * hosts * largest));
  std::vector<HostPiece> pieces;
  std::vector<size_t> at;  // each piece's groups, in elements from the scratch's start
  size_t elements = 0;
  for (size_t first = 0; first < count; first += perPiece) {
    const size_t n = std::min(perPiece, count - first);
    const size_t share = (ranks * n + localRanks - 1) / localRanks;
    pieces.push_back({first, n, nullptr, nullptr, share});
    at.push_back(elements);
    elements += std::max(hosts * largest * n, localRanks * share);
  }
  const size_t groupsEnd = elements;
  if (groupApart) elements += largest * count;
  if (scratch.size() < elements * elementBytes) scratch.resize(elements * elementBytes);
  for (size_t k = 0; k < pieces.size(); ++k) {
    HostPiece& p = pieces[k];
    p.groups = scratch.data() + at[k] * elementBytes;
    p.group = groupApart ? scratch.data() + (groupsEnd + largest * p.first) * elementBytes
                         : p.groups + host * largest * p.count * elementBytes;
  }
  return pieces;
}

// Host order to padded host order in place (each host's pieces moved to h M, from the last
// host's down, and the padding zeroed: reduced between hosts, never read), and back.
void toPadded(char* groups, const std::vector<std::vector<int>>& hostRanks,
              const std::vector<size_t>& hostFirst, size_t largest, size_t bytes) {
  for (size_t h = hostRanks.size(); h-- > 0;) {
    const size_t n = hostRanks[h].size();
    char* to = groups + h * largest * bytes;
    if (h * largest != hostFirst[h]) std::memmove(to, groups + hostFirst[h] * bytes, n * bytes);
    std::memset(to + n * bytes, 0, (largest - n) * bytes);
  }
}

void toHostOrder(char* groups, const std::vector<std::vector<int>>& hostRanks,
                 const std::vector<size_t>& hostFirst, size_t largest, size_t bytes) {
  for (size_t h = 0; h < hostRanks.size(); ++h)
    if (h * largest != hostFirst[h])
      std::memmove(groups + hostFirst[h] * bytes, groups + h * largest * bytes,
                   hostRanks[h].size() * bytes);
}

}  // namespace

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

// Uneven hosts' reduce_scatter, piece by piece: every rank puts its input's pieces in host
// order (no padding), the host reduce-scatters them (each of its L ranks reduces 1/L) and
// gathers the shards onto its leader, which pads them to the largest host's M ranks; the leaders
// reduce_scatter the host groups (each keeps its own host's), and the leader scatters its host's
// pieces to their ranks. A host of one rank skips the steps inside it. AVG sums inside the host
// and divides once, by N, between hosts. In place, piece k of this rank's block is written after
// every piece k of the input was read, and no piece reads another's.
void Communicator::reduceScatterThroughLeaders(const CollectiveRequest& r) {
  const size_t elementBytes = dataTypeSize(r.type), hosts = hostRanks_.size();
  const size_t localRanks = local_.ranks.size(), index = local_.comm->rank();
  const bool leader = cross_.comm != nullptr;
  const std::vector<HostPiece> pieces = hostPieces(r.count, elementBytes, hosts, largestHost_, host_,
                                                   worldSize_, localRanks, true, scratch_);
  char* input = static_cast<char*>(const_cast<void*>(r.input));
  const Slot hostOrder = [this](size_t h, size_t i) { return hostFirst_[h] + i; };
  auto collect = [&](size_t k) {
    const HostPiece& p = pieces[k];
    const size_t bytes = p.count * elementBytes;
    reorderPiece(p.groups, input, r.count * elementBytes, p.first * elementBytes, bytes, true,
                 hostOrder);
    if (localRanks > 1) {
      const size_t real = worldSize_ * p.count;  // the last shard's rest: fewer than L elements
      std::memset(p.groups + real * elementBytes, 0, (localRanks * p.share - real) * elementBytes);
      CollectiveRequest part = r;
      part.algorithm = Algorithm::Auto, part.root = 0, part.wireType.reset();
      part.collective = Collective::ReduceScatter;
      part.op = r.op == RedOp::Avg ? RedOp::Sum : r.op;
      part.input = p.groups, part.output = p.groups + index * p.share * elementBytes;
      part.count = p.share;
      runInLevel(local_, part);
      part.collective = Collective::Gather, part.op = RedOp::Sum;
      part.input = part.output, part.output = p.groups;
      runInLevel(local_, part);
    }
    if (leader) toPadded(p.groups, hostRanks_, hostFirst_, largestHost_, bytes);
  };
  auto across = [&](size_t k) {
    CollectiveRequest part = r;  // ring, auto or recursive_doubling: the request's
    part.output = pieces[k].group, part.input = pieces[k].groups;
    part.count = largestHost_ * pieces[k].count;
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
    throughLeaders(pieces.size(), leader, collect, across, spread,
                   [&] { cross_.comm->abort("the reduce_scatter failed inside its host"); });
  });
}

// Uneven hosts' all_gather, piece by piece: the host gathers its ranks' pieces to its leader,
// the leaders all_gather the host groups (padded to the largest host's ranks), the leader puts
// them in host order (the padding left out) and broadcasts them inside the host, and every rank
// puts them in rank order. In place, piece k of this rank's block is read before rank order's
// piece k is written.
void Communicator::allGatherThroughLeaders(const CollectiveRequest& r) {
  const size_t elementBytes = dataTypeSize(r.type), hosts = hostRanks_.size();
  const bool leader = cross_.comm != nullptr;
  const std::vector<HostPiece> pieces =
      hostPieces(r.count, elementBytes, hosts, largestHost_, host_, worldSize_,
                 local_.ranks.size(), false, scratch_);
  const Slot hostOrder = [this](size_t h, size_t i) { return hostFirst_[h] + i; };
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
    part.count = largestHost_ * pieces[k].count;
    runInLevel(cross_, part);
  };
  auto spread = [&](size_t k) {
    const HostPiece& p = pieces[k];
    const size_t bytes = p.count * elementBytes;
    if (leader) toHostOrder(p.groups, hostRanks_, hostFirst_, largestHost_, bytes);
    CollectiveRequest part = r;
    part.algorithm = Algorithm::Auto, part.collective = Collective::Broadcast, part.root = 0;
    part.output = p.groups, part.input = nullptr, part.count = worldSize_ * p.count;
    runInLevel(local_, part);
    reorderPiece(p.groups, static_cast<char*>(r.output), r.count * elementBytes,
                 p.first * elementBytes, bytes, false, hostOrder);
  };
  const CallName call = describe(r, sequence_++, "two_level");
  collective(r.stream, call, [&] {
    throughLeaders(pieces.size(), leader, collect, across, spread,
                   [&] { cross_.comm->abort("the all_gather failed inside its host"); });
  });
}

}  // namespace ringcomm
