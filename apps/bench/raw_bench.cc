#include "apps/bench/raw_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <set>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "apps/options/cli.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/reports/device_report.h"
#include "apps/reports/tables.h"
#include "io/aligned_buffer.h"
#include "io/file.h"
#include "io/read_engine.h"
#include "io/read_router.h"

namespace k3::cli::bench {
namespace {

struct Measurement {
  double seconds = 0;
  uint64_t bytes = 0;
  int experts = 0;
};

// Reads `order` (whole experts) keeping `depth` experts in flight, one buffer slot each.
class RawRun {
 public:
  RawRun(io::Reads& reads, const std::vector<io::FileId>& shard_ids, const io::BufferArena& arena,
         uint64_t slot_bytes)
      : reads_(reads), shard_ids_(shard_ids), arena_(arena), slot_bytes_(slot_bytes) {}

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
      std::optional<io::ReadResult> r = reads_.WaitAny();
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
      auto id = reads_.Submit(std::move(req));
      if (!id.ok()) return id.status();
    }
    return absl::OkStatus();
  }

  io::Reads& reads_;
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

void PrintTable(const std::vector<Row>& rows, bool show_volume, bool show_drives, int repeat) {
  bool any_fio = false;
  for (const Row& r : rows) any_fio |= !r.fio_gbps.empty();
  std::vector<std::string> header;
  if (show_volume) header.push_back("volume");
  if (show_drives) header.insert(header.end(), {"+volumes", "drives"});
  header.insert(header.end(),
                {"profile", "queue depth", absl::StrCat("GB/s (median of ", repeat, ")"),
                 "min-max GB/s", "IOPS", "MB/request"});
  if (any_fio) header.insert(header.end(), {"fio GB/s", "k3/fio"});
  MarkdownTable table(header);
  for (const Row& r : rows) {
    std::vector<std::string> cells;
    if (show_volume) cells.push_back(r.volume);
    if (show_drives) {
      cells.insert(cells.end(), {absl::StrCat(r.volume_flags.size()), absl::StrCat(r.drives)});
    }
    const auto [lo, hi] = std::minmax_element(r.gbps.begin(), r.gbps.end());
    cells.insert(cells.end(), {r.profile, absl::StrCat(r.queue_depth), F2(Median(r.gbps)),
                               absl::StrCat(F2(*lo), "-", F2(*hi)),
                               absl::StrFormat("%.1f", Median(r.iops)), F2(r.mb_per_request)});
    if (any_fio && r.fio_gbps.empty()) {
      cells.insert(cells.end(), {"-", "-"});
    } else if (any_fio) {
      const double fio = Median(r.fio_gbps);
      cells.insert(cells.end(), {F2(fio), F2(Median(r.gbps) / fio)});
    }
    table.AddRow(cells);
  }
  std::fputs(table.text().c_str(), stdout);
}

nlohmann::json ToJson(const std::vector<Row>& rows, const std::vector<Volume>& volumes,
                      const EngineSetup& setup) {
  nlohmann::json out = SetupJson("raw", volumes, setup);
  out["results"] = nlohmann::json::array();
  for (const Row& r : rows) out["results"].push_back(RawRowJson(r));
  return out;
}

std::string ToCsv(const std::vector<Row>& rows) {
  CsvTable csv({"volume", "profile", "queue_depth", "gbps_median", "iops_median", "mb_per_request",
                "fio_gbps_median", "ratio_to_fio", "drives", "volume_flags"});
  for (const Row& r : rows) {
    const double fio = Median(r.fio_gbps);
    csv.AddRow({CsvTable::Text(r.volume), CsvTable::Text(r.profile), absl::StrCat(r.queue_depth),
                absl::StrFormat("%.4f", Median(r.gbps)), absl::StrFormat("%.2f", Median(r.iops)),
                absl::StrFormat("%.4f", r.mb_per_request),
                fio > 0 ? absl::StrFormat("%.4f", fio) : "",
                fio > 0 ? absl::StrFormat("%.4f", Median(r.gbps) / fio) : "",
                absl::StrCat(r.drives), CsvTable::Text(absl::StrJoin(r.volume_flags, ";"))});
  }
  return csv.text();
}

// Says each of the router's warnings (a copy refused) once, however many cells open the copy.
void WarnOnce(const std::string& text) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(text).second) std::fprintf(stderr, "k3 bench: warning: %s\n", text.c_str());
}

// A read router with one engine per drive: the files' own (at `profile`) and the volumes'.
absl::StatusOr<std::unique_ptr<io::ReadRouter>> MakeRouter(uint64_t chunk_bytes,
                                                           const io::StorageProfile& profile,
                                                           const std::vector<io::Volume>& volumes,
                                                           int depth,
                                                           const io::BufferArena& arena) {
  io::ReadRouterOptions o;
  o.engine.queue_depth = depth;
  o.engine.profile = profile;
  o.engine.arena = &arena;
  // A refused O_DIRECT is reported once per volume (NoteDirect), not per file.
  o.engine.notices = false;
  if (chunk_bytes > 0) o.engine.chunk_bytes = chunk_bytes;
  o.volumes = volumes;
  o.on_warning = WarnOnce;
  return io::ReadRouter::Create(o);
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

// Runs one (volume, volumes, profile, depth) cell: `repeat` k3 runs, each followed by a fio run
// of the same size when fio applies (the model's directory alone), so that both see the same
// noise.
absl::Status MeasureCell(const RawSettings& s, Volume& v, const std::vector<io::Volume>& volumes,
                         const io::StorageProfile& profile, int depth, const io::BufferArena& arena,
                         std::mt19937_64& rng, Row* row, EngineSetup* setup) {
  auto reads = MakeRouter(s.chunk_bytes, profile, volumes, depth, arena);
  if (!reads.ok()) return reads.status();
  setup->backend = std::string((*reads)->backend_name());
  setup->registered = (*reads)->buffers_registered();
  setup->pages = io::PageKindName(arena.page_kind());
  setup->chunk_bytes = (*reads)->options().engine.chunk_bytes;
  std::vector<io::FileId> shard_ids;
  for (const std::string& path : v.checkpoint->shard_paths()) {
    auto id = (*reads)->OpenFile(path);
    if (!id.ok()) return id.status();
    NoteDirect((*reads)->file(*id), v);
    shard_ids.push_back(*id);
  }
  RawRun run(**reads, shard_ids, arena, v.slot_bytes);
  const int count = std::min<int>(s.reads, static_cast<int>(v.experts.size()));
  const bool with_fio = s.fio && !profile.emulated() && row->volume_flags.empty() && FioAvailable();
  for (int rep = 0; rep < s.repeat; ++rep) {
    // A fresh random choice per run, without repeats inside the run.
    std::vector<const ExpertLocation*> order = v.experts;
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(count);
    auto m = run.Run(order, depth);
    if (!m.ok()) return m.status();
    row->seconds += m->seconds;
    row->gbps.push_back(static_cast<double>(m->bytes) / m->seconds / 1e9);
    row->iops.push_back(m->experts / m->seconds);
    std::optional<double> fio;
    if (with_fio) {
      fio = MeasureFio(v, io::AlignUp(v.expert_bytes), depth, io::AlignUp(v.expert_bytes) * count);
      if (fio) row->fio_gbps.push_back(*fio / 1e9);
    }
    if (!s.quiet) {
      std::fprintf(stderr, "k3 bench: raw %s%s qd %d run %d/%d: %.2f GB/s%s\n",
                   profile.name.c_str(), VolumesLabel(row->volume_flags).c_str(), depth, rep + 1,
                   s.repeat, row->gbps.back(),
                   fio ? absl::StrFormat(" (fio %.2f GB/s)", *fio / 1e9).c_str() : "");
    }
  }
  row->devices = (*reads)->devices();
  row->drives = static_cast<int>(row->devices.size());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ParseDepths(const std::vector<std::string>& values) {
  auto depths = ParseIntList("queue-depth", values, 1, 4096);
  if (depths.ok() && depths->empty()) depths = std::vector<int>{1, 4, 16, 32};
  return depths;
}

}  // namespace

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
                      {"volume_flags", r.volume_flags},
                      {"drives", r.drives},
                      {"devices", DevicesJson(r.devices, r.seconds)},
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

absl::StatusOr<RawSettings> ReadRawSettings() {
  RawSettings s;
  auto depths = ParseDepths(absl::GetFlag(FLAGS_queue_depth));
  if (!depths.ok()) return depths.status();
  s.depths = *depths;
  auto profiles = StorageProfilesFromFlags();
  if (!profiles.ok()) return profiles.status();
  s.profiles = *std::move(profiles);
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
  auto volumes = VolumesFromFlags();
  if (!volumes.ok()) return volumes.status();
  s.volumes = *std::move(volumes);
  s.sweep_volumes = absl::GetFlag(FLAGS_sweep_volumes);
  if (s.sweep_volumes && s.volumes.empty()) {
    return absl::InvalidArgumentError("--sweep-volumes needs at least one --volume DIR");
  }
  return s;
}

std::vector<std::vector<io::Volume>> VolumeSets(const RawSettings& s) {
  if (!s.sweep_volumes) return {s.volumes};
  std::vector<std::vector<io::Volume>> sets;
  for (size_t n = 0; n <= s.volumes.size(); ++n) {
    sets.emplace_back(s.volumes.begin(), s.volumes.begin() + static_cast<ptrdiff_t>(n));
  }
  return sets;
}

std::string VolumesLabel(const std::vector<std::string>& volume_flags) {
  if (volume_flags.empty()) return "";
  return absl::StrCat(" +", volume_flags.size(), volume_flags.size() == 1 ? " volume" : " volumes");
}

namespace {

absl::Status WriteOutputs(const std::vector<Row>& rows, const std::vector<Volume>& volumes,
                          const EngineSetup& setup) {
  const std::string json_path = absl::GetFlag(FLAGS_report_json);
  if (!json_path.empty()) {
    const std::string json = ToJson(rows, volumes, setup).dump(2) + "\n";
    absl::Status st = io::WriteFileAtomically(json_path, json);
    if (!st.ok()) return st;
  }
  const std::string csv_path = absl::GetFlag(FLAGS_out_csv);
  if (!csv_path.empty()) return io::WriteFileAtomically(csv_path, ToCsv(rows));
  return absl::OkStatus();
}

}  // namespace

// Every (profile, depth) cell of one volume, with one buffer arena for all of them.
absl::Status MeasureVolume(const RawSettings& s, Volume& v, const std::vector<io::Volume>& volumes,
                           std::mt19937_64& rng, std::vector<Row>* rows, EngineSetup* setup) {
  const int max_depth = *std::max_element(s.depths.begin(), s.depths.end());
  io::BufferArena::Options arena_options;
  arena_options.huge_pages = s.huge_pages;
  auto arena =
      io::BufferArena::Create(v.slot_bytes * static_cast<uint64_t>(max_depth), arena_options);
  if (!arena.ok()) return arena.status();
  for (const io::StorageProfile& profile : s.profiles) {
    for (int depth : s.depths) {
      Row row{.volume = v.dir,
              .volume_flags = io::VolumeSpecs(volumes),
              .profile = profile.name,
              .queue_depth = depth};
      row.mb_per_request = static_cast<double>(v.expert_bytes) / 1e6;
      absl::Status st = MeasureCell(s, v, volumes, profile, depth, **arena, rng, &row, setup);
      if (!st.ok()) return st;
      rows->push_back(std::move(row));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> MeasureDrive(const Volume& v,
                                                 const std::vector<std::string>& paths,
                                                 const io::StorageProfile& profile,
                                                 const std::vector<int>& depths, int reads,
                                                 int repeat, std::mt19937_64& rng) {
  std::vector<const ExpertLocation*> experts;
  for (const ExpertLocation* loc : v.experts) {
    if (std::all_of(loc->spans.begin(), loc->spans.end(),
                    [&](const ByteSpan& s) { return !paths[s.shard].empty(); })) {
      experts.push_back(loc);
    }
  }
  if (experts.empty()) {
    return absl::FailedPreconditionError("the drive holds no whole expert of the model");
  }
  const int max_depth = *std::max_element(depths.begin(), depths.end());
  auto arena = io::BufferArena::Create(v.slot_bytes * static_cast<uint64_t>(max_depth));
  if (!arena.ok()) return arena.status();
  const int count = std::min<int>(reads, static_cast<int>(experts.size()));
  std::vector<double> gbps;
  for (int depth : depths) {
    auto router = MakeRouter(0, profile, {}, depth, **arena);
    if (!router.ok()) return router.status();
    std::vector<io::FileId> ids;
    for (const std::string& path : paths) {
      auto id = path.empty() ? absl::StatusOr<io::FileId>(-1) : (*router)->OpenFile(path);
      if (!id.ok()) return id.status();
      ids.push_back(*id);
    }
    RawRun run(**router, ids, **arena, v.slot_bytes);
    std::vector<double> runs;
    for (int rep = 0; rep < repeat; ++rep) {
      std::vector<const ExpertLocation*> order = experts;
      std::shuffle(order.begin(), order.end(), rng);
      order.resize(count);
      auto m = run.Run(order, depth);
      if (!m.ok()) return m.status();
      runs.push_back(static_cast<double>(m->bytes) / m->seconds / 1e9);
    }
    gbps.push_back(Median(runs));
  }
  return gbps;
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
    for (const std::vector<io::Volume>& set : VolumeSets(*settings)) {
      if (absl::Status st = MeasureVolume(*settings, v, set, rng, &rows, &setup); !st.ok()) {
        return ReportError(kName, st);
      }
    }
  }
  std::printf("k3 io: %s\n\n", setup.Describe().c_str());
  PrintTable(rows, volumes.size() > 1, !settings->volumes.empty(), settings->repeat);
  if (absl::Status st = WriteOutputs(rows, volumes, setup); !st.ok()) return ReportError(kName, st);
  return kExitOk;
}

}  // namespace k3::cli::bench
