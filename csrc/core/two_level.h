// What the two-level collectives' files share (two_level.cc: even levels and the entry points;
// two_level_uneven.cc: uneven hosts, through their leaders).
#pragma once

#include <cstddef>
#include <vector>

namespace ringcomm {

// Bytes of one piece: big enough that a piece's three calls cost little beside its bytes,
// small enough that the first and last pieces, which nothing overlaps, are a small share
// (2 x 2 emulated hosts, 64 MiB: reduce_scatter 0.82 of the link's bound with 4 MiB pieces,
// 0.87-0.89 with 2 MiB; all_gather and all_reduce level or better).
constexpr size_t kPieceBytes = 2u << 20;

// Uneven hosts: whether reduce_scatter and all_gather through the leaders send fewer blocks
// over the busiest host's links than the flat ring (two_level_uneven.cc).
bool leadersSendFewerBlocks(const std::vector<std::vector<int>>& hostRanks, int worldSize);

}  // namespace ringcomm
