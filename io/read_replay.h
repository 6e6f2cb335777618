// Replaying the reads of a run without its compute: the same requests (file, offset, length) in
// the order the run asked for them, with the run's read-engine settings (queue depth, chunking,
// storage profile, O_DIRECT), as many in flight as the queue depth allows and nothing between
// them. The time it takes is the run's I/O floor (docs/BENCHMARKS.md): the run needed at least
// that long for its reads alone, so its own time over the floor is never below 1 but for noise.
//
//   engine->StartReadLog();  ... decode steps ...;  ReadLog log = engine->TakeReadLog();
//   auto floor = ReplayReadLog(log);   // after the run's engine is gone: its memory is free
#pragma once

#include <cstdint>
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
  double seconds = 0;  // from the first submission to the last completion
  uint64_t bytes = 0;  // requested bytes (the log's)
  int64_t reads = 0;
  // Requests the replay kept in flight at once: the queue depth, unless the buffer cap or the
  // log's length holds it to fewer.
  int concurrency = 0;
};

// Replays `log` with `max_buffer_bytes` of buffers at most (one buffer per request submitted
// and not yet complete, each as large as the log's largest request). Every request is issued as a
// demand read: a prefetch of the run is bytes it had to read too, and the floor should not be held
// back by the caps that keep guesses out of the way of demand reads.
absl::StatusOr<ReplayResult> ReplayReadLog(const ReadLog& log,
                                           uint64_t max_buffer_bytes = 1ull << 30);

}  // namespace k3::io
