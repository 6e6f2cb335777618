#include <algorithm>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "apps/bench/bench_plot.h"
#include "apps/bench/decode_bench.h"
#include "apps/bench/io_floor.h"
#include "apps/options/flags.h"
#include "apps/reports/device_report.h"
#include "apps/reports/tables.h"
#include "core/util/median.h"
#include "io/file.h"

namespace k3::cli::bench {

uint64_t BytesRead(const StepMetrics& m) {
  return m.expert_demand_bytes + m.expert_prefetch_used_bytes + m.expert_prefetch_wasted_bytes +
         m.trunk_bytes;
}

double Ratio(double num, double den) { return den > 0 ? num / den : NAN; }

namespace {

// One run's figures (seconds_per_token to trunk_gb); those of a row are their medians.
Figures RunFigures(const DecodeRun& r) {
  const StepMetrics& m = r.decode;
  const double tokens = static_cast<double>(m.tokens);
  const auto per_token_gb = [&](uint64_t bytes) {
    return Ratio(static_cast<double>(bytes) / 1e9, tokens);
  };
  Figures f;
  f.seconds_per_token = r.seconds_per_token;
  f.gb_per_token = per_token_gb(BytesRead(m));
  f.stall_fraction = Ratio(m.io_wait_seconds, m.seconds);
  f.disk_busy_fraction = Ratio(m.disk_busy_seconds, m.seconds);
  f.hit_rate = Ratio(static_cast<double>(m.cache_hits), static_cast<double>(m.cache_requests));
  f.precision =
      Ratio(static_cast<double>(m.prefetch_correct), static_cast<double>(m.prefetch_predicted));
  f.recall = Ratio(static_cast<double>(m.prefetch_correct), static_cast<double>(m.routed_experts));
  f.prefill_seconds = r.prefill_seconds;
  f.demand_gb = per_token_gb(m.expert_demand_bytes);
  f.prefetch_used_gb = per_token_gb(m.expert_prefetch_used_bytes);
  f.prefetch_wasted_gb = per_token_gb(m.expert_prefetch_wasted_bytes);
  f.trunk_gb = per_token_gb(m.trunk_bytes);
  f.mean_step_seconds = Ratio(m.seconds, tokens);
  if (r.floor.bytes > 0) {  // a run that read nothing has no floor ("-"); the row's: Summarize
    f.floor_gbps = Ratio(static_cast<double>(r.floor.bytes) / 1e9, r.floor.seconds);
  }
  return f;
}

// Median of one figure over the runs, ignoring NaN (NaN when every run gives NaN).
double MedianOf(const std::vector<Figures>& runs, double Figures::*field) {
  std::vector<double> v;
  for (const Figures& f : runs) {
    if (std::isfinite(f.*field)) v.push_back(f.*field);
  }
  return v.empty() ? NAN : Median(v);
}

std::string Fraction(double v) { return std::isfinite(v) ? absl::StrFormat("%.2f", v) : "-"; }

// JSON has no NaN: a figure the engine gave nothing to compute from is null.
nlohmann::json Figure(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

// What each drive did over the decode steps of every run of a row, and the steps' time.
std::pair<std::vector<io::DeviceReport>, double> RowDevices(const DecodeRow& r) {
  std::vector<io::DeviceReport> sum;
  double seconds = 0;
  for (const DecodeRun& run : r.runs) {
    seconds += run.decode.seconds;
    for (const io::DeviceReport& d : run.devices) {
      auto it = std::find_if(sum.begin(), sum.end(),
                             [&](const io::DeviceReport& s) { return s.id == d.id; });
      if (it == sum.end()) {
        sum.push_back(d);
        continue;
      }
      it->bytes += d.bytes;
      it->reads += d.reads;
      it->busy_seconds += d.busy_seconds;
      it->failovers += d.failovers;
      it->rate = d.rate;
    }
  }
  return {sum, seconds};
}

nlohmann::json DecodeRowJson(const DecodeRow& r) {
  const Figures f = Summarize(r);
  const auto [devices, device_seconds] = RowDevices(r);
  nlohmann::json j = {{"volume", r.volume},
                      {"volume_flags", r.volume_flags},
                      {"drives", r.drives},
                      {"devices", DevicesJson(devices, device_seconds)},
                      {"profile", r.profile},
                      {"queue_depth", r.queue_depth},
                      {"prefetch_distance", r.prefetch_distance},
                      {"seconds_per_token", Figure(f.seconds_per_token)},
                      {"tokens_per_second", Figure(f.tokens_per_second)},
                      {"gb_per_token", Figure(f.gb_per_token)},
                      {"gb_per_token_by_kind",
                       {{"expert_demand", Figure(f.demand_gb)},
                        {"expert_prefetch_used", Figure(f.prefetch_used_gb)},
                        {"expert_prefetch_wasted", Figure(f.prefetch_wasted_gb)},
                        {"trunk", Figure(f.trunk_gb)}}},
                      {"raw_gbps", r.raw_gbps},
                      {"io_floor_seconds_per_token", Figure(f.io_floor_seconds)},
                      {"ratio_to_io_floor", Figure(f.ratio_to_floor)},
                      {"io_floor_gbps", Figure(f.floor_gbps)},
                      {"io_floor_replays", f.io_floor_replays},
                      {"io_floor_spread", Figure(f.io_floor_spread)},
                      {"io_floor_note", f.io_floor_note},
                      {"stall_fraction", Figure(f.stall_fraction)},
                      {"disk_busy_fraction", Figure(f.disk_busy_fraction)},
                      {"hit_rate", Figure(f.hit_rate)},
                      {"prefetch_precision", Figure(f.precision)},
                      {"prefetch_recall", Figure(f.recall)},
                      {"prefill_seconds", Figure(f.prefill_seconds)},
                      {"engine_settings", r.engine_settings},
                      {"memory_plan", r.memory_plan}};
  j["runs"] = nlohmann::json::array();
  for (const DecodeRun& run : r.runs) {
    j["runs"].push_back({{"seconds_per_token", run.seconds_per_token},
                         {"prefill_seconds", run.prefill_seconds},
                         {"io_floor",
                          {{"seconds", run.floor.seconds},
                           {"replay_seconds", run.floor.replay_seconds},
                           {"bytes", run.floor.bytes},
                           {"reads", run.floor.reads},
                           {"concurrency", run.floor.concurrency},
                           {"drives", run.floor.devices.size()},
                           {"devices", DevicesJson(run.floor.devices, run.floor.seconds)}}},
                         {"devices", DevicesJson(run.devices, run.decode.seconds)},
                         {"ids", run.ids},
                         {"decode", run.decode.ToJson()}});
  }
  return j;
}

nlohmann::json DecodeSettingsJson(const DecodeSettings& s,
                                  const std::vector<std::vector<int32_t>>& prompts) {
  nlohmann::json profiles = nlohmann::json::array();
  for (const io::StorageProfile& p : s.raw.profiles) {
    profiles.push_back({{"name", p.name}, {"settings", p.Describe()}});
  }
  const nlohmann::json context = s.base.max_context == kAutoMaxContext
                                     ? nlohmann::json("auto")
                                     : nlohmann::json(s.base.max_context);
  return {{"tokens", s.tokens},
          {"repeat", s.raw.repeat},
          {"seed", s.seed},
          {"prompt_ids", prompts},  // one list per volume
          {"storage_profiles", profiles},
          {"volumes", io::VolumeSpecs(s.raw.volumes)},  // --volume, as given
          {"sweep_volumes", s.raw.sweep_volumes},
          {"queue_depths", s.raw.depths},
          {"prefetch_distances", s.distances},
          {"raw_reads", s.raw.reads},
          {"ram_gb", s.base.memory.ram_gb},
          {"preset", s.base.memory.preset},
          {"trunk_gb", s.base.memory.trunk_gb},
          {"cache_gb", s.base.memory.cache_gb},
          {"threads", s.base.threads},
          {"overlap", s.base.overlap},
          {"cache_policy", s.base.cache_policy},
          {"prefill_chunk", s.base.prefill_chunk == kAutoPrefillChunk
                                ? nlohmann::json("auto")
                                : nlohmann::json(s.base.prefill_chunk)},
          {"max_context", context}};
}

std::string CsvNumber(double v) { return std::isfinite(v) ? absl::StrFormat("%.6g", v) : ""; }

std::string DecodeCsv(const std::vector<DecodeRow>& rows, const DecodeSettings& s) {
  CsvTable csv(absl::StrSplit(
      "volume,profile,queue_depth,prefetch_distance,tokens,repeat,seconds_per_token,"
      "tokens_per_second,gb_per_token,raw_gbps,io_floor_seconds_per_token,ratio_to_io_floor,"
      "stall_fraction,disk_busy_fraction,hit_rate,prefetch_precision,prefetch_recall,"
      "prefill_seconds,expert_demand_gb_per_token,expert_prefetch_used_gb_per_token,"
      "expert_prefetch_wasted_gb_per_token,trunk_gb_per_token,ram_gb,preset,overlap,"
      "io_floor_replays,io_floor_spread,io_floor_note,drives,volume_flags,drive_ids,drive_bytes,"
      "drive_busy_fractions,drive_gbps",
      ','));
  for (const DecodeRow& r : rows) {
    const Figures f = Summarize(r);
    std::vector<std::string> cells = {
        CsvTable::Text(r.volume),          CsvTable::Text(r.profile), absl::StrCat(r.queue_depth),
        absl::StrCat(r.prefetch_distance), absl::StrCat(s.tokens),    absl::StrCat(r.runs.size())};
    for (double v : {f.seconds_per_token, f.tokens_per_second, f.gb_per_token, r.raw_gbps,
                     f.io_floor_seconds, f.ratio_to_floor, f.stall_fraction, f.disk_busy_fraction,
                     f.hit_rate, f.precision, f.recall, f.prefill_seconds, f.demand_gb,
                     f.prefetch_used_gb, f.prefetch_wasted_gb, f.trunk_gb, s.base.memory.ram_gb}) {
      cells.push_back(CsvNumber(v));
    }
    cells.push_back(CsvTable::Text(s.base.memory.preset));
    cells.push_back(s.base.overlap ? "true" : "false");
    cells.push_back(absl::StrCat(f.io_floor_replays));
    cells.push_back(CsvNumber(f.io_floor_spread));
    cells.push_back(CsvTable::Text(f.io_floor_note));
    // The drives, one entry each in every list (';' between them), in the JSON's order.
    const auto [devices, seconds] = RowDevices(r);
    std::vector<std::string> ids, bytes, busy, gbps;
    for (const nlohmann::json& d : DevicesJson(devices, seconds)) {
      ids.push_back(d["id"].get<std::string>());
      bytes.push_back(absl::StrCat(d["bytes"].get<uint64_t>()));
      busy.push_back(CsvNumber(d["busy_fraction"].get<double>()));
      gbps.push_back(CsvNumber(d["rate_bytes_per_second"].get<double>() / 1e9));
    }
    cells.push_back(absl::StrCat(r.drives));
    for (const auto& list : {r.volume_flags, ids, bytes, busy, gbps}) {
      cells.push_back(CsvTable::Text(absl::StrJoin(list, ";")));
    }
    csv.AddRow(cells);
  }
  return csv.text();
}

// Panels in the order of the table (volume, volumes read, then profile); a series per prefetch
// distance. With --volume, a panel's title says how many drives its rows read from.
std::vector<PlotPanel> PlotPanels(const std::vector<DecodeRow>& rows) {
  const bool drives = std::any_of(rows.begin(), rows.end(),
                                  [](const DecodeRow& r) { return !r.volume_flags.empty(); });
  std::vector<PlotPanel> panels;
  const DecodeRow* last = nullptr;
  for (const DecodeRow& r : rows) {
    if (last == nullptr || r.volume != last->volume || r.volume_flags != last->volume_flags ||
        r.profile != last->profile) {
      std::string title = absl::StrCat(r.volume, " \xC2\xB7 ", r.profile);
      if (drives) {
        absl::StrAppend(&title, " \xC2\xB7 ", r.drives, r.drives == 1 ? " drive" : " drives");
      }
      panels.push_back({title, {}});
      last = &r;
    }
    std::vector<PlotSeries>& series = panels.back().series;
    auto it = std::find_if(series.begin(), series.end(), [&](const PlotSeries& s) {
      return s.prefetch_distance == r.prefetch_distance;
    });
    if (it == series.end()) it = series.insert(series.end(), {r.prefetch_distance, {}});
    it->points.push_back({r.queue_depth, Summarize(r).seconds_per_token});
  }
  return panels;
}

}  // namespace

Figures Summarize(const DecodeRow& row) {
  std::vector<Figures> runs;
  for (const DecodeRun& r : row.runs) runs.push_back(RunFigures(r));
  Figures f;
  for (double Figures::*field :
       {&Figures::seconds_per_token, &Figures::gb_per_token, &Figures::stall_fraction,
        &Figures::disk_busy_fraction, &Figures::hit_rate, &Figures::precision, &Figures::recall,
        &Figures::prefill_seconds, &Figures::demand_gb, &Figures::prefetch_used_gb,
        &Figures::prefetch_wasted_gb, &Figures::trunk_gb, &Figures::mean_step_seconds,
        &Figures::floor_gbps}) {
    f.*field = MedianOf(runs, field);
  }
  // Each replay is one sample of how fast the volume reads these requests, and on a shared disk
  // the samples of one row differ by tens of percent; the fastest is the estimate of what it
  // can do. The ratio sets the row's median mean step against it, when the replays make a floor
  // at all (apps/bench/io_floor.h, docs/BENCHMARKS.md).
  std::vector<RunReplays> replays;
  for (const DecodeRun& r : row.runs) {
    replays.push_back(
        {.seconds = r.floor.bytes > 0 ? r.floor.replay_seconds : std::vector<double>{},
         .tokens = static_cast<double>(r.decode.tokens)});
  }
  const FloorVerdict floor = JudgeFloor(f.mean_step_seconds, replays);
  f.io_floor_seconds = floor.seconds_per_token;
  f.ratio_to_floor = floor.ratio;
  f.io_floor_replays = floor.replays;
  f.io_floor_spread = floor.spread;
  f.io_floor_note = floor.note;
  // From the medians, so that the table's columns reproduce each other.
  f.tokens_per_second = Ratio(1, f.seconds_per_token);
  return f;
}

std::string Sig3(double v) {
  if (!std::isfinite(v)) return "-";
  if (v == 0) return "0";
  const int decimals = std::clamp(2 - static_cast<int>(std::floor(std::log10(std::fabs(v)))), 0, 6);
  return absl::StrFormat("%.*f", decimals, v);
}

void PrintDecodeTable(const std::vector<DecodeRow>& rows, int repeat, bool drives) {
  std::vector<std::string> header = {"volume", "profile"};
  if (drives) header.insert(header.begin() + 1, {"+volumes", "drives"});
  header.insert(header.end(), {"queue depth", "prefetch distance",
                               absl::StrCat("s/token (median of ", repeat, ")"), "tokens/s",
                               "GB/token", "raw GB/s", "x I/O floor", "stall", "hit rate",
                               "prefetch precision", "prefetch recall"});
  MarkdownTable table(header);
  // A row whose replays make no floor shows "- [n]", and note n below the table says why.
  std::vector<std::string> notes;
  for (const DecodeRow& r : rows) {
    const Figures f = Summarize(r);
    if (!f.io_floor_note.empty()) {
      notes.push_back(absl::StrFormat("[%d] %s%s %s, queue depth %d, prefetch distance %d: %s",
                                      notes.size() + 1, r.volume, VolumesLabel(r.volume_flags),
                                      r.profile, r.queue_depth, r.prefetch_distance,
                                      f.io_floor_note));
    }
    const std::string ratio = FloorCell({.ratio = f.ratio_to_floor, .note = f.io_floor_note},
                                        static_cast<int>(notes.size()));
    std::vector<std::string> cells = {r.volume, r.profile};
    if (drives) {
      cells.insert(cells.begin() + 1,
                   {absl::StrCat(r.volume_flags.size()), absl::StrCat(r.drives)});
    }
    cells.insert(cells.end(),
                 {absl::StrCat(r.queue_depth), absl::StrCat(r.prefetch_distance),
                  Sig3(f.seconds_per_token), Sig3(f.tokens_per_second), Sig3(f.gb_per_token),
                  Sig3(r.raw_gbps), ratio, Fraction(f.stall_fraction), Fraction(f.hit_rate),
                  Fraction(f.precision), Fraction(f.recall)});
    table.AddRow(cells);
  }
  std::fputs(table.text().c_str(), stdout);
  if (!notes.empty()) {
    std::printf("\nx I/O floor not shown:\n%s\n", absl::StrJoin(notes, "\n").c_str());
  }
}

std::string Caption(const DecodeSettings& s) {
  return absl::StrFormat(
      "%d greedy decode tokens after a %d-token prompt per run; each run cold (a fresh engine); "
      "medians of %d runs",
      s.tokens, kPromptTokens, s.raw.repeat);
}

absl::Status WriteDecodeOutputs(const std::vector<DecodeRow>& rows,
                                const std::vector<Row>& raw_rows,
                                const std::vector<Volume>& volumes,
                                const std::vector<std::vector<int32_t>>& prompts,
                                const DecodeSettings& s, const EngineSetup& setup) {
  if (const std::string path = absl::GetFlag(FLAGS_report_json); !path.empty()) {
    nlohmann::json json = SetupJson("decode", volumes, setup);
    json["settings"] = DecodeSettingsJson(s, prompts);
    json["raw"] = nlohmann::json::array();
    for (const Row& r : raw_rows) json["raw"].push_back(RawRowJson(r));
    json["results"] = nlohmann::json::array();
    for (const DecodeRow& r : rows) json["results"].push_back(DecodeRowJson(r));
    if (absl::Status st = io::WriteFileAtomically(path, json.dump(2) + "\n"); !st.ok()) return st;
  }
  if (const std::string path = absl::GetFlag(FLAGS_out_csv); !path.empty()) {
    if (absl::Status st = io::WriteFileAtomically(path, DecodeCsv(rows, s)); !st.ok()) return st;
  }
  if (!s.plot.empty()) {
    return io::WriteFileAtomically(s.plot, RenderBenchPlot(PlotPanels(rows), Caption(s)));
  }
  return absl::OkStatus();
}

}  // namespace k3::cli::bench
