// k3 bench: storage benchmarks. The decode benchmark runs the engine, cold, over every
// combination of volume (model directory x storage profile), queue depth and prefetch distance,
// and sets its s/token against the I/O floor: the bytes it read per token at the raw bandwidth
// of the same volume, profile and depth, measured in the same run (DESIGN.md section 5).
// `--raw` measures that raw bandwidth alone: random whole experts of a checkpoint read with
// O_DIRECT at each queue depth, side by side with fio on the same files, block size and depth
// when fio is installed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "apps/bench_plot.h"
#include "apps/commands.h"
#include "apps/engine_flags.h"
#include "apps/flags.h"
#include "apps/run_report.h"
#include "core/checkpoint.h"
#include "io/aligned_buffer.h"
#include "io/file.h"
#include "io/read_engine.h"
#include "io/storage_profile.h"
#include "nlohmann/json.hpp"
#include "pipeline/engine.h"

ABSL_FLAG(int32_t, tokens, 24,
          "Greedy decode steps per run of the decode benchmark (at least 2); s/token is their "
          "median.");
ABSL_FLAG(std::string, plot, "",
          "Write an SVG plot: s/token against queue depth, a line per prefetch distance, a panel "
          "per volume (model directory x storage profile).");
ABSL_FLAG(bool, raw, false,
          "Measure only the io layer's read bandwidth: random whole experts, O_DIRECT, at each "
          "queue depth.");
ABSL_FLAG(
    int32_t, reads, 96,
    "Experts read per raw bandwidth measurement (--raw, and the decode benchmark's raw column): "
    "each a different expert, chosen at random.");
ABSL_FLAG(int32_t, chunk_kib, 0,
          "Split reads into chunks of this many KiB (--raw; 0: the engine's default).");
ABSL_FLAG(bool, huge_pages, true,
          "Back the read buffers with huge pages where available (--nohuge-pages: 4 KiB pages, "
          "like fio's buffers).");
ABSL_FLAG(bool, fio, true,
          "With --raw and the direct profile, also run fio (if installed) on the same files, "
          "block size and queue depth, interleaved with k3's runs (--nofio to skip).");

namespace k3::cli {
namespace {

constexpr char kName[] = "bench";

struct Volume {
  std::string dir;
  std::unique_ptr<Checkpoint> checkpoint;
  std::vector<const ExpertLocation*> experts;
  std::vector<std::string> expert_shards;  // shards holding expert bytes (for fio)
  uint64_t expert_bytes = 0;               // of the first expert (the table's MB/request)
  uint64_t slot_bytes = 0;                 // buffer for the largest expert's aligned spans
  bool direct = true;                      // O_DIRECT accepted on every shard
};

struct Row {
  std::string volume = "";
  std::string profile = "";
  int queue_depth = 0;
  std::vector<double> gbps = {};
  std::vector<double> iops = {};
  std::vector<double> fio_gbps = {};
  double mb_per_request = 0;
};

// How the io layer ran, for the table's caption and the JSON.
struct EngineSetup {
  std::string backend = "";  // io_uring or pread
  bool registered = false;   // buffers registered with io_uring
  std::string pages = "";    // what backs the buffers
  uint64_t chunk_bytes = 0;

  std::string Describe() const {
    return absl::StrCat(backend, ", ", chunk_bytes >> 10, " KiB chunks, ",
                        registered ? "registered " : "", "buffers on ", pages);
  }
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

absl::StatusOr<std::vector<int>> ParseDepths(const std::vector<std::string>& values) {
  auto depths = ParseIntList("queue-depth", values, 1, 4096);
  if (depths.ok() && depths->empty()) depths = std::vector<int>{1, 4, 16, 32};
  return depths;
}

absl::StatusOr<Volume> LoadVolume(const std::string& dir) {
  Volume v;
  v.dir = dir;
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  v.checkpoint = *std::move(ckpt);
  const ModelConfig& c = v.checkpoint->config();
  std::vector<bool> holds_experts(v.checkpoint->shard_paths().size(), false);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.is_dense(l)) continue;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const ExpertLocation& loc = v.checkpoint->expert(l, e);
      if (loc.spans.empty()) continue;
      uint64_t slot = 0;
      for (const ByteSpan& s : loc.spans) {
        slot += io::BufferBytesFor(s.offset, s.length);
        holds_experts[s.shard] = true;
      }
      v.slot_bytes = std::max(v.slot_bytes, slot);
      v.experts.push_back(&loc);
    }
  }
  if (v.experts.empty()) return absl::InvalidArgumentError(dir + " has no routed experts");
  for (size_t i = 0; i < holds_experts.size(); ++i) {
    if (holds_experts[i]) v.expert_shards.push_back(v.checkpoint->shard_paths()[i]);
  }
  v.expert_bytes = v.experts.front()->total_bytes;
  return v;
}

struct Measurement {
  double seconds = 0;
  uint64_t bytes = 0;
  int experts = 0;
};

// Reads `order` (whole experts) keeping `depth` experts in flight, one buffer slot each.
class RawRun {
 public:
  RawRun(io::ReadEngine& engine, const std::vector<io::FileId>& shard_ids,
         const io::BufferArena& arena, uint64_t slot_bytes)
      : engine_(engine), shard_ids_(shard_ids), arena_(arena), slot_bytes_(slot_bytes) {}

  absl::StatusOr<Measurement> Run(const std::vector<const ExpertLocation*>& order, int depth) {
    order_ = &order;
    next_ = 0;
    pending_.assign(depth, 0);
    Measurement m;
    const auto start = std::chrono::steady_clock::now();
    for (int slot = 0; slot < depth && next_ < order.size(); ++slot) {
      if (absl::Status s = SubmitNext(slot); !s.ok()) return s;
    }
    while (m.experts < static_cast<int>(order.size())) {
      std::optional<io::ReadResult> r = engine_.WaitAny();
      if (!r) continue;
      if (!r->status.ok()) return r->status;
      const int slot = static_cast<int>(r->user_data);
      if (--pending_[slot] > 0) continue;
      ++m.experts;
      m.bytes += slot_expert_bytes_[slot];
      if (next_ < order.size()) {
        if (absl::Status s = SubmitNext(slot); !s.ok()) return s;
      }
    }
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return m;
  }

 private:
  absl::Status SubmitNext(int slot) {
    const ExpertLocation& loc = *(*order_)[next_++];
    slot_expert_bytes_.resize(pending_.size());
    slot_expert_bytes_[slot] = loc.total_bytes;
    uint64_t pos = static_cast<uint64_t>(slot) * slot_bytes_;
    for (const ByteSpan& span : loc.spans) {
      const uint64_t need = io::BufferBytesFor(span.offset, span.length);
      io::ReadRequest req;
      req.file = shard_ids_[span.shard];
      req.offset = span.offset;
      req.length = span.length;
      req.buffer = arena_.Slice(pos, need);
      req.user_data = static_cast<uint64_t>(slot);
      pos += need;
      ++pending_[slot];
      auto id = engine_.Submit(std::move(req));
      if (!id.ok()) return id.status();
    }
    return absl::OkStatus();
  }

  io::ReadEngine& engine_;
  const std::vector<io::FileId>& shard_ids_;
  const io::BufferArena& arena_;
  uint64_t slot_bytes_;
  const std::vector<const ExpertLocation*>* order_ = nullptr;
  size_t next_ = 0;
  std::vector<int> pending_;
  std::vector<uint64_t> slot_expert_bytes_;
};

// ---------------------------------------------------------------------------------------------
// fio, for the same files, block size and depth.

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::optional<std::string> RunCommand(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  if (::pclose(pipe) != 0) return std::nullopt;
  return out;
}

bool FioAvailable() {
  static const bool available = [] {
    auto out = RunCommand("fio --version 2>/dev/null");
    return out.has_value() && out->rfind("fio-", 0) == 0;
  }();
  return available;
}

// fio's bandwidth in bytes/s: random reads of `block` bytes (O_DIRECT, io_uring, fixed buffers)
// at random block-aligned offsets of the expert shards, `depth` in flight, `total` bytes in all.
std::optional<double> MeasureFio(const Volume& v, uint64_t block, int depth, uint64_t total) {
  std::vector<std::string> escaped;
  for (const std::string& f : v.expert_shards) {
    escaped.push_back(absl::StrReplaceAll(f, {{":", "\\:"}}));  // fio separates files with ':'
  }
  const std::string cmd =
      absl::StrCat("fio --name=k3-raw --ioengine=io_uring --direct=1 --rw=randread --bs=", block,
                   " --iodepth=", depth, " --io_size=", total, " --randrepeat=0 --norandommap",
                   // Registered buffers and files, as k3 uses: without them fio pins the pages of
                   // every 17.5 MB buffer per read and measures that rather than the disk.
                   " --fixedbufs --registerfiles --output-format=json --filename=",
                   ShellQuote(absl::StrJoin(escaped, ":")), " 2>/dev/null");
  auto out = RunCommand(cmd);
  if (!out) return std::nullopt;
  const size_t brace = out->find('{');
  if (brace == std::string::npos) return std::nullopt;
  auto json = nlohmann::json::parse(out->substr(brace), nullptr, false);
  if (json.is_discarded()) return std::nullopt;
  const double bw = json["jobs"][0]["read"].value("bw_bytes", 0.0);
  return bw > 0 ? std::optional<double>(bw) : std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Output.

std::string F2(double v) { return absl::StrFormat("%.2f", v); }

void PrintTable(const std::vector<Row>& rows, bool show_volume, int repeat) {
  bool any_fio = false;
  for (const Row& r : rows) any_fio |= !r.fio_gbps.empty();
  std::string header = show_volume ? "| volume " : "";
  absl::StrAppend(&header, "| profile | queue depth | GB/s (median of ", repeat,
                  ") | min-max GB/s | IOPS | MB/request |");
  if (any_fio) absl::StrAppend(&header, " fio GB/s | k3/fio |");
  std::printf("%s\n", header.c_str());
  std::string rule;
  for (char ch : header) rule += ch == '|' ? '|' : '-';
  std::printf("%s\n", rule.c_str());
  for (const Row& r : rows) {
    std::string line = show_volume ? absl::StrCat("| ", r.volume, " ") : "";
    const auto [lo, hi] = std::minmax_element(r.gbps.begin(), r.gbps.end());
    absl::StrAppend(&line, "| ", r.profile, " | ", r.queue_depth, " | ", F2(Median(r.gbps)), " | ",
                    F2(*lo), "-", F2(*hi), " | ", absl::StrFormat("%.1f", Median(r.iops)), " | ",
                    F2(r.mb_per_request), " |");
    if (any_fio) {
      if (r.fio_gbps.empty()) {
        absl::StrAppend(&line, " - | - |");
      } else {
        const double fio = Median(r.fio_gbps);
        absl::StrAppend(&line, " ", F2(fio), " | ", F2(Median(r.gbps) / fio), " |");
      }
    }
    std::printf("%s\n", line.c_str());
  }
}

// The io layer's setup and the volumes: the head of both benchmarks' JSON.
nlohmann::json SetupJson(const std::string& benchmark, const std::vector<Volume>& volumes,
                         const EngineSetup& setup) {
  nlohmann::json out = {{"benchmark", benchmark},
                        {"backend", setup.backend},
                        {"chunk_bytes", setup.chunk_bytes},
                        {"registered_buffers", setup.registered},
                        {"buffer_pages", setup.pages}};
  out["volumes"] = nlohmann::json::array();
  for (const Volume& v : volumes) {  // what an outside tool (fio) needs to read the same bytes
    out["volumes"].push_back({{"dir", v.dir},
                              {"expert_bytes", v.expert_bytes},
                              {"experts", v.experts.size()},
                              {"expert_files", v.expert_shards},
                              {"o_direct", v.direct}});
  }
  return out;
}

nlohmann::json RawRowJson(const Row& r) {
  nlohmann::json j = {{"volume", r.volume},
                      {"profile", r.profile},
                      {"queue_depth", r.queue_depth},
                      {"gbps", r.gbps},
                      {"gbps_median", Median(r.gbps)},
                      {"iops_median", Median(r.iops)},
                      {"mb_per_request", r.mb_per_request}};
  if (!r.fio_gbps.empty()) {
    j["fio_gbps"] = r.fio_gbps;
    j["fio_gbps_median"] = Median(r.fio_gbps);
    j["ratio_to_fio"] = Median(r.gbps) / Median(r.fio_gbps);
  }
  return j;
}

nlohmann::json ToJson(const std::vector<Row>& rows, const std::vector<Volume>& volumes,
                      const EngineSetup& setup) {
  nlohmann::json out = SetupJson("raw", volumes, setup);
  out["results"] = nlohmann::json::array();
  for (const Row& r : rows) out["results"].push_back(RawRowJson(r));
  return out;
}

std::string ToCsv(const std::vector<Row>& rows) {
  std::string csv =
      "volume,profile,queue_depth,gbps_median,iops_median,mb_per_request,"
      "fio_gbps_median,ratio_to_fio\n";
  for (const Row& r : rows) {
    const double fio = Median(r.fio_gbps);
    absl::StrAppend(
        &csv, r.volume, ",\"", r.profile, "\",", r.queue_depth, ",",
        absl::StrFormat("%.4f,%.2f,%.4f,", Median(r.gbps), Median(r.iops), r.mb_per_request),
        fio > 0 ? absl::StrFormat("%.4f,%.4f", fio, Median(r.gbps) / fio) : ",", "\n");
  }
  return csv;
}

// ---------------------------------------------------------------------------------------------

struct RawSettings {
  std::vector<int> depths;
  std::vector<io::StorageProfile> profiles;
  int repeat = 3;
  int reads = 96;
  uint64_t chunk_bytes = 0;
  bool fio = true;
  bool huge_pages = true;
  bool quiet = false;
};

absl::StatusOr<std::unique_ptr<io::ReadEngine>> MakeEngine(const RawSettings& s,
                                                           const io::StorageProfile& profile,
                                                           int depth,
                                                           const io::BufferArena& arena) {
  io::EngineOptions o;
  o.queue_depth = depth;
  o.profile = profile;
  o.arena = &arena;
  o.notices = false;  // a refused O_DIRECT is reported once per volume (NoteDirect), not per file
  if (s.chunk_bytes > 0) o.chunk_bytes = s.chunk_bytes;
  return io::ReadEngine::Create(o);
}

// Warns once per volume when its file system refuses O_DIRECT: reads then come from the page
// cache after the first run, so neither the raw bandwidth nor "cold" runs mean what they say.
void NoteDirect(const io::FileInfo& file, Volume& v) {
  if (file.direct || !v.direct) return;
  v.direct = false;
  std::fprintf(stderr,
               "k3 bench: warning: %s: the file system refuses O_DIRECT; reads go through the page "
               "cache, so repeated runs are not cold\n",
               v.dir.c_str());
}

// Runs one (volume, profile, depth) cell: `repeat` k3 runs, each followed by a fio run of the
// same size when fio applies, so that both see the same noise.
absl::Status MeasureCell(const RawSettings& s, Volume& v, const io::StorageProfile& profile,
                         int depth, const io::BufferArena& arena, std::mt19937_64& rng, Row* row,
                         EngineSetup* setup) {
  auto engine = MakeEngine(s, profile, depth, arena);
  if (!engine.ok()) return engine.status();
  setup->backend = std::string((*engine)->backend_name());
  setup->registered = (*engine)->buffers_registered();
  setup->pages = io::PageKindName(arena.page_kind());
  setup->chunk_bytes = (*engine)->options().chunk_bytes;
  std::vector<io::FileId> shard_ids;
  for (const std::string& path : v.checkpoint->shard_paths()) {
    auto id = (*engine)->OpenFile(path);
    if (!id.ok()) return id.status();
    NoteDirect((*engine)->file(*id), v);
    shard_ids.push_back(*id);
  }
  RawRun run(**engine, shard_ids, arena, v.slot_bytes);
  const int count = std::min<int>(s.reads, static_cast<int>(v.experts.size()));
  const bool with_fio = s.fio && !profile.emulated() && FioAvailable();
  for (int rep = 0; rep < s.repeat; ++rep) {
    // A fresh random choice per run, without repeats inside the run.
    std::vector<const ExpertLocation*> order = v.experts;
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(count);
    auto m = run.Run(order, depth);
    if (!m.ok()) return m.status();
    row->gbps.push_back(static_cast<double>(m->bytes) / m->seconds / 1e9);
    row->iops.push_back(m->experts / m->seconds);
    std::optional<double> fio;
    if (with_fio) {
      fio = MeasureFio(v, io::AlignUp(v.expert_bytes), depth, io::AlignUp(v.expert_bytes) * count);
      if (fio) row->fio_gbps.push_back(*fio / 1e9);
    }
    if (!s.quiet) {
      std::fprintf(stderr, "k3 bench: raw %s qd %d run %d/%d: %.2f GB/s%s\n", profile.name.c_str(),
                   depth, rep + 1, s.repeat, row->gbps.back(),
                   fio ? absl::StrFormat(" (fio %.2f GB/s)", *fio / 1e9).c_str() : "");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RawSettings> ReadRawSettings() {
  RawSettings s;
  auto depths = ParseDepths(absl::GetFlag(FLAGS_queue_depth));
  if (!depths.ok()) return depths.status();
  s.depths = *depths;
  std::vector<std::string> profile_flags = absl::GetFlag(FLAGS_storage_profile);
  if (profile_flags.empty()) profile_flags = {"direct"};
  auto profiles = io::ParseStorageProfileList(profile_flags);
  if (!profiles.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--storage-profile: ", std::string(profiles.status().message())));
  }
  s.profiles = *profiles;
  s.repeat = absl::GetFlag(FLAGS_repeat);
  s.reads = absl::GetFlag(FLAGS_reads);
  if (s.repeat < 1) return absl::InvalidArgumentError("--repeat must be at least 1");
  if (s.reads < 1) return absl::InvalidArgumentError("--reads must be at least 1");
  const int32_t chunk_kib = absl::GetFlag(FLAGS_chunk_kib);
  if (chunk_kib < 0 || chunk_kib % 4 != 0) {
    return absl::InvalidArgumentError("--chunk-kib must be a multiple of 4");
  }
  s.chunk_bytes = static_cast<uint64_t>(chunk_kib) * 1024;
  s.fio = absl::GetFlag(FLAGS_fio);
  s.huge_pages = absl::GetFlag(FLAGS_huge_pages);
  s.quiet = absl::GetFlag(FLAGS_quiet);
  return s;
}

absl::Status WriteOutputs(const std::vector<Row>& rows, const std::vector<Volume>& volumes,
                          const EngineSetup& setup) {
  const std::string json_path = absl::GetFlag(FLAGS_out_json);
  if (!json_path.empty()) {
    const std::string json = ToJson(rows, volumes, setup).dump(2) + "\n";
    absl::Status st = io::WriteFileAtomically(json_path, json);
    if (!st.ok()) return st;
  }
  const std::string csv_path = absl::GetFlag(FLAGS_out_csv);
  if (!csv_path.empty()) return io::WriteFileAtomically(csv_path, ToCsv(rows));
  return absl::OkStatus();
}

// Every (profile, depth) cell of one volume, with one buffer arena for all of them.
absl::Status MeasureVolume(const RawSettings& s, Volume& v, std::mt19937_64& rng,
                           std::vector<Row>* rows, EngineSetup* setup) {
  const int max_depth = *std::max_element(s.depths.begin(), s.depths.end());
  io::BufferArena::Options arena_options;
  arena_options.huge_pages = s.huge_pages;
  auto arena =
      io::BufferArena::Create(v.slot_bytes * static_cast<uint64_t>(max_depth), arena_options);
  if (!arena.ok()) return arena.status();
  for (const io::StorageProfile& profile : s.profiles) {
    for (int depth : s.depths) {
      Row row{.volume = v.dir, .profile = profile.name, .queue_depth = depth};
      row.mb_per_request = static_cast<double>(v.expert_bytes) / 1e6;
      absl::Status st = MeasureCell(s, v, profile, depth, **arena, rng, &row, setup);
      if (!st.ok()) return st;
      rows->push_back(std::move(row));
    }
  }
  return absl::OkStatus();
}

int RunRaw(const std::vector<std::string>& dirs) {
  auto settings = ReadRawSettings();
  if (!settings.ok()) return UsageError(kName, std::string(settings.status().message()));
  std::vector<Volume> volumes;
  for (const std::string& dir : dirs) {
    auto v = LoadVolume(dir);
    if (!v.ok()) return ReportError(kName, v.status());
    volumes.push_back(*std::move(v));
  }
  std::mt19937_64 rng(std::random_device{}());
  std::vector<Row> rows;
  EngineSetup setup;
  for (Volume& v : volumes) {
    if (absl::Status st = MeasureVolume(*settings, v, rng, &rows, &setup); !st.ok()) {
      return ReportError(kName, st);
    }
  }
  std::printf("k3 io: %s\n\n", setup.Describe().c_str());
  PrintTable(rows, volumes.size() > 1, settings->repeat);
  if (absl::Status st = WriteOutputs(rows, volumes, setup); !st.ok()) return ReportError(kName, st);
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// The decode benchmark: the engine over every combination, each run cold.

// Prompt tokens of every run: fixed for a seed so that runs and volumes compare like for like.
constexpr int kPromptTokens = 16;

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
};

struct DecodeRow {
  std::string volume = "";
  std::string profile = "";
  int queue_depth = 0;
  int prefetch_distance = 0;
  double raw_gbps = 0;  // median of the raw cell of this volume, profile and depth
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
  double io_floor_seconds = NAN;  // gb_per_token at the raw bandwidth
  double ratio_to_floor = NAN;
  double stall_fraction = NAN;
  double disk_busy_fraction = NAN;
  double hit_rate = NAN;
  double precision = NAN;
  double recall = NAN;
  double prefill_seconds = NAN;
  double demand_gb = NAN, prefetch_used_gb = NAN, prefetch_wasted_gb = NAN, trunk_gb = NAN;
};

uint64_t BytesRead(const StepMetrics& m) {
  return m.expert_demand_bytes + m.expert_prefetch_used_bytes + m.expert_prefetch_wasted_bytes +
         m.trunk_bytes;
}

double Ratio(double num, double den) { return den > 0 ? num / den : NAN; }

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

Figures Summarize(const DecodeRow& row) {
  std::vector<Figures> runs;
  for (const DecodeRun& r : row.runs) runs.push_back(RunFigures(r));
  Figures f;
  for (double Figures::*field :
       {&Figures::seconds_per_token, &Figures::gb_per_token, &Figures::stall_fraction,
        &Figures::disk_busy_fraction, &Figures::hit_rate, &Figures::precision, &Figures::recall,
        &Figures::prefill_seconds, &Figures::demand_gb, &Figures::prefetch_used_gb,
        &Figures::prefetch_wasted_gb, &Figures::trunk_gb}) {
    f.*field = MedianOf(runs, field);
  }
  // From the medians, so that the table's columns reproduce each other.
  f.tokens_per_second = Ratio(1, f.seconds_per_token);
  f.io_floor_seconds = row.raw_gbps > 0 ? Ratio(f.gb_per_token, row.raw_gbps) : NAN;
  f.ratio_to_floor = Ratio(f.seconds_per_token, f.io_floor_seconds);
  return f;
}

// Three significant digits without an exponent (0.00412, 41.2, 4120), "-" for NaN.
std::string Sig3(double v) {
  if (!std::isfinite(v)) return "-";
  if (v == 0) return "0";
  const int decimals = std::clamp(2 - static_cast<int>(std::floor(std::log10(std::fabs(v)))), 0, 6);
  return absl::StrFormat("%.*f", decimals, v);
}

std::string Fraction(double v) { return std::isfinite(v) ? absl::StrFormat("%.2f", v) : "-"; }

void PrintRule(const std::string& header) {
  std::string rule;
  for (char ch : header) rule += ch == '|' ? '|' : '-';
  std::printf("%s\n", rule.c_str());
}

void PrintDecodeTable(const std::vector<DecodeRow>& rows, int repeat) {
  const std::string header = absl::StrCat(
      "| volume | profile | queue depth | prefetch distance | s/token (median of ", repeat,
      ") | tokens/s | GB/token | raw GB/s | x I/O floor | stall | hit rate | prefetch precision "
      "| prefetch recall |");
  std::printf("%s\n", header.c_str());
  PrintRule(header);
  for (const DecodeRow& r : rows) {
    const Figures f = Summarize(r);
    std::printf("%s\n", absl::StrCat("| ", r.volume, " | ", r.profile, " | ", r.queue_depth, " | ",
                                     r.prefetch_distance, " | ", Sig3(f.seconds_per_token), " | ",
                                     Sig3(f.tokens_per_second), " | ", Sig3(f.gb_per_token), " | ",
                                     Sig3(r.raw_gbps), " | ", Fraction(f.ratio_to_floor), " | ",
                                     Fraction(f.stall_fraction), " | ", Fraction(f.hit_rate), " | ",
                                     Fraction(f.precision), " | ", Fraction(f.recall), " |")
                            .c_str());
  }
}

// JSON has no NaN: a figure the engine gave nothing to compute from is null.
nlohmann::json Figure(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

nlohmann::json DecodeRowJson(const DecodeRow& r) {
  const Figures f = Summarize(r);
  nlohmann::json j = {{"volume", r.volume},
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
  return {{"tokens", s.tokens},
          {"repeat", s.raw.repeat},
          {"seed", s.seed},
          {"prompt_ids", prompts},  // one list per volume
          {"storage_profiles", profiles},
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
          {"prefill_chunk", s.base.prefill_chunk},
          {"max_context", s.base.max_context}};
}

std::string CsvQuote(const std::string& s) {
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
}

std::string CsvNumber(double v) { return std::isfinite(v) ? absl::StrFormat("%.6g", v) : ""; }

std::string DecodeCsv(const std::vector<DecodeRow>& rows, const DecodeSettings& s) {
  std::string csv =
      "volume,profile,queue_depth,prefetch_distance,tokens,repeat,seconds_per_token,"
      "tokens_per_second,gb_per_token,raw_gbps,io_floor_seconds_per_token,ratio_to_io_floor,"
      "stall_fraction,disk_busy_fraction,hit_rate,prefetch_precision,prefetch_recall,"
      "prefill_seconds,expert_demand_gb_per_token,expert_prefetch_used_gb_per_token,"
      "expert_prefetch_wasted_gb_per_token,trunk_gb_per_token,ram_gb,preset,overlap\n";
  for (const DecodeRow& r : rows) {
    const Figures f = Summarize(r);
    std::vector<std::string> cells = {
        CsvQuote(r.volume),          CsvQuote(r.profile),
        absl::StrCat(r.queue_depth), absl::StrCat(r.prefetch_distance),
        absl::StrCat(s.tokens),      absl::StrCat(r.runs.size())};
    for (double v : {f.seconds_per_token, f.tokens_per_second, f.gb_per_token, r.raw_gbps,
                     f.io_floor_seconds, f.ratio_to_floor, f.stall_fraction, f.disk_busy_fraction,
                     f.hit_rate, f.precision, f.recall, f.prefill_seconds, f.demand_gb,
                     f.prefetch_used_gb, f.prefetch_wasted_gb, f.trunk_gb, s.base.memory.ram_gb}) {
      cells.push_back(CsvNumber(v));
    }
    cells.push_back(CsvQuote(s.base.memory.preset));
    cells.push_back(s.base.overlap ? "true" : "false");
    absl::StrAppend(&csv, absl::StrJoin(cells, ","), "\n");
  }
  return csv;
}

// Panels in the order of the table (volume, then profile); a series per prefetch distance.
std::vector<PlotPanel> PlotPanels(const std::vector<DecodeRow>& rows) {
  std::vector<PlotPanel> panels;
  std::string last_volume, last_profile;
  for (const DecodeRow& r : rows) {
    if (panels.empty() || r.volume != last_volume || r.profile != last_profile) {
      panels.push_back({absl::StrCat(r.volume, " \xC2\xB7 ", r.profile), {}});
      last_volume = r.volume;
      last_profile = r.profile;
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
  if (const std::string path = absl::GetFlag(FLAGS_out_json); !path.empty()) {
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
  if (s.base.max_context < kPromptTokens + s.tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--max-context must be at least ",
                                                   kPromptTokens + s.tokens, " (the ",
                                                   kPromptTokens, "-token prompt and --tokens)"));
  }
  return s;
}

std::vector<int32_t> PromptIds(uint64_t seed, int64_t vocab_size) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab_size - 1));
  std::vector<int32_t> ids(kPromptTokens);
  for (int32_t& id : ids) id = pick(rng);
  return ids;
}

int32_t Greedy(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// One cold run. Cancelled when Ctrl-C stops it.
absl::StatusOr<DecodeRun> RunOnce(const EngineOptions& options, const std::vector<int32_t>& prompt,
                                  int tokens, DecodeRow* row) {
  auto engine = Engine::Open(options);
  if (!engine.ok()) return engine.status();
  if (row->engine_settings.is_null()) {
    row->engine_settings = (*engine)->Settings();
    row->memory_plan = (*engine)->plan().Describe();
  }
  SequenceState state = (*engine)->NewState();
  std::vector<float> logits;
  StepMetrics prefill;
  if (absl::Status st = (*engine)->Prefill(prompt, state, logits, &prefill); !st.ok()) return st;
  DecodeRun run;
  run.prefill_seconds = prefill.seconds;
  std::vector<double> steps;
  for (int i = 0; i < tokens; ++i) {
    if (Interrupted()) return absl::CancelledError("interrupted");
    StepMetrics step;
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status st = (*engine)->Decode(Greedy(logits), state, logits, &step); !st.ok()) {
      return st;
    }
    // The engine's own step time when it reports one, else the wall time around the call.
    if (step.seconds <= 0) {
      step.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (step.tokens == 0) step.tokens = 1;
    steps.push_back(step.seconds);
    run.decode.Add(step);
  }
  run.seconds_per_token = Median(steps);
  return run;
}

double RawGbps(const std::vector<Row>& raw_rows, const std::string& volume,
               const std::string& profile, int depth) {
  for (const Row& r : raw_rows) {
    if (r.volume == volume && r.profile == profile && r.queue_depth == depth) return Median(r.gbps);
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
    auto run = RunOnce(options, prompt, s.tokens, row);
    if (!run.ok()) return run.status();
    row->runs.push_back(*run);
    if (progress.quiet) continue;
    std::fprintf(
        stderr, "k3 bench: [%d/%d] %s %s qd %d distance %d run %d/%d: %s s/token, %s GB/token\n",
        progress.done, progress.total, row->volume.c_str(), row->profile.c_str(), row->queue_depth,
        row->prefetch_distance, rep + 1, s.raw.repeat, Sig3(run->seconds_per_token).c_str(),
        Sig3(Ratio(static_cast<double>(BytesRead(run->decode)) / 1e9,
                   static_cast<double>(run->decode.tokens)))
            .c_str());
  }
  return absl::OkStatus();
}

// The raw cells of one volume, then its engine runs over profile x depth x distance.
absl::Status RunVolume(const DecodeSettings& s, Volume& v, const std::vector<int32_t>& prompt,
                       std::mt19937_64& rng, Progress& progress, std::vector<Row>* raw_rows,
                       std::vector<DecodeRow>* rows, EngineSetup* setup) {
  if (absl::Status st = MeasureVolume(s.raw, v, rng, raw_rows, setup); !st.ok()) return st;
  for (const io::StorageProfile& profile : s.raw.profiles) {
    for (int depth : s.raw.depths) {
      for (int distance : s.distances) {
        DecodeRow row{.volume = v.dir,
                      .profile = profile.name,
                      .queue_depth = depth,
                      .prefetch_distance = distance,
                      .raw_gbps = RawGbps(*raw_rows, v.dir, profile.name, depth)};
        EngineOptions o = s.base;
        o.model_dir = v.dir;
        o.storage_profile = profile.name;
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
  Progress progress{
      .total = static_cast<int>(dirs.size() * settings->raw.profiles.size() *
                                settings->raw.depths.size() * settings->distances.size()),
      .quiet = settings->raw.quiet};
  std::vector<Row> raw_rows;
  std::vector<DecodeRow> rows;
  EngineSetup setup;
  absl::Status status;
  for (size_t i = 0; i < volumes.size() && status.ok(); ++i) {
    status = RunVolume(*settings, volumes[i], prompts[i], rng, progress, &raw_rows, &rows, &setup);
  }
  if (!status.ok() && !Interrupted()) return ReportError(kName, status);
  std::printf("k3 bench: %s\n\n", Caption(*settings).c_str());
  PrintDecodeTable(rows, settings->raw.repeat);
  std::fflush(stdout);
  if (absl::Status st = WriteDecodeOutputs(rows, raw_rows, volumes, prompts, *settings, setup);
      !st.ok()) {
    return ReportError(kName, st);
  }
  return Interrupted() ? kExitInterrupted : kExitOk;
}

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
  if (!absl::GetFlag(FLAGS_raw)) return RunDecode(*dirs);
  if (!absl::GetFlag(FLAGS_plot).empty()) {
    return UsageError(kName, "--plot draws the decode benchmark; it does not apply to --raw");
  }
  return RunRaw(*dirs);
}

std::vector<std::string_view> BenchFlagNames() {
  std::vector<std::string_view> flags = {"raw",      "tokens",     "reads",  "chunk-kib",
                                         "fio",      "huge-pages", "seed",   "plot",
                                         "out-json", "out-csv",    "repeat", "quiet"};
  for (std::string_view f : EngineFlagNames()) flags.push_back(f);
  return flags;
}

}  // namespace

const Subcommand& BenchCommand() {
  static const Subcommand kCommand = {
      kName,
      "storage benchmarks: s/token against the I/O floor per volume, depth and prefetch distance",
      "bench --model DIR[,DIR...] [--storage-profile P[,P...]] [--queue-depth 1,4,16,32]\n"
      "                [--prefetch-distance 0,2] [--tokens N] [--repeat R] [--ram-gb X | --preset "
      "NAME]\n"
      "                [--raw] [--reads N] [--out-csv F] [--out-json F] [--plot F.svg]",
      "Runs the engine over every combination of volume (model directory x storage profile),\n"
      "queue depth and prefetch distance. Each of --repeat runs is cold: a fresh engine (empty\n"
      "expert cache, O_DIRECT reads), a fixed 16-token prompt from --seed, then --tokens greedy\n"
      "decode steps. Prints a markdown table: s/token (median of the runs, each run's median\n"
      "step), tokens/s, GB read per token, the raw bandwidth of that volume, profile and depth\n"
      "(measured first in the same run, as --raw does), the ratio to the I/O floor (s/token over\n"
      "GB/token at that bandwidth; 1.0 is perfect overlap), stall fraction, cache hit rate and\n"
      "prefetch precision/recall ('-': the engine reported nothing to compute it from).\n"
      "--out-csv and --out-json write every figure and setting; --plot draws s/token against\n"
      "queue depth, a line per prefetch distance, a panel per volume. See docs/BENCHMARKS.md.\n\n"
      "--raw reads random whole experts of the checkpoint (O_DIRECT, each expert at most once\n"
      "per run) with the io layer at each queue depth (experts in flight) and storage profile,\n"
      "and prints a markdown table: GB/s (median of --repeat runs), expert reads per second, MB\n"
      "per request, and fio's bandwidth on the same shard files, block size (one expert) and\n"
      "depth when fio is installed, run alternately with k3's runs.\n"
      "Storage profiles: direct (the device), nvme, sata, network, or\n"
      "lat=2ms,bw=500MB/s,iops=5000,qd=32 (any subset); see docs/STORAGE.md.",
      BenchFlagNames(),
      RunBench};
  return kCommand;
}

}  // namespace k3::cli
