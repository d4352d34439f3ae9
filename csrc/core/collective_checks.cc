// What a collective request must be before anything is sent: its fields against the collective
// (checkRequest) and its algorithm against the collective and the transport (resolveAlgorithm).
// Both raise before the call starts, so a bad request leaves the communicator usable.
#include "ringcomm/communicator.h"

#include "ringcomm/error.h"

namespace ringcomm {

Algorithm Communicator::resolveAlgorithm(Algorithm requested, Collective collective,
                                         size_t bytes) const {
  RC_CHECK(algorithmPlans(requested, collective), "algorithm ", algorithmName(requested),
           " does not run ", collectiveName(collective));
  if (worldSize_ == 1) return Algorithm::Ring;  // nothing to exchange either way
  if (requested == Algorithm::Auto)
    return chooseAlgorithm(collective, bytes, worldSize_, transport_->publishBytes() > 0,
                           options_.thresholds, transport_->reachesEveryPeer());
  RC_CHECK(!isOneHop(requested) || transport_->publishBytes() > 0, algorithmName(requested),
           " ", collectiveName(collective),
           " needs a transport with publications (CPU shared memory); this device's has none: "
           "use ring or auto");
  RC_CHECK(requested != Algorithm::RecursiveDoubling || transport_->reachesEveryPeer(),
           algorithmName(requested), " ", collectiveName(collective),
           " needs a transport that reaches every rank (TCP between hosts); this one links ring "
           "neighbours only: use ring or auto");
  return requested;
}

void Communicator::checkRequest(const CollectiveRequest& r) const {
  const CollectiveInfo& info = collectiveInfo(r.collective);
  RC_CHECK(info.planned, info.name, " is not a collective request: it runs over peer links");
  if (info.root != nullptr) {
    RC_CHECK(r.root >= 0 && r.root < worldSize_, info.root, "=", r.root,
             " is not a rank of this ", worldSize_, "-rank communicator");
  } else {
    RC_CHECK(r.root == 0, info.name, " has no root: leave root at 0, not ", r.root);
  }
  RC_CHECK(info.reduces || r.op == RedOp::Sum, info.name, " does not reduce: leave op at sum, not ",
           redOpName(r.op));
  RC_CHECK(info.wire || !r.wireType || *r.wireType == r.type, info.name,
           " takes no wire dtype (its messages are its data type, ", dataTypeName(r.type), ")");
  RC_CHECK(r.algorithm != Algorithm::RecursiveDoubling || !r.wireType || *r.wireType == r.type,
           "recursive_doubling ", info.name, " sends the data's own dtype (on a 16-bit wire each "
           "rank would round differently): use ring or auto with wire_dtype");
  RC_CHECK(info.layout != Layout::InPlace || r.input == nullptr || r.input == r.output, info.name,
           " runs in place on its output: leave input unset or the same");
  // What this rank touches: the in-place tensor; its own block (the output of reduce_scatter and
  // scatter, the input of all_gather and gather); every rank's blocks, unless only the root
  // has them (gather's output, scatter's input).
  const bool whole = info.root == nullptr || r.root == rank_;
  const bool needsOutput = info.layout != Layout::InputBlock || whole;
  const bool needsInput =
      info.layout == Layout::InputBlock || (info.layout == Layout::OutputBlock && whole);
  RC_CHECK(r.count == 0 || !needsOutput || r.output != nullptr, info.name,
           " needs an output on rank ", rank_);
  RC_CHECK(r.count == 0 || !needsInput || r.input != nullptr, info.name, " needs an input on rank ",
           rank_);
}

}  // namespace ringcomm
