// How every call of a communicator runs: bracketed by its transport's begin() and end(), named
// and recorded in the flight record, and on failure recorded, reported to the failure hook and
// every transport aborted (failed(), in communicator_state.cc).
#include "ringcomm/communicator.h"

#include "ringcomm/error.h"

namespace ringcomm {

void Communicator::setTraceBuffer(size_t calls) {
  recorder_->resize(calls);
  for (Transport* t : {transport_.get(), links_.get()})
    if (t) t->reportCompletionTo(recorder_);
}

void Communicator::collective(uintptr_t stream, const CallName& call,
                              const std::function<void()>& body) {
  bracket(*transport_, stream, call, body);
}

void Communicator::bracket(Transport& transport, uintptr_t stream, const CallName& name,
                           const std::function<void()>& body) {
  CallName call = name;
  recorder_->name(call);
  FlightRecorder::Entry* entry = current_ = recorder_->begin(call);
  // A failure ends the entry, tells the failure hook (which may write the record out) and
  // names this rank's last calls.
  auto fail = [&](const Error& e, bool refused) {
    recorder_->end(entry, false, e.what());
    if (!refused) failed(e.what());
    reportFailure();
    if (recorder_->capacity() == 0) throw;
    rethrowWithMessage(e, e.what() + ("\nthis rank's last calls:" + recorder_->recent(4)));
  };
  try {
    transport.begin(stream, call);
  } catch (const RefusedError& e) {
    fail(e, true);  // begin() refused before starting anything: the communicator stays usable
  } catch (const Error& e) {
    fail(e, false);
  }
  try {
    body();
    transport.end();
    recorder_->end(entry, true, "", transport.completesOnDevice());
  } catch (const Error& e) {
    fail(e, false);
  }
}

void Communicator::reportFailure() noexcept {
  if (!onFailure_) return;
  try {
    onFailure_();
  } catch (...) {  // a report must not hide the failure it reports
  }
}

CallName Communicator::describe(const CollectiveRequest& r, uint64_t sequence,
                               const char* algorithm) const {
  const CollectiveInfo& info = collectiveInfo(r.collective);
  CallName call{info.name, sequence, true};
  call.dtype = dataTypeName(r.type), call.count = r.count, call.algorithm = algorithm;
  if (info.reduces) call.op = redOpName(r.op);
  if (info.root != nullptr) call.peer = r.root;
  return call;
}

}  // namespace ringcomm
