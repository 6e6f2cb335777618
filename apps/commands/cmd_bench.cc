// k3 bench: storage benchmarks. The decode benchmark (apps/bench/decode_bench.h) runs the
// engine, cold, over every combination of volume (model directory x storage profile), queue
// depth and prefetch distance, and sets its time against the I/O floor: the same reads replayed
// right after each run without the compute (io/read_replay.h, docs/BENCHMARKS.md). `--raw`
// (apps/bench/raw_bench.h) measures the volume's bandwidth for whole random experts alone, side
// by side with fio when it is installed.
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "apps/bench/decode_bench.h"
#include "apps/bench/raw_bench.h"
#include "apps/commands/commands.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "io/file.h"

namespace k3::cli {
namespace {

using bench::kName;

// The --model list, each a model directory.
absl::StatusOr<std::vector<std::string>> ModelDirs() {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) return absl::InvalidArgumentError("--model DIR[,DIR...] is required");
  std::vector<std::string> dirs = absl::StrSplit(model, ',', absl::SkipWhitespace());
  if (dirs.empty()) return absl::InvalidArgumentError("--model: no model directory in the list");
  for (const std::string& dir : dirs) {
    if (!io::FileExists(dir + "/config.json")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model ", dir, ": no config.json there (is it a model directory?)"));
    }
  }
  return dirs;
}

int RunBench(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kName, "unexpected argument " + positional[0]);
  auto dirs = ModelDirs();
  if (!dirs.ok()) return UsageError(kName, std::string(dirs.status().message()));
  if (!absl::GetFlag(FLAGS_raw)) return bench::RunDecode(*dirs);
  if (!absl::GetFlag(FLAGS_plot).empty()) {
    return UsageError(kName, "--plot draws the decode benchmark; it does not apply to --raw");
  }
  return bench::RunRaw(*dirs);
}

}  // namespace

const Subcommand& BenchCommand() {
  static const Subcommand kCommand = {
      kName,
      "storage benchmarks: s/token against the I/O floor per volume, depth and prefetch distance",
      "bench --model DIR[,DIR...] [--storage-profile P[,P...]] [--queue-depth 1,4,16,32]\n"
      "                [--prefetch-distance 0,2] [--tokens N] [--repeat R] [--ram-gb X | --preset "
      "NAME]\n"
      "                [--volume DIR[@PROFILE] ... [--sweep-volumes]]\n"
      "                [--raw] [--reads N] [--out-csv F] [--report-json F] [--plot F.svg]",
      "Runs the engine over every combination of volume (model directory x storage profile),\n"
      "queue depth and prefetch distance. Each of --repeat runs is cold: a fresh engine (empty\n"
      "expert cache, O_DIRECT reads), a fixed 16-token prompt from --seed, then --tokens greedy\n"
      "decode steps. Prints a markdown table: s/token (median of the runs, each run's median\n"
      "step), tokens/s, GB read per token, the raw bandwidth of that volume, profile and depth\n"
      "(measured first in the same run, as --raw does), the ratio to the I/O floor (the decode\n"
      "time over a replay of the run's own reads, same requests and depth, right after it; 1.0\n"
      "is perfect overlap), stall fraction, cache hit rate and\n"
      "prefetch precision/recall ('-': the engine reported nothing to compute it from).\n"
      "--out-csv and --report-json write every figure and setting; --plot draws s/token against\n"
      "queue depth, a line per prefetch distance, a panel per volume. See docs/BENCHMARKS.md.\n\n"
      "With --volume (directories holding copies of the model's files on other drives), every\n"
      "run reads through all of them, and the table gains '+volumes' (the --volume\n"
      "directories read) and 'drives' (the devices they are on; a directory with a profile of\n"
      "its own is one); the JSON and CSV give each drive's bytes, busy time and rate, and the\n"
      "I/O floor replays the reads over the same drives. --sweep-volumes makes rows of the\n"
      "model directory alone, then with the first volume, the first two, ... all of them.\n\n"
      "--raw reads random whole experts of the checkpoint (O_DIRECT, each expert at most once\n"
      "per run) with the io layer at each queue depth (experts in flight) and storage profile,\n"
      "and prints a markdown table: GB/s (median of --repeat runs), expert reads per second, MB\n"
      "per request, and fio's bandwidth on the same shard files, block size (one expert) and\n"
      "depth when fio is installed, run alternately with k3's runs; with --volume it reads\n"
      "through the same drives (and fio, which reads the model directory only, is not run).\n"
      "Storage profiles: direct (the device), nvme, sata, network, or\n"
      "lat=2ms,bw=500MB/s,iops=5000,qd=32 (any subset); see docs/STORAGE.md.",
      kBench,
      RunBench};
  return kCommand;
}

}  // namespace k3::cli
