// k3 tune's sweep: one setting at a time (queue depth, then prefetch distance, prefetch width,
// compute threads), each value in short cold runs alternated over rounds so that every value
// sees the same noise, the best kept only when it beats the current one by a margin; then a
// confirming run alternating the defaults and the pick. Time-boxed: a dimension that does not
// fit the budget (with the confirmation reserved) is skipped and said so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/engine.h"

namespace k3::cli::tune {

// A kept value must be this much faster than the current one (median s/token); below it the
// difference is noise on a shared machine and the current value stays.
inline constexpr double kMargin = 0.03;

struct Dimension {
  std::string flag;  // as typed: "queue-depth"
  int EngineOptions::*field = nullptr;
  std::vector<int> values;
  // When set, the dimension is not swept: it takes values[0], and this says why (the table's
  // note), as for the queue depth chosen per drive (apps/tune/drive_depths.h).
  std::string fixed = "";
};

struct Trial {
  int value = 0;
  std::vector<double> seconds_per_token;  // one per round
};

struct DimensionResult {
  std::string flag;
  std::vector<Trial> trials;
  int before = 0;  // the value going in
  int chosen = 0;
  int rounds = 0;
  std::string skipped;  // why it was not swept ("" when it was)
  std::string fixed;    // Dimension::fixed: chosen without a sweep
};

struct SweepOptions {
  EngineOptions defaults;  // model, memory, profile and the default of every swept setting
  std::vector<Dimension> dimensions;
  std::vector<int32_t> prompt;
  int tokens = 12;
  int rounds = 3;
  double budget_seconds = 600;
  bool quiet = false;     // no progress at all
  bool show_bar = false;  // a progress bar (a terminal); else a line per run on stderr
  std::string label;      // for progress lines ("direct")
};

struct SweepResult {
  std::vector<DimensionResult> dimensions;
  EngineOptions best;
  // Confirmation: pairs of (defaults, pick) runs in alternating order; each pair's ratio is the
  // defaults' s/token over the pick's. Empty when the pick is the defaults.
  std::vector<double> default_seconds, best_seconds, pair_ratios;
  bool pick_rejected = false;  // the confirmation found the pick no faster: defaults stand
  int runs = 0;
  double elapsed_seconds = 0;
  std::vector<int32_t> tokens;  // what every run decoded
};

// The value of `flag` in `o`.
int ValueOf(const EngineOptions& o, const std::vector<Dimension>& dims, const std::string& flag);

// Runs the sweep. Every run must decode the same tokens: a setting that changes them is a bug,
// reported as Internal naming the setting. Cancelled on Ctrl-C (with what was measured lost).
absl::StatusOr<SweepResult> Sweep(const SweepOptions& options);

}  // namespace k3::cli::tune
