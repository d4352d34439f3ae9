// Publications over NCCL (the one-hop interface of transport.h) as bookkeeping, without CUDA:
// where each publication lives in the staging buffer, which calls may follow which, and which
// NCCL operations exchange a phase. NcclTransport issues what it decides.
//
// The exchange. NCCL moves bytes only between a send and a receive posted by both sides, so a
// publication is not read where it was written: the first read of a phase in a round sends this
// rank's publication to every peer and receives every peer's into local staging, in ONE group
// (n-1 sends, n-1 receives). Every rank issues the same sequence of such groups (round by round,
// phase 0 then 1), so rank r's g-th group meets every peer's g-th group: nothing waits on an
// operation that is not yet enqueued, and no order inside a group matters.
//
// Sizes. A receive must be posted with exactly the size its peer sends, and the sizes are
// needed at the phase's first read, before the other peers' expected envelopes are known. So
// every rank's publication of a phase has this rank's own size (one_shot's inputs, two_shot's
// phase 0), unless expect() declared every rank's size first (two_shot's uneven chunks:
// Transport::expectPublished). A read whose expected size differs raises MismatchError
// instead of reducing garbage. NCCL carries no header, so the other envelope fields of a peer
// cannot be checked (the debug mode's pre-check compares them before the call).
//
// Lifetimes. Own publications are double-buffered by round parity (a round may still read its
// own area while the next round's is written). Peers' copies need one area per phase: the next
// round's exchange overwrites it only after this rank's next commitPublish(0), by when the
// interface says the old one is no longer read, and on the GPU the exchange waits for every
// kernel enqueued before it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringcomm/error.h"
#include "ringcomm/transport.h"

namespace ringcomm {

// One operation of a phase's exchange; `offset` is the area in the staging buffer it sends
// from (this rank's publication) or receives into (the peer's copy).
struct PublishOp {
  bool send = false;
  int peer = -1;
  size_t bytes = 0;
  size_t offset = 0;
};

class Publications {
 public:
  static constexpr int kPhases = 2;
  static constexpr size_t kAlign = 256;  // every area starts 256-byte aligned: vector kernels

  // `bytes`: the largest publication (0: none; every call then fails).
  Publications(int rank, int worldSize, size_t bytes)
      : rank_(rank),
        worldSize_(worldSize),
        bytes_(bytes),
        stride_((bytes + kAlign - 1) / kAlign * kAlign) {}

  size_t bytes() const { return bytes_; }
  // The staging allocation: own areas per phase and parity, then one per peer and phase.
  size_t stagingBytes() const {
    if (bytes_ == 0) return 0;
    return stride_ * static_cast<size_t>(2 * kPhases + kPhases * (worldSize_ - 1));
  }
  size_t ownOffset(int phase, int parity) const {
    return stride_ * static_cast<size_t>(phase * 2 + parity);
  }
  size_t peerOffset(int peer, int phase) const {
    const int index = peer < rank_ ? peer : peer - 1;  // no area for this rank itself
    return stride_ * static_cast<size_t>(2 * kPhases + phase * (worldSize_ - 1) + index);
  }
  // Rounds started so far; the current one is rounds() - 1.
  uint64_t rounds() const { return rounds_; }

  // acquirePublish: phase 0 starts a round, phase 1 follows phase 0's commit. Returns the area.
  size_t acquire(int phase, size_t bytes) {
    RC_CHECK(bytes_ > 0, "this NCCL transport has no publications (publish_bytes is 0)");
    checkPhase(phase);
    RC_CHECK(bytes <= bytes_, "a ", bytes, "-byte publication exceeds the ", bytes_,
             "-byte NCCL publication area (publish_bytes)");
    RC_CHECK(acquired_ < 0, "acquirePublish(", phase, ") while phase ", acquired_,
             " is acquired and not committed");
    if (phase == 0) {
      finishRound();
      ++rounds_;
      for (Phase& p : phases_) p = Phase{};
    } else {
      RC_CHECK(rounds_ > 0 && phases_[0].committed && !phases_[1].committed,
               "phase 1 is published after phase 0, once per round");
    }
    acquired_ = phase;
    acquiredBytes_ = bytes;
    return ownOffset(phase, parity());
  }

  void commit(int phase, const Envelope& envelope) {
    checkPhase(phase);
    RC_CHECK(acquired_ == phase, "commitPublish(", phase, ") without acquirePublish(", phase, ")");
    RC_CHECK(envelope.bytes <= acquiredBytes_, "publication of ", envelope.bytes,
             " bytes committed into room for ", acquiredBytes_, " (", describeEnvelope(envelope),
             ")");
    acquired_ = -1;
    phases_[phase].committed = true;
    phases_[phase].envelope = envelope;
  }

  // Every rank's size of its publication of `phase` this round, before the phase's first read
  // (this rank's own entry is not used: its size is its commit's).
  void expect(int phase, const std::vector<size_t>& bytesPerRank) {
    checkPhase(phase);
    RC_CHECK(rounds_ > 0 && !phases_[phase].exchanged, "publication sizes of phase ", phase,
             " are declared in a round, before its first read");
    RC_CHECK(bytesPerRank.size() == static_cast<size_t>(worldSize_), "publication sizes for ",
             bytesPerRank.size(), " ranks in a world of ", worldSize_);
    for (size_t bytes : bytesPerRank)
      RC_CHECK(bytes <= bytes_, "a ", bytes, "-byte publication exceeds the ", bytes_,
               "-byte NCCL publication area (publish_bytes)");
    phases_[phase].sizes = bytesPerRank;
  }

  // acquirePublished: the area holding `peer`'s publication of `phase` this round. At the
  // phase's first read `exchange` receives the operations to issue before anything reads it.
  size_t read(int peer, int phase, const Envelope& expected, std::vector<PublishOp>& exchange) {
    exchange.clear();
    checkPhase(phase);
    RC_CHECK(peer >= 0 && peer < worldSize_, "publication of rank ", peer, " outside the world of ",
             worldSize_);
    Phase& p = phases_[phase];
    RC_CHECK(rounds_ > 0 && p.committed, "reading phase ", phase,
             " before this rank published it: on NCCL a publication travels in one exchange "
             "with every peer, both ways (", describeEnvelope(expected), ")");
    const Envelope& own = p.envelope;
    if (peer == rank_) {
      if (!(expected == own))
        RC_THROW_AS(MismatchError, "own publication of phase ", phase, " is ",
                    describeEnvelope(own), ", expected ", describeEnvelope(expected));
    } else if (expected.bytes != sizeOf(peer, phase)) {
      RC_THROW_AS(MismatchError, "rank ", peer, "'s publication of phase ", phase,
                  " is expected with ", expected.bytes, " bytes, but the NCCL exchange received ",
                  sizeOf(peer, phase), " (", describeEnvelope(expected), "): ",
                  p.sizes.empty() ? "without declared sizes every rank publishes this rank's size"
                                  : "the declared size differs");
    }
    if (!p.exchanged) {
      p.exchanged = true;
      for (int step = 1; step < worldSize_; ++step) {
        const int to = (rank_ + step) % worldSize_;
        const int from = (rank_ - step + worldSize_) % worldSize_;
        if (own.bytes > 0) exchange.push_back({true, to, own.bytes, ownOffset(phase, parity())});
        if (sizeOf(from, phase) > 0)
          exchange.push_back({false, from, sizeOf(from, phase), peerOffset(from, phase)});
      }
    }
    return peer == rank_ ? ownOffset(phase, parity()) : peerOffset(peer, phase);
  }

  // At the end of a collective: a publication that was committed but never read never left
  // this rank, and its peers would wait for it forever.
  void finishRound() const {
    RC_CHECK(acquired_ < 0, "publication of phase ", acquired_, " acquired but not committed");
    for (int phase = 0; phase < kPhases; ++phase)
      RC_CHECK(!phases_[phase].committed || phases_[phase].exchanged, "publication of phase ",
               phase, " committed but never read: on NCCL it travels at its first read (",
               describeEnvelope(phases_[phase].envelope), ")");
  }

 private:
  struct Phase {
    bool committed = false;
    bool exchanged = false;
    Envelope envelope;
    std::vector<size_t> sizes;  // declared by expect(), else every peer's is this rank's
  };

  size_t sizeOf(int peer, int phase) const {
    const Phase& p = phases_[phase];
    return p.sizes.empty() || peer == rank_ ? static_cast<size_t>(p.envelope.bytes)
                                            : p.sizes[peer];
  }

  int parity() const { return static_cast<int>((rounds_ - 1) & 1); }
  static void checkPhase(int phase) {
    RC_CHECK(phase >= 0 && phase < kPhases, "publication phase ", phase, " (0 or 1)");
  }

  int rank_, worldSize_;
  size_t bytes_, stride_;
  uint64_t rounds_ = 0;
  Phase phases_[kPhases];
  int acquired_ = -1;
  size_t acquiredBytes_ = 0;
};

}  // namespace ringcomm
