// FlightRecorder: a communicator's last calls, for when one hangs or fails (as torch's flight
// recorder for NCCL): a fixed ring of entries, written by the thread that runs the calls and
// read by any (a snapshot), nothing allocated per call. Each entry says what the call was, how
// far it got (the plan step the executor reached) and how it ended.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ringcomm/transport.h"

namespace ringcomm {

enum class CallState : int32_t { Started = 0, Completed = 1, Failed = 2 };

// What a call was, as it entered the communicator.
struct CallRecord {
  uint64_t id = 0;  // calls recorded so far on this communicator: their order
  std::string name;  // "all_reduce", "send", ...
  uint64_t sequence = 0;  // a collective's number (its messages carry it); 0 for point-to-point
  bool numbered = false;
  CallState state = CallState::Started;
  int32_t step = -1, steps = 0;  // the plan step reached (-1: none yet) of how many
  double started = 0, ended = 0;  // seconds since the Unix epoch; ended 0 while it runs
  std::string failure;
};

class FlightRecorder {
 public:
  // `capacity` calls are kept (0: nothing is recorded).
  void resize(size_t capacity);
  size_t capacity() const { return entries_.size(); }

  // Records a call entering; returns its entry (null when nothing is kept).
  struct Entry;
  Entry* begin(const CallName& call);
  static void plan(Entry* entry, size_t steps);
  static void step(Entry* entry, size_t index);
  static void end(Entry* entry, bool ok, const std::string& failure = "");

  std::vector<CallRecord> snapshot() const;
  // The last `count` calls, a line each ("#41 all_reduce #12: failed at step 3 of 6"), for
  // error messages.
  std::string recent(size_t count) const;

  struct Entry {
    std::atomic<uint64_t> id{0};
    const char* name = "";
    uint64_t sequence = 0;
    bool numbered = false;
    std::atomic<int32_t> state{0}, step{-1};
    int32_t steps = 0;
    double started = 0;
    std::atomic<double> ended{0};
    char failure[160] = {};
  };

 private:
  std::vector<Entry> entries_;
  std::atomic<uint64_t> calls_{0};
};

}  // namespace ringcomm
