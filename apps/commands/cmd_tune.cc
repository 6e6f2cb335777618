// k3 tune: which queue depth, prefetch distance and width and compute threads make this model
// fastest on this volume (apps/tune/tune_sweep.h for how), printed as a table and as flags, and
// written as a settings file that generate, chat, bench and serve take (--settings FILE).
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/bench/decode_bench.h"
#include "apps/commands/commands.h"
#include "apps/options/cli.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/options/settings_file.h"
#include "apps/reports/run_report.h"
#include "apps/reports/tables.h"
#include "apps/tune/drive_depths.h"
#include "apps/tune/tune_sweep.h"
#include "core/checkpoint/config.h"
#include "core/util/median.h"
#include "io/file.h"
#include "io/storage_profile.h"

namespace k3::cli {
namespace {

constexpr char kTuneName[] = "tune";

absl::StatusOr<std::vector<int>> ListOr(std::string_view flag,
                                        const std::vector<std::string>& values,
                                        std::vector<int> fallback, int min, int max) {
  auto v = ParseIntList(flag, values, min, max);
  if (!v.ok() || v->empty()) return v.ok() ? fallback : v;
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
  return v;
}

std::vector<int> DefaultThreadCounts() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> v = {0};
  for (int t : {1, cores / 2}) {
    if (t >= 1 && t < cores && std::find(v.begin(), v.end(), t) == v.end()) v.push_back(t);
  }
  return v;
}

// Every value list a dimension may have; the engine's defaults are always among them.
absl::StatusOr<std::vector<tune::Dimension>> Dimensions(const ModelConfig& config) {
  const int top_k = static_cast<int>(config.num_experts_per_token);
  auto qd = ListOr("queue-depth", absl::GetFlag(FLAGS_queue_depth), {1, 4, 8, 16, 32, 64}, 1, 4096);
  auto dist = ListOr("prefetch-distance", absl::GetFlag(FLAGS_prefetch_distance), {0, 1, 2}, 0, 64);
  auto width =
      ListOr("prefetch-widths", absl::GetFlag(FLAGS_prefetch_widths), {0, 2 * top_k}, 0, 4096);
  auto threads =
      ListOr("thread-counts", absl::GetFlag(FLAGS_thread_counts), DefaultThreadCounts(), 0, 1024);
  for (const auto* s : {&qd, &dist, &width, &threads}) {
    if (!s->ok()) return s->status();
  }
  return std::vector<tune::Dimension>{
      {"queue-depth", &EngineOptions::queue_depth, *qd},
      {"prefetch-distance", &EngineOptions::prefetch_distance, *dist},
      {"prefetch-width", &EngineOptions::prefetch_width, *width},
      {"threads", &EngineOptions::threads, *threads}};
}

using bench::Sig3;

void PrintTable(const tune::SweepResult& r, const EngineOptions& defaults,
                const std::vector<tune::Dimension>& dims) {
  MarkdownTable table(
      {"setting", "value", "s/token (median)", "min-max", "runs", "x the value before", ""});
  for (const tune::DimensionResult& d : r.dimensions) {
    if (!d.fixed.empty()) {
      table.AddRow(
          {d.flag, absl::StrCat(d.chosen), "-", "-", "0", "-", absl::StrCat("chosen: ", d.fixed)});
      continue;
    }
    if (!d.skipped.empty()) {
      table.AddRow({d.flag, absl::StrCat(d.before), "-", "-", "0", "-",
                    absl::StrCat("skipped: ", d.skipped)});
      continue;
    }
    double before = 0;
    for (const tune::Trial& t : d.trials) {
      if (t.value == d.before) before = Median(t.seconds_per_token);
    }
    for (const tune::Trial& t : d.trials) {
      const double m = Median(t.seconds_per_token);
      const auto [lo, hi] =
          std::minmax_element(t.seconds_per_token.begin(), t.seconds_per_token.end());
      std::string note = t.value == d.chosen ? "chosen" : "";
      if (t.value == tune::ValueOf(defaults, dims, d.flag)) {
        note += note.empty() ? "default" : ", default";
      }
      table.AddRow({d.flag, absl::StrCat(t.value), Sig3(m), absl::StrCat(Sig3(*lo), "-", Sig3(*hi)),
                    absl::StrCat(t.seconds_per_token.size()),
                    before > 0 ? absl::StrFormat("%.2f", before / m) : "-", note});
    }
  }
  std::fputs(table.text().c_str(), stdout);
}

std::map<std::string, std::string> Flags(const EngineOptions& o,
                                         const std::vector<tune::Dimension>& dims) {
  std::map<std::string, std::string> flags;
  for (const tune::Dimension& d : dims) flags[d.flag] = absl::StrCat(o.*d.field);
  return flags;
}

std::string AsFlags(const std::map<std::string, std::string>& flags) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : flags) parts.push_back(absl::StrCat("--", name, " ", value));
  return absl::StrJoin(parts, " ");
}

// The verdict lines under the table; the figures the settings file keeps.
nlohmann::json PrintVerdict(const tune::SweepResult& r, const std::string& profile,
                            const std::vector<tune::Dimension>& dims) {
  const auto flags = Flags(r.best, dims);
  std::printf("\nrecommended (%s): %s\n", profile.c_str(), AsFlags(flags).c_str());
  nlohmann::json measured = {{"runs", r.runs}, {"seconds", r.elapsed_seconds}};
  const bool swept = std::any_of(r.dimensions.begin(), r.dimensions.end(), [](const auto& d) {
    return d.skipped.empty() && d.fixed.empty();
  });
  if (r.pair_ratios.empty() && !swept) {
    std::printf("nothing was swept: these are the defaults\n");
  } else if (r.pair_ratios.empty()) {
    std::printf("these are the defaults: no value beat them by %.0f %% or more\n",
                100 * tune::kMargin);
  } else {
    const auto [lo, hi] = std::minmax_element(r.pair_ratios.begin(), r.pair_ratios.end());
    const double ratio = Median(r.pair_ratios);
    std::printf(
        "confirming run: %.2fx the defaults' speed (median of %zu alternating pairs, pairs "
        "%.2fx-%.2fx): defaults %s s/token, the pick %s s/token\n",
        ratio, r.pair_ratios.size(), *lo, *hi, Sig3(Median(r.default_seconds)).c_str(),
        Sig3(Median(r.best_seconds)).c_str());
    if (r.pick_rejected) {
      std::printf("the sweep's pick was not faster when confirmed: the defaults stay\n");
    }
    measured["speedup_over_defaults"] = ratio;
    measured["pair_ratios"] = r.pair_ratios;
  }
  std::printf("tokens: all %d runs decoded the same %zu tokens\n", r.runs, r.tokens.size());
  return {{"flags", flags}, {"measured", measured}};
}

// With several drives: each one's rate by queue depth, read alone, printed as a table; the
// queue-depth dimension is then fixed at the largest of the drives' depths, since the engine
// keeps one depth for every drive. The figures for the settings file (null with one drive).
absl::StatusOr<nlohmann::json> DriveDepths(const bench::Volume& model,
                                           const std::vector<io::Volume>& volumes,
                                           const io::StorageProfile& profile,
                                           tune::Dimension& queue_depth, int reads, int repeat,
                                           bool first) {
  auto drives = tune::MeasureDriveDepths(model, volumes, profile, queue_depth.values, reads, repeat,
                                         absl::GetFlag(FLAGS_quiet));
  if (!drives.ok()) return drives.status();
  if (drives->size() < 2) return nlohmann::json();
  const int depth = tune::ChosenDepth(*drives);
  std::printf(
      "%sk3 tune: %s, profile %s: %zu drives, each read alone (%d random whole experts a run, "
      "median of %d runs)\n\n%s\n",
      first ? "" : "\n", model.dir.c_str(), profile.name.c_str(), drives->size(), reads, repeat,
      tune::DriveDepthsTable(*drives).c_str());
  if (depth > 0) {
    std::printf(
        "queue depth %d: the largest of the drives' (the engine keeps one --queue-depth for "
        "every drive's reads, so no drive is held below its own); not swept below\n",
        depth);
    queue_depth.values = {depth};
    queue_depth.fixed = "the largest of the drives' depths (the per-drive table)";
  }
  return nlohmann::json{{"per_drive", tune::DriveDepthsJson(*drives)}, {"queue_depth", depth}};
}

int RunTune(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kTuneName, "unexpected argument " + positional[0]);
  auto base = BaseEngineOptionsFromFlags();
  if (!base.ok()) return ReportError(kTuneName, base.status());
  auto dir = ModelDirFromFlags();
  if (!dir.ok()) return ReportError(kTuneName, dir.status());
  base->model_dir = *dir;
  base->show_progress = false;
  // The config alone: every run opens the checkpoint anyway, and its header is the slow part.
  auto config = LoadModelConfig(*dir + "/config.json");
  if (!config.ok()) return ReportError(kTuneName, config.status());
  auto dims = Dimensions(*config);
  if (!dims.ok()) return UsageError(kTuneName, std::string(dims.status().message()));
  auto parsed = StorageProfilesFromFlags();
  if (!parsed.ok()) return UsageError(kTuneName, std::string(parsed.status().message()));
  const double budget = absl::GetFlag(FLAGS_budget_s);
  const int tokens = absl::GetFlag(FLAGS_tokens);
  const int rounds = absl::GetFlag(FLAGS_repeat);
  if (budget <= 0) return UsageError(kTuneName, "--budget-s must be positive");
  if (tokens < 2) return UsageError(kTuneName, "--tokens must be at least 2");
  if (rounds < 1) return UsageError(kTuneName, "--repeat must be at least 1");
  if (base->max_context != kAutoMaxContext && base->max_context < bench::kPromptTokens + tokens) {
    return UsageError(
        kTuneName, absl::StrCat("--max-context must be at least ", bench::kPromptTokens + tokens));
  }
  const int reads = absl::GetFlag(FLAGS_reads);
  if (reads < 1) return UsageError(kTuneName, "--reads must be at least 1");
  // With --volume, the drives' own depths (apps/tune/drive_depths.h) need the experts' places.
  std::optional<bench::Volume> model;
  if (!base->volumes.empty()) {
    auto v = bench::LoadVolume(*dir);
    if (!v.ok()) return ReportError(kTuneName, v.status());
    model = *std::move(v);
  }
  InstallInterruptHandler();
  nlohmann::json by_profile = nlohmann::json::object();
  nlohmann::json first;
  for (const io::StorageProfile& parsed_profile : *parsed) {
    const std::string& profile = parsed_profile.name;
    const auto drives_start = absl::Now();
    std::vector<tune::Dimension> profile_dims = *dims;
    nlohmann::json drives_json;
    if (model.has_value()) {
      auto queue_depth = std::find_if(profile_dims.begin(), profile_dims.end(),
                                      [](const auto& d) { return d.flag == "queue-depth"; });
      auto drives = DriveDepths(*model, base->volumes, parsed_profile, *queue_depth, reads, rounds,
                                first.is_null());
      if (!drives.ok()) return ReportError(kTuneName, drives.status());
      drives_json = *std::move(drives);
    }
    const double drive_seconds = absl::ToDoubleSeconds(absl::Now() - drives_start);
    tune::SweepOptions o{.defaults = *base,
                         .dimensions = profile_dims,
                         .prompt = bench::PromptIds(absl::GetFlag(FLAGS_seed), config->vocab_size),
                         .tokens = tokens,
                         .rounds = rounds,
                         .budget_seconds = std::max(
                             0.0, budget / static_cast<double>(parsed->size()) - drive_seconds),
                         .quiet = absl::GetFlag(FLAGS_quiet),
                         .show_bar = ShowProgress(),
                         .label = profile};
    o.defaults.storage_profile = parsed_profile;
    auto r = tune::Sweep(o);
    if (!r.ok()) return Interrupted() ? kExitInterrupted : ReportError(kTuneName, r.status());
    std::printf(
        "%sk3 tune: %s, profile %s: %d cold runs of %d tokens in %.1f s (budget %.0f s)\n\n",
        first.is_null() && drives_json.is_null() ? "" : "\n", dir->c_str(), profile.c_str(),
        r->runs, tokens, r->elapsed_seconds, o.budget_seconds);
    PrintTable(*r, o.defaults, *dims);
    nlohmann::json verdict = PrintVerdict(*r, profile, *dims);
    if (!drives_json.is_null()) verdict["drives"] = drives_json;
    if (first.is_null()) first = verdict;
    by_profile[profile] = verdict;
  }
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    const nlohmann::json file = SettingsJson(
        first["flags"].get<std::map<std::string, std::string>>(),
        {{"model", *dir},
         {"tuned", absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone())},
         {"tokens", tokens},
         {"profiles", by_profile}});
    if (absl::Status st = io::WriteFileAtomically(out, file.dump(2) + "\n"); !st.ok()) {
      return ReportError(kTuneName, st);
    }
    std::printf("settings written to %s: k3 generate|chat|bench|serve --settings %s\n", out.c_str(),
                out.c_str());
  }
  return kExitOk;
}

}  // namespace

const Subcommand& TuneCommand() {
  static const Subcommand kCommand = {
      kTuneName,
      "find the fastest queue depth, prefetch distance and width and threads on this volume",
      "tune --model DIR [--budget-s 600] [--queue-depth 1,4,8,16,32,64] [--prefetch-distance "
      "0,1,2]\n"
      "               [--prefetch-widths 0,W] [--thread-counts 0,1] [--storage-profile P,...]\n"
      "               [--volume DIR[@PROFILE] ...] [--reads N] [--tokens N] [--repeat R]\n"
      "               [--out FILE] [memory flags]",
      "Sweeps one setting at a time, in this order: queue depth, prefetch distance, prefetch\n"
      "width (only when lookahead is chosen), compute threads. Each value runs --repeat short\n"
      "cold runs (a fresh engine, the 16-token prompt of --seed, --tokens greedy steps; the\n"
      "median step is the run's s/token), the values alternated round by round so that each\n"
      "sees the same noise; a value replaces the current one only when its median is at least\n"
      "3 % faster. Then a confirming run alternates the defaults and the pick --repeat times.\n"
      "Prints a table per storage profile, the recommended flags and how much faster they were\n"
      "than the defaults (median and spread of the confirming pairs); if the pick was not\n"
      "faster there, the defaults stay. Every run must decode the same tokens (it says so; a\n"
      "setting that changed them is an error, exit 1). --budget-s bounds the time: what does\n"
      "not fit is skipped and named. --out writes a file that generate, chat, bench and\n"
      "serve take with --settings FILE (flags on their command line still win).\n\n"
      "With --volume and several drives (file systems, or volumes with a profile of their\n"
      "own), each drive is first read alone at every queue depth of the list (--reads random\n"
      "whole experts of the copies it holds a run, median of --repeat runs), and a table gives\n"
      "each drive's GB/s by depth and the depth where its rate stops growing (the smallest\n"
      "within 3 % of its fastest). The engine takes one --queue-depth for every drive, so the\n"
      "queue depth is the largest of the drives' and is not swept by decode runs; the settings\n"
      "file keeps the per-drive figures under \"drives\" (a record: nothing reads them back).\n"
      "See docs/BENCHMARKS.md.",
      kTune,
      RunTune};
  return kCommand;
}

}  // namespace k3::cli
