// What k3 bench may say about a row's I/O floor (docs/BENCHMARKS.md, "The I/O floor"): how many
// times a run's reads are replayed, which replay is the floor, and whether the row's "x I/O
// floor" is a figure or "-" with a note saying why. Numbers in, numbers and a note out: no
// clock, no reads.
#pragma once

#include <cmath>
#include <string>
#include <vector>

namespace k3::cli::bench {

// Every run's reads are replayed at least kMinReplays times, and then again, up to
// kMaxReplays, while the two fastest replays are more than kReplaysAgree apart or the fastest
// took longer than the run itself.
inline constexpr int kMinReplays = 3;
inline constexpr int kMaxReplays = 6;
inline constexpr double kReplaysAgree = 0.10;
// A row's floor is not shown as a figure when the two fastest of its replays are more than
// kReplaysDisagree apart, or when its fastest replay took less than kShortestFloorSeconds (a
// few small reads: the clock and the wake-ups are then much of what is measured).
inline constexpr double kReplaysDisagree = 0.25;
inline constexpr double kShortestFloorSeconds = 1e-3;

// Whether a run whose decode steps took `run_seconds` needs one more replay of its reads, given
// the replays' times so far (each the whole log, seconds).
bool ReplayAgain(const std::vector<double>& replay_seconds, double run_seconds);

// The replays of one run's reads.
struct RunReplays {
  std::vector<double> seconds = {};  // each replay of the whole log; none when nothing was read
  double tokens = 0;                 // the run's decode tokens
};

struct FloorVerdict {
  double seconds_per_token = NAN;  // the fastest replay of any run, over its run's tokens
  // The second fastest over the fastest, minus 1 (per token; NaN with fewer than 2 replays).
  double spread = NAN;
  int replays = 0;
  // `step_seconds` over the floor: at least 1. NaN when the runs read nothing, or when `note`
  // says why the floor is not one.
  double ratio = NAN;
  std::string note = "";  // "" when there is a ratio or nothing was read
};

// A row's floor: the fastest replay of its runs, set against the row's time per decode token
// (`step_seconds`, the median over its runs of decode time / tokens). A floor slower than the
// row's own tokens is no floor (the replays met a busier volume than the run did), and neither
// is one that is too short to time or whose replays disagree: then the ratio is NaN and the note
// says which.
FloorVerdict JudgeFloor(double step_seconds, const std::vector<RunReplays>& runs);

// The table's "x I/O floor" cell: the ratio ("1.23"), or "- [n]" when the verdict has a note
// (printed as note n below the table), or "-" when the runs read nothing.
std::string FloorCell(const FloorVerdict& v, int note_number);

}  // namespace k3::cli::bench
