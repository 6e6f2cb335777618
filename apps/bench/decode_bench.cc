// The decode benchmark's runner: one cold engine per run, over every combination.
#include "apps/bench/decode_bench.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "apps/bench/io_floor.h"
#include "apps/options/cli.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/reports/run_report.h"
#include "core/util/median.h"
#include "pipeline/batch_scheduler.h"

namespace k3::cli::bench {
namespace {

absl::StatusOr<DecodeSettings> ReadDecodeSettings() {
  DecodeSettings s;
  auto raw = ReadRawSettings();
  if (!raw.ok()) return raw.status();
  s.raw = *std::move(raw);
  s.raw.fio = false;  // the I/O floor needs k3's own bandwidth; fio is --raw's cross-check
  auto distances = ParseIntList("prefetch-distance", absl::GetFlag(FLAGS_prefetch_distance), 0, 64);
  if (!distances.ok()) return distances.status();
  s.distances = distances->empty() ? std::vector<int>{0, 2} : *distances;
  s.tokens = absl::GetFlag(FLAGS_tokens);
  if (s.tokens < 2) return absl::InvalidArgumentError("--tokens must be at least 2");
  s.seed = absl::GetFlag(FLAGS_seed);
  s.plot = absl::GetFlag(FLAGS_plot);
  auto base = BaseEngineOptionsFromFlags();
  if (!base.ok()) return base.status();
  s.base = *std::move(base);
  s.base.show_progress = false;  // a trunk-load bar per run would bury the benchmark's progress
  // The last token sampled is not decoded, and a sequence ends before it fills the context.
  if (s.base.max_context != kAutoMaxContext && s.base.max_context <= kPromptTokens + s.tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-context must be at least ", kPromptTokens + s.tokens + 1, " (the ",
                     kPromptTokens, "-token prompt, --tokens and the token sampled last)"));
  }
  return s;
}

double RawGbps(const std::vector<Row>& raw_rows, const DecodeRow& row) {
  for (const Row& r : raw_rows) {
    if (r.volume == row.volume && r.volume_flags == row.volume_flags && r.profile == row.profile &&
        r.queue_depth == row.queue_depth) {
      return Median(r.gbps);
    }
  }
  return 0;
}

// Counts combinations for the progress lines.
struct Progress {
  int done = 0;
  int total = 0;
  bool quiet = false;
};

// Every run of one combination; stops early (rows so far kept) on Ctrl-C.
absl::Status RunCombination(const DecodeSettings& s, const EngineOptions& options,
                            const std::vector<int32_t>& prompt, Progress& progress,
                            DecodeRow* row) {
  ++progress.done;
  for (int rep = 0; rep < s.raw.repeat; ++rep) {
    auto run = RunCold(options, prompt, s.tokens, row);
    if (!run.ok()) return run.status();
    row->drives = static_cast<int>(run->devices.size());
    row->runs.push_back(*run);
    if (progress.quiet) continue;
    std::fprintf(
        stderr, "k3 bench: [%d/%d] %s%s %s qd %d distance %d run %d/%d: %s s/token, %s GB/token\n",
        progress.done, progress.total, row->volume.c_str(), VolumesLabel(row->volume_flags).c_str(),
        row->profile.c_str(), row->queue_depth, row->prefetch_distance, rep + 1, s.raw.repeat,
        Sig3(run->seconds_per_token).c_str(),
        Sig3(Ratio(static_cast<double>(BytesRead(run->decode)) / 1e9,
                   static_cast<double>(run->decode.tokens)))
            .c_str());
  }
  return absl::OkStatus();
}

// The raw cells of one volume with a set of --volume directories, then its engine runs over
// profile x depth x distance.
absl::Status RunVolume(const DecodeSettings& s, Volume& v, const std::vector<io::Volume>& volumes,
                       const std::vector<int32_t>& prompt, std::mt19937_64& rng, Progress& progress,
                       std::vector<Row>* raw_rows, std::vector<DecodeRow>* rows,
                       EngineSetup* setup) {
  if (absl::Status st = MeasureVolume(s.raw, v, volumes, rng, raw_rows, setup); !st.ok()) {
    return st;
  }
  for (const io::StorageProfile& profile : s.raw.profiles) {
    for (int depth : s.raw.depths) {
      for (int distance : s.distances) {
        DecodeRow row{.volume = v.dir,
                      .volume_flags = io::VolumeSpecs(volumes),
                      .profile = profile.name,
                      .queue_depth = depth,
                      .prefetch_distance = distance};
        row.raw_gbps = RawGbps(*raw_rows, row);
        EngineOptions o = s.base;
        o.model_dir = v.dir;
        o.volumes = volumes;
        o.storage_profile = profile;
        o.queue_depth = depth;
        o.prefetch_distance = distance;
        absl::Status st = RunCombination(s, o, prompt, progress, &row);
        if (!row.runs.empty()) rows->push_back(std::move(row));
        if (!st.ok()) return st;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int32_t> PromptIds(uint64_t seed, int64_t vocab_size) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab_size - 1));
  std::vector<int32_t> ids(kPromptTokens);
  for (int32_t& id : ids) id = pick(rng);
  return ids;
}

absl::StatusOr<DecodeRun> RunCold(const EngineOptions& options, const std::vector<int32_t>& prompt,
                                  int tokens, DecodeRow* row, bool replay) {
  auto opened = Engine::Open(options);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<Engine> engine = *std::move(opened);
  if (row != nullptr && row->engine_settings.is_null()) {
    row->engine_settings = engine->Settings();
    row->memory_plan = PlanText(*engine);
  }
  // Greedy through the batch scheduler (a batch of one, as generate runs): `tokens` decode
  // steps, so one more token is sampled than decoded; the reads are logged from the first.
  DecodeRun run;
  std::vector<double> steps;
  std::vector<io::DeviceReport> devices_before;
  BatchEvents events;
  events.on_prompt_end = [&](size_t, std::span<const float>, const StepMetrics& prompt) {
    run.prefill_seconds = prompt.seconds;
    devices_before = engine->devices();
    if (replay) engine->StartReadLog();
  };
  bool first = true;
  events.on_token = [&](size_t, int32_t, std::span<const float>, const StepMetrics& step) {
    if (std::exchange(first, false)) return;  // the first token's figures are the prompt's
    steps.push_back(step.seconds);
    run.decode.Add(step);
  };
  events.stop = [] { return Interrupted(); };
  BatchRequest request;
  request.prompt = prompt;
  request.max_tokens = tokens + 1;
  request.sampler.greedy = true;
  auto done = RunSequence(*engine, std::move(request), events);
  if (!done.ok()) return done.status();
  if (done->finish == FinishReason::kInterrupted) return absl::CancelledError("interrupted");
  run.ids.assign(done->ids.begin(), done->ids.begin() + std::min<size_t>(tokens, done->ids.size()));
  run.seconds_per_token = Median(steps);
  run.devices = io::DevicesSince(devices_before, engine->devices());
  if (!replay) return run;
  const io::ReadLog log = engine->TakeReadLog();
  engine.reset();  // its memory back before the replay's buffers
  auto floor = io::ReplayReadLog(log, 1ull << 30, [&](const std::vector<double>& replays) {
    return ReplayAgain(replays, run.decode.seconds);
  });
  if (!floor.ok()) return floor.status();
  run.floor = *floor;
  return run;
}

int RunDecode(const std::vector<std::string>& dirs) {
  auto settings = ReadDecodeSettings();
  if (!settings.ok()) return UsageError(kName, std::string(settings.status().message()));
  std::vector<Volume> volumes;
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& dir : dirs) {
    auto v = LoadVolume(dir);
    if (!v.ok()) return ReportError(kName, v.status());
    prompts.push_back(PromptIds(settings->seed, v->checkpoint->config().vocab_size));
    volumes.push_back(*std::move(v));
  }
  InstallInterruptHandler();
  std::mt19937_64 rng(std::random_device{}());
  const std::vector<std::vector<io::Volume>> sets = VolumeSets(settings->raw);
  Progress progress{
      .total = static_cast<int>(dirs.size() * sets.size() * settings->raw.profiles.size() *
                                settings->raw.depths.size() * settings->distances.size()),
      .quiet = settings->raw.quiet};
  std::vector<Row> raw_rows;
  std::vector<DecodeRow> rows;
  EngineSetup setup;
  absl::Status status;
  for (size_t i = 0; i < volumes.size() && status.ok(); ++i) {
    for (size_t k = 0; k < sets.size() && status.ok(); ++k) {
      status = RunVolume(*settings, volumes[i], sets[k], prompts[i], rng, progress, &raw_rows,
                         &rows, &setup);
    }
  }
  if (!status.ok() && !Interrupted()) return ReportError(kName, status);
  std::printf("k3 bench: %s\n\n", Caption(*settings).c_str());
  PrintDecodeTable(rows, settings->raw.repeat, !settings->raw.volumes.empty());
  std::fflush(stdout);
  if (absl::Status st = WriteDecodeOutputs(rows, raw_rows, volumes, prompts, *settings, setup);
      !st.ok()) {
    return ReportError(kName, st);
  }
  return Interrupted() ? kExitInterrupted : kExitOk;
}

}  // namespace k3::cli::bench
