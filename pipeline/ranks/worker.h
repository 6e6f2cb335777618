// A rank other than 0 under expert parallelism: it waits for rank 0's greeting (sent once rank
// 0's model exists, so a model it synthesised is on disk), opens its own copy of the checkpoint
// with its own cache, read router and budget, and answers layer jobs (the rows routed to its
// experts) with their products until rank 0 says to exit. A new greeting (rank 0 opened another
// engine) opens the experts again.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "pipeline/engine_options.h"

namespace k3::ranks {

// Runs the worker loop; `options` gives the engine options from this rank's own flags (called
// after the greeting). Returns the process's exit code.
int RunWorker(const std::function<absl::StatusOr<EngineOptions>()>& options);

}  // namespace k3::ranks
