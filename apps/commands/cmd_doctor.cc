// k3 doctor: checks what the engine depends on (io_uring, O_DIRECT, disk speed, RAM, cores,
// SIMD), recommends the memory preset for a model and prints the command to run next. Exits
// 1 when something essential fails, so scripts can gate on it.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "apps/commands/commands.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/reports/disk_rate.h"
#include "apps/reports/drives.h"
#include "core/checkpoint/checkpoint.h"
#include "core/util/proc_fields.h"
#include "core/util/progress.h"
#include "io/aligned_buffer.h"
#include "io/file.h"
#include "io/read_engine.h"
#include "kernels/dispatch.h"
#include "nlohmann/json.hpp"
#include "pipeline/memory_plan.h"

namespace k3::cli {
namespace {

constexpr char kDoctorName[] = "doctor";

enum class Level { kOk, kWarn, kFail };

// Collects the checks: one line each on stdout as they finish, and the JSON for --report-json.
class Findings {
 public:
  void Add(std::string_view what, Level level, const std::string& detail) {
    static constexpr const char* kTags[] = {"ok", "WARN", "FAIL"};
    std::printf("  %-5s %-11s %s\n", kTags[static_cast<int>(level)], std::string(what).c_str(),
                detail.c_str());
    std::fflush(stdout);
    checks_.push_back({{"check", std::string(what)},
                       {"status", kTags[static_cast<int>(level)]},
                       {"detail", detail}});
    if (level == Level::kFail && failure_.empty())
      failure_ = absl::StrCat(std::string(what), ": ", detail);
  }
  bool failed() const { return !failure_.empty(); }
  const std::string& failure() const { return failure_; }
  nlohmann::json& extra() { return extra_; }
  nlohmann::json ToJson() const {
    nlohmann::json j = extra_;
    j["checks"] = checks_;
    j["ok"] = !failed();
    return j;
  }

 private:
  nlohmann::json checks_ = nlohmann::json::array();
  nlohmann::json extra_ = nlohmann::json::object();
  std::string failure_;
};

std::string GbText(uint64_t bytes) { return FormatBytes(static_cast<double>(bytes)); }

// A path as typed in a shell: quoted only when it has to be.
std::string Shell(const std::string& s) {
  const bool plain = std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("/._-+=:,", c) != nullptr;
  });
  if (plain && !s.empty()) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void CheckUring(Findings& f) {
  io::ReadEngineOptions o;
  o.backend = io::Backend::kUring;
  o.queue_depth = kReadsInFlight;
  o.notices = false;
  auto engine = io::ReadEngine::Create(o);
  if (engine.ok()) {
    f.Add("io_uring", Level::kOk, "available: expert reads use io_uring");
  } else {
    f.Add("io_uring", Level::kWarn,
          absl::StrCat("not available (", std::string(engine.status().message()),
                       "): reads fall back to a pool of pread threads, slower at depth"));
  }
  f.extra()["io_uring"] = engine.ok();
}

void ReportReads(Findings& f, const std::string& what, const absl::StatusOr<ReadRate>& rate,
                 bool holes = false) {
  if (!rate.ok()) {
    f.Add("disk read", Level::kFail, std::string(rate.status().message()));
    return;
  }
  f.Add("O_DIRECT", rate->direct ? Level::kOk : Level::kWarn,
        rate->direct ? absl::StrCat("accepted for ", what)
                     : absl::StrCat("refused for ", what,
                                    " (tmpfs or a network file system?): reads go through the "
                                    "page cache, which competes with the expert cache for RAM"));
  const double gbps = rate->bytes_per_second / 1e9;
  const bool small = rate->read_bytes < kReadBytes;
  f.Add("disk read", gbps < 0.1 || holes ? Level::kWarn : Level::kOk,
        absl::StrFormat("%.2f GB/s (%s reads of %s, %d in flight, %.1f s, %s)%s", gbps,
                        rate->direct ? "O_DIRECT" : "buffered", GbText(rate->read_bytes),
                        kReadsInFlight, rate->seconds, rate->path,
                        gbps < 0.1 ? ": slow, every token will wait for its experts"
                        : holes    ? ": the file is mostly holes (a sparse checkpoint), so this "
                                     "is the rate of memory, not of a disk"
                        : small    ? ": a file this small may be served by the device's cache"
                                   : ""));
  f.extra()["o_direct"] = rate->direct;
  f.extra()["read_bytes_per_second"] = rate->bytes_per_second;
}

// Where the demo model and caches live, else the current directory: the disk k3 would use.
std::string ScratchDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = xdg != nullptr && *xdg != '\0' ? std::string(xdg) + "/k3"
                           : home != nullptr              ? std::string(home) + "/.cache/k3"
                                                          : "";
  return !base.empty() && io::IsDirectory(base) ? base : ".";
}

// The rate measured on the model's drive, for CheckDrives.
std::optional<absl::StatusOr<ReadRate>> CheckDisk(Findings& f, const Checkpoint* ckpt) {
  if (ckpt != nullptr) {
    const std::string shard = LargestShard(*ckpt);
    auto rate = MeasureReads(shard);
    ReportReads(f, ckpt->dir(), rate, MostlyHoles(shard));
    return rate;
  }
  const std::string dir = ScratchDir();
  auto scratch = WriteScratchFile(dir, "k3-doctor");
  if (!scratch.ok()) {
    f.Add("disk read", Level::kFail, std::string(scratch.status().message()));
    return std::nullopt;
  }
  auto rate = MeasureReads(*scratch);
  ::unlink(scratch->c_str());
  if (rate.ok()) rate->path = "a temp file, deleted";
  ReportReads(f, dir, rate);
  return std::nullopt;
}

// One drive's line: its rate, measured on the largest copy it holds (the model's drive was
// measured above); its JSON gets the figures.
void ReportDrive(Findings& f, const Drive& d, std::optional<absl::StatusOr<ReadRate>> rate,
                 nlohmann::json& json) {
  const std::string name = absl::StrCat(d.id, " (", d.profile.Describe(), ")");
  if (!rate.has_value()) {
    std::string largest;
    uint64_t largest_size = 0;
    for (const std::string& copy : d.Copies()) {
      std::error_code ec;
      const uint64_t size = copy.empty() ? 0 : std::filesystem::file_size(copy, ec);
      if (!ec && size > largest_size) largest = copy, largest_size = size;
    }
    if (largest.empty()) {
      f.Add("drive", Level::kWarn,
            absl::StrCat(name, ": holds none of the model's files, so nothing is read from it"));
      return;
    }
    rate = MeasureReads(largest, d.profile);
  }
  if (!rate->ok()) {
    f.Add("drive", Level::kWarn, absl::StrCat(name, ": ", rate->status().message()));
    return;
  }
  const ReadRate& r = **rate;
  f.Add("drive", r.direct ? Level::kOk : Level::kWarn,
        absl::StrFormat("%s: %.2f GB/s (%s reads of %s, %d in flight, %.1f s, %s)", name,
                        r.bytes_per_second / 1e9, r.direct ? "O_DIRECT" : "buffered",
                        GbText(r.read_bytes), kReadsInFlight, r.seconds, r.path));
  json["read_bytes_per_second"] = r.bytes_per_second;
  json["o_direct"] = r.direct;
  json["measured_file"] = r.path;
}

// With --volume: every drive the engine reads the model from (a file system, or a volume with
// a profile of its own), its read rate, and what each of its directories holds of the model's
// files; a copy that differs from the model's is named (the engine refuses it).
void CheckDrives(Findings& f, const Checkpoint& ckpt, const std::vector<io::Volume>& volumes,
                 const std::optional<absl::StatusOr<ReadRate>>& model_rate) {
  auto drives = FindDrives(ckpt, volumes, io::StorageProfile{});
  if (!drives.ok()) {
    f.Add("drives", Level::kFail, std::string(drives.status().message()));
    return;
  }
  const size_t shards = ckpt.shard_paths().size();
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < drives->size(); ++i) {
    const Drive& d = (*drives)[i];
    nlohmann::json json = {{"id", d.id},
                           {"profile", d.profile.Describe()},
                           {"files", d.files()},
                           {"read_bytes_per_second", nullptr}};
    ReportDrive(f, d, i == 0 ? model_rate : std::nullopt, json);
    json["dirs"] = nlohmann::json::array();
    for (const DriveDir& dir : d.dirs) {
      const bool model = dir.spec.empty();
      std::string detail =
          absl::StrCat(model ? dir.dir + " (the model's directory)" : dir.spec, " on drive ", d.id,
                       ": ", dir.files, " of ", shards, " files, ", GbText(dir.bytes));
      if (dir.stripes) absl::StrAppend(&detail, ", and a k3 stripe layout");
      Level level = Level::kOk;
      if (!dir.differs.empty()) {
        level = Level::kWarn;
        absl::StrAppend(&detail, "; ", dir.differs.size(),
                        dir.differs.size() == 1
                            ? " copy differs from the model's and is not read: "
                            : " copies differ from the model's and are not read (--report-json "
                              "lists them), the first: ",
                        dir.differs.front());
      } else if (dir.files == 0 && !dir.stripes) {
        level = Level::kWarn;
        absl::StrAppend(&detail, ": none of the model's files, nothing is read from it");
      }
      f.Add("volume", level, detail);
      json["dirs"].push_back({{"dir", dir.dir},
                              {"volume", model ? nlohmann::json() : nlohmann::json(dir.spec)},
                              {"files", dir.files},
                              {"model_files", shards},
                              {"bytes", dir.bytes},
                              {"differs", dir.differs},
                              {"stripes", dir.stripes}});
    }
    out.push_back(json);
  }
  f.extra()["drives"] = out;
}

void CheckMachine(Findings& f, uint64_t available) {
  const uint64_t total = MeminfoBytes("MemTotal");
  f.Add("RAM", available > 0 ? Level::kOk : Level::kFail,
        available > 0 ? absl::StrCat(GbText(total), " total, ", GbText(available), " available")
                      : "cannot read MemAvailable from /proc/meminfo");
  cpu_set_t set;
  CPU_ZERO(&set);
  const int usable = ::sched_getaffinity(0, sizeof(set), &set) == 0
                         ? CPU_COUNT(&set)
                         : static_cast<int>(std::thread::hardware_concurrency());
  const std::string target(kernels::ActiveKernelTarget());
  f.Add("CPU", Level::kOk,
        absl::StrCat(usable, " cores usable (", std::thread::hardware_concurrency(),
                     " online); kernels run ", target));
  f.extra()["ram_total_bytes"] = total;
  f.extra()["ram_available_bytes"] = available;
  f.extra()["cores"] = usable;
  f.extra()["simd_target"] = target;
}

// The largest preset whose budget fits in the RAM available now; "" when not even the minimum
// (preset ultra) does.
std::string RecommendPreset(Findings& f, const Checkpoint& ckpt, uint64_t available) {
  const ModelFootprint fp = MeasureFootprint(ckpt, /*max_context=*/4096, kSmallPrefillChunk);
  std::string best;
  uint64_t best_budget = 0, minimum = 0;
  for (const std::string& name : MemoryPresetNames()) {
    if (name == "auto") continue;
    auto plan = PlanMemory(fp, {.preset = name}, available);
    if (!plan.ok()) continue;
    minimum = plan->minimum_bytes;
    if (plan->budget_bytes <= available && plan->budget_bytes >= best_budget) {
      best = name;
      best_budget = plan->budget_bytes;
    }
  }
  if (best.empty()) {
    f.Add("preset", Level::kFail,
          absl::StrCat("the model needs at least ", GbText(minimum), " of RAM; ", GbText(available),
                       " available"));
  } else {
    f.Add("preset", Level::kOk,
          absl::StrCat(best, ": budget ", GbText(best_budget), ", the largest preset within the ",
                       GbText(available), " available (k3 inspect lists them all)"));
    f.extra()["recommended_preset"] = best;
  }
  return best;
}

std::string NextCommand(const Findings& f, const std::string& model, const std::string& preset) {
  if (f.failed()) return "fix the FAIL above, then run k3 doctor again";
  if (model.empty()) {
    return "k3 generate --prompt \"The capital of France is\"   (the built-in demo model; "
           "k3 doctor --model DIR recommends a preset for yours)";
  }
  // A checkpoint without a tokenizer (a test fixture) takes token ids only.
  const std::string prompt = io::FileExists(model + "/tiktoken.model")
                                 ? "--prompt \"The capital of France is\""
                                 : "--ids 3,7,11";
  return absl::StrCat("k3 generate --model ", Shell(model), " --preset ", preset, " ", prompt);
}

int Finish(Findings& f, const std::string& next) {
  std::printf("\nnext: %s\n", next.c_str());
  f.extra()["next_command"] = next;
  if (const std::string path = absl::GetFlag(FLAGS_report_json); !path.empty()) {
    if (absl::Status s = io::WriteFileAtomically(path, f.ToJson().dump(2) + "\n"); !s.ok()) {
      return ReportError(kDoctorName, s);
    }
  }
  if (!f.failed()) return kExitOk;
  std::fprintf(stderr, "k3 doctor: %s\n", f.failure().c_str());
  return kExitFailure;
}

int RunDoctor(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kDoctorName, "unexpected argument " + positional[0]);
  const std::string model = absl::GetFlag(FLAGS_model);
  if (!model.empty() && !io::FileExists(model + "/config.json")) {
    return ReportError(
        kDoctorName, absl::NotFoundError(absl::StrCat(
                         "--model ", model, ": no config.json there (is it a model directory?)")));
  }
  auto volumes = VolumesFromFlags();
  if (!volumes.ok()) return ReportError(kDoctorName, volumes.status());
  if (!volumes->empty() && model.empty()) {
    return UsageError(kDoctorName,
                      "--volume needs --model DIR: the volumes' copies are checked against it");
  }
  Findings f;
  std::unique_ptr<Checkpoint> ckpt;
  if (!model.empty()) {
    auto opened = Checkpoint::Open(model);
    if (opened.ok()) {
      ckpt = *std::move(opened);
      f.Add("model", Level::kOk,
            absl::StrCat(model, ": ", ckpt->shard_paths().size(), " files, ",
                         GbText(ckpt->total_bytes())));
    } else {
      f.Add("model", Level::kFail, std::string(opened.status().message()));
    }
  }
  CheckUring(f);
  if (model.empty() || ckpt != nullptr) {
    const auto model_rate = CheckDisk(f, ckpt.get());
    if (ckpt != nullptr && !volumes->empty()) CheckDrives(f, *ckpt, *volumes, model_rate);
  }
  const uint64_t available = AvailableRamBytes();
  CheckMachine(f, available);
  std::string preset;
  if (ckpt != nullptr) preset = RecommendPreset(f, *ckpt, available);
  return Finish(f, NextCommand(f, model, preset));
}

}  // namespace

const Subcommand& DoctorCommand() {
  static const Subcommand kCommand = {
      kDoctorName,
      "check this machine (io_uring, O_DIRECT, disk speed, RAM) and pick a memory preset",
      "doctor [--model DIR [--volume DIR[@PROFILE] ...]] [--report-json FILE]",
      "Checks what the engine depends on and prints one line per check: io_uring (else reads\n"
      "use pread threads), O_DIRECT on the model's directory, the disk's read rate (random\n"
      "16 MiB reads, 4 in flight, for 2.5 s, of the model's largest shard; without --model, of\n"
      "a 128 MiB temp file written to the cache directory, or the current one, and deleted),\n"
      "RAM total and available, usable cores and the SIMD target of the kernels. With --model\n"
      "it also recommends the largest memory preset whose budget fits in the available RAM.\n"
      "With --volume (and --model) it lists the drives the engine reads the model from, as it\n"
      "groups them (a file system, or a volume with a profile of its own), each with its read\n"
      "rate measured the same way on the largest copy it holds (through its emulated profile\n"
      "if it has one), and under each the directories on it: how many of the model's files\n"
      "and bytes each holds, and any copy that differs from the model's (size, or sampled\n"
      "bytes: the engine refuses it).\n"
      "Ends with the command to run next. Exits 0 when everything works (warnings included),\n"
      "1 when something essential fails (the model cannot be opened or read, or does not fit\n"
      "in RAM even at preset ultra), with the reason on stderr.",
      kDoctor,
      RunDoctor};
  return kCommand;
}

}  // namespace k3::cli
