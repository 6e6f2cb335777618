// The decode benchmark of k3 bench: the engine over every combination of volume (model
// directory x storage profile), queue depth and prefetch distance, each run cold, set against
// the I/O floor (docs/BENCHMARKS.md). The runner (decode_bench.cc) and the table, JSON, CSV and
// plot of its rows (decode_report.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/bench/raw_bench.h"
#include "io/read_replay.h"
#include "pipeline/engine.h"

namespace k3::cli::bench {

// The decode benchmark: the engine over every combination, each run cold. A combination is a
// volume (model directory) with a set of --volume directories (all of them, or with
// --sweep-volumes the first 0, 1, ... N), a storage profile, a queue depth and a prefetch
// distance.

// Prompt tokens of every run: fixed for a seed so that runs and volumes compare like for like.
inline constexpr int kPromptTokens = 16;

struct DecodeSettings {
  RawSettings raw;  // the raw bandwidth of each volume x profile x depth
  std::vector<int> distances;
  int tokens = 24;
  uint64_t seed = 0;
  EngineOptions base;  // every engine setting but model, profile, depth and distance
  std::string plot;
};

// One cold run: a fresh engine, the prompt prefilled, `tokens` greedy decode steps.
struct DecodeRun {
  double seconds_per_token = 0;  // the median decode step
  double prefill_seconds = 0;
  StepMetrics decode;  // summed over the decode steps
  // The decode steps' reads replayed right after the run, alone, until the replays settle
  // (io/read_replay.h, apps/bench/io_floor.h).
  io::ReplayResult floor;
  std::vector<int32_t> ids;  // the tokens decoded (greedy), to check every setting agrees
  // What each drive did during the decode steps (bytes delivered, busy time): the model's
  // directory and the --volume directories read, one entry per device (io/read_router.h).
  std::vector<io::DeviceReport> devices;
};

struct DecodeRow {
  std::string volume = "";
  std::vector<std::string> volume_flags = {};  // the --volume directories read beside it
  std::string profile = "";
  int queue_depth = 0;
  int prefetch_distance = 0;
  int drives = 0;       // the devices its runs read from
  double raw_gbps = 0;  // median of the raw cell of this volume, volumes, profile and depth
  std::vector<DecodeRun> runs = {};
  nlohmann::json engine_settings = {};
  std::string memory_plan = "";
};

// The medians over a row's runs of each figure (NaN where the engine reported nothing to
// compute it from, shown as "-").
struct Figures {
  double seconds_per_token = NAN;
  double tokens_per_second = NAN;
  double gb_per_token = NAN;
  // The fastest replay of the runs' own reads, per token; the run's decode time over it (NaN
  // when io_floor_note says why it is not shown); the bandwidth the replays got.
  double io_floor_seconds = NAN;
  double ratio_to_floor = NAN;
  double floor_gbps = NAN;
  int io_floor_replays = 0;        // replays behind the floor, over every run
  double io_floor_spread = NAN;    // the two fastest replays' gap (apps/bench/io_floor.h)
  std::string io_floor_note = "";  // why the ratio is "-" though the runs read bytes
  double mean_step_seconds = NAN;  // decode time / tokens (the replay covers every step)
  double stall_fraction = NAN;
  double disk_busy_fraction = NAN;
  double hit_rate = NAN;
  double precision = NAN;
  double recall = NAN;
  double prefill_seconds = NAN;
  double demand_gb = NAN, prefetch_used_gb = NAN, prefetch_wasted_gb = NAN, trunk_gb = NAN;
};

uint64_t BytesRead(const StepMetrics& m);
double Ratio(double num, double den);  // NaN when den <= 0
Figures Summarize(const DecodeRow& row);
// Three significant digits without an exponent (0.00412, 41.2, 4120), "-" for NaN.
std::string Sig3(double v);
std::string Caption(const DecodeSettings& s);
// With `drives` (--volume given), the "+volumes" and "drives" columns after the volume.
void PrintDecodeTable(const std::vector<DecodeRow>& rows, int repeat, bool drives);
// --out-json, --out-csv and --plot, as asked.
absl::Status WriteDecodeOutputs(const std::vector<DecodeRow>& rows,
                                const std::vector<Row>& raw_rows,
                                const std::vector<Volume>& volumes,
                                const std::vector<std::vector<int32_t>>& prompts,
                                const DecodeSettings& s, const EngineSetup& setup);

// The benchmark's prompt for a volume: kPromptTokens ids drawn from `seed`.
std::vector<int32_t> PromptIds(uint64_t seed, int64_t vocab_size);
// One cold run (k3 tune runs them too): a fresh engine, `prompt` prefilled, `tokens` greedy
// decode steps, then (with `replay`) the steps' reads replayed for the floor. `row` (optional)
// receives the engine's settings and memory plan the first time. Cancelled on Ctrl-C.
absl::StatusOr<DecodeRun> RunCold(const EngineOptions& options, const std::vector<int32_t>& prompt,
                                  int tokens, DecodeRow* row, bool replay = true);

// The decode benchmark over `dirs`; the exit code.
int RunDecode(const std::vector<std::string>& dirs);

}  // namespace k3::cli::bench
