// Replaying the reads of a run without its compute: the same requests (file, offset, length) in
// the order the run asked for them, with the run's read-engine settings (queue depth, chunking,
// storage profile, O_DIRECT), as many in flight as the queue depth allows and nothing between
// them. The time it takes is the run's I/O floor (docs/BENCHMARKS.md): the run needed at least
// that long for its reads alone. One replay is one sample of the volume, and a short one is
// mostly noise, so the log is replayed several times and the fastest replay is the floor.
//
//   engine->StartReadLog();  ... decode steps ...;  ReadLog log = engine->TakeReadLog();
//   // after the run's engine is gone (its memory is free); three replays:
//   auto floor = ReplayReadLog(log, 1ull << 30, [](const auto& s) { return s.size() < 3; });
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/read_router.h"

namespace k3::io {

struct ReadLog {
  std::vector<std::string> paths;  // indexed by LoggedRead::file
  std::vector<LoggedRead> reads;   // in submission order
  // The run's: queue depth, profiles, volumes (arena, faults and warnings are not used).
  ReadRouterOptions options;
  std::vector<std::vector<Extent>> stripes;  // of each path, if any

  uint64_t bytes() const;
};

struct ReplayResult {
  double seconds = 0;  // the fastest replay, from its first submission to its last completion
  std::vector<double> replay_seconds = {};  // every replay's time, in the order they ran
  uint64_t bytes = 0;                       // requested bytes (the log's), per replay
  int64_t reads = 0;
  // Requests the replay kept in flight at once: the queue depth, unless the buffer cap or the
  // log's length holds it to fewer.
  int concurrency = 0;
  // What each device (io/read_router.h: the run's volumes, as the run had them) did in the
  // fastest replay: its bytes sum to `bytes`.
  std::vector<DeviceReport> devices = {};
};

// Whether to replay once more, given the times of the replays so far (never empty).
using ReplayAgainFn = std::function<bool(const std::vector<double>& replay_seconds)>;

// Replays `log` with `max_buffer_bytes` of buffers at most (one buffer per request submitted
// and not yet complete, each as large as the log's largest request; twice the queue depth of
// them at most), once, then again for as long as `again` says so (null: once). Every request is
// issued as a demand read: a prefetch of the run is bytes it had to read too, and the floor should
// not be held back by the caps that keep guesses out of the way of demand reads.
//
// Only the reads are timed: the read router, its buffers and the files are set up once before
// the first replay, and one untimed read per buffer warms them (the first completions, the
// backend's workers), so that no replay pays for a start the run paid for before its decode.
// An empty log is not replayed (seconds 0, no replay times).
absl::StatusOr<ReplayResult> ReplayReadLog(const ReadLog& log,
                                           uint64_t max_buffer_bytes = 1ull << 30,
                                           const ReplayAgainFn& again = nullptr);

}  // namespace k3::io
