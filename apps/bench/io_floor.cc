#include "apps/bench/io_floor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace k3::cli::bench {
namespace {

// The two smallest of `v` (at least two values), smallest first.
std::pair<double, double> TwoFastest(std::vector<double> v) {
  std::partial_sort(v.begin(), v.begin() + 2, v.end());
  return {v[0], v[1]};
}

}  // namespace

bool ReplayAgain(const std::vector<double>& replay_seconds, double run_seconds) {
  const int n = static_cast<int>(replay_seconds.size());
  if (n < kMinReplays) return true;
  if (n >= kMaxReplays) return false;
  const auto [fastest, second] = TwoFastest(replay_seconds);
  return (run_seconds > 0 && fastest > run_seconds) || second > fastest * (1 + kReplaysAgree);
}

FloorVerdict JudgeFloor(double step_seconds, const std::vector<RunReplays>& runs) {
  FloorVerdict v;
  std::vector<double> per_token;
  double fastest_seconds = NAN;  // the whole replay that gives the floor
  for (const RunReplays& run : runs) {
    if (!(run.tokens > 0)) continue;
    for (double s : run.seconds) {
      per_token.push_back(s / run.tokens);
      if (per_token.size() == 1 || per_token.back() < v.seconds_per_token) {
        v.seconds_per_token = per_token.back();
        fastest_seconds = s;
      }
    }
  }
  v.replays = static_cast<int>(per_token.size());
  if (per_token.empty()) return v;  // nothing read: no floor, and nothing to explain
  if (per_token.size() >= 2) {
    const auto [fastest, second] = TwoFastest(per_token);
    v.spread = fastest > 0 ? second / fastest - 1 : NAN;
  }
  if (!(fastest_seconds >= kShortestFloorSeconds)) {
    v.note =
        absl::StrFormat("the floor is too short to time: the fastest of %d replays took %.3f ms",
                        v.replays, fastest_seconds * 1e3);
  } else if (!std::isfinite(step_seconds)) {
    v.note = "no decode time to set against the floor";
  } else if (step_seconds < v.seconds_per_token) {
    v.note = absl::StrFormat(
        "no floor: the fastest of %d replays (%.3g s/token) was slower than the run itself (%.3g "
        "s/token); the volume was slower during the replays than during the run",
        v.replays, v.seconds_per_token, step_seconds);
  } else if (v.replays < 2) {
    v.note = "a single replay: the floor is unconfirmed";
  } else if (!(v.spread <= kReplaysDisagree)) {
    v.note = absl::StrFormat(
        "the replays disagree: the two fastest of %d are %.0f %% apart (more than %.0f %%)",
        v.replays, v.spread * 100, kReplaysDisagree * 100);
  } else {
    v.ratio = step_seconds / v.seconds_per_token;
  }
  return v;
}

std::string FloorCell(const FloorVerdict& v, int note_number) {
  if (!v.note.empty()) return absl::StrFormat("- [%d]", note_number);
  return std::isfinite(v.ratio) ? absl::StrFormat("%.2f", v.ratio) : "-";
}

}  // namespace k3::cli::bench
