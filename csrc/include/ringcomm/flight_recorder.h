// FlightRecorder: a communicator's last calls, for when one hangs or fails (as torch's flight
// recorder for NCCL): a fixed ring of entries, written by the thread that runs the calls and
// read by any (a snapshot), nothing allocated per call. Each entry says what the call was
// (name, number, dtype, count, op, algorithm, peer), how far it got (the plan step the executor
// reached) and how it ended; a device's calls end when the transport sees their work done.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ringcomm/transport.h"

namespace ringcomm {

// Running: on the host; Enqueued: handed to a device, its work not yet seen done.
enum class CallState : int32_t { Running = 0, Completed = 1, Failed = 2, Enqueued = 3 };
const char* callStateName(CallState state);

// What a call was, as it entered the communicator, and how it went.
struct CallRecord {
  uint64_t id = 0;  // calls recorded so far on this communicator: their order
  std::string name;  // "all_reduce", "send", ...
  uint64_t sequence = 0;  // a collective's number (its messages carry it)
  bool numbered = false;  // false for point-to-point
  std::string dtype, op, algorithm;  // empty: does not apply
  uint64_t count = 0;
  int32_t peer = -1;
  CallState state = CallState::Running;
  int32_t step = -1, steps = 0;  // the plan step reached (-1: none yet) of how many
  double started = 0, ended = 0;  // seconds since the Unix epoch; ended 0 while it runs
  std::string failure;
};

class FlightRecorder {
 public:
  // `capacity` calls are kept (0: nothing is recorded).
  void resize(size_t capacity);
  size_t capacity() const { return entries_.size(); }

  // Records a call entering (its number: `call.record`, from name()); returns its entry (null
  // when nothing is kept). The thread that runs the calls only.
  struct Entry;
  Entry* begin(const CallName& call);
  // Gives `call` the number begin() will record it under next.
  void name(CallName& call) const { call.record = calls_.load(std::memory_order_relaxed); }
  static void plan(Entry* entry, size_t steps);
  static void step(Entry* entry, size_t index);
  // `onDevice`: the call's work still runs on a device (Enqueued until deviceDone).
  void end(Entry* entry, bool ok, const std::string& failure = "", bool onDevice = false);
  // The device work of every call up to `record` (CallName::record) is done; any thread.
  void deviceDone(uint64_t record);
  // Call `record`'s device work failed or ran past the timeout; any thread.
  void deviceFailed(uint64_t record, const std::string& failure);

  // The kept calls, oldest first; at most the `newest` last ones.
  std::vector<CallRecord> snapshot(size_t newest = SIZE_MAX) const;
  // The last `count` calls, a line each ("call 41: all_reduce #12 float32 x1000 sum ring:
  // failed at step 3 of 6"), for error messages.
  std::string recent(size_t count) const;

  struct Entry {
    std::atomic<uint64_t> id{0};  // record + 1 (0: never written)
    const char* name = "";
    uint64_t sequence = 0;
    bool numbered = false;
    const char* dtype = nullptr;
    const char* op = nullptr;
    const char* algorithm = nullptr;
    uint64_t count = 0;
    int32_t peer = -1;
    std::atomic<int32_t> state{0}, step{-1};
    int32_t steps = 0;
    double started = 0;
    std::atomic<double> ended{0};
    char failure[256] = {};
  };

 private:
  std::vector<Entry> entries_;
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> deviceDone_{0};  // calls below this have their device work done
};

}  // namespace ringcomm
