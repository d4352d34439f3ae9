// What the two-level collectives' files share (two_level.cc: even levels and the entry points;
// two_level_uneven.cc: uneven hosts, through their leaders).
#pragma once

#include <cstddef>
#include <vector>

namespace ringcomm {

// Bytes of one piece: big enough that a piece's three calls cost little beside its bytes,
// small enough that the first and last pieces, which nothing overlaps, are a small share.
constexpr size_t kPieceBytes = 4u << 20;

// Uneven hosts: whether reduce_scatter and all_gather through the leaders send fewer blocks
// over the busiest host's links than the flat ring (two_level_uneven.cc).
bool leadersSendFewerBlocks(const std::vector<std::vector<int>>& hostRanks, int worldSize);

}  // namespace ringcomm
