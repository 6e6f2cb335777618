// k3 bench --raw, and the raw column of the decode benchmark: random whole experts of a
// checkpoint read with the io layer (O_DIRECT, through a ReadRouter over the --volume drives)
// at each queue depth and storage profile, side by side with fio on the same files, block size
// and depth when fio is installed and no --volume is read. Also one drive's rate by depth, for
// k3 tune.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint/checkpoint.h"
#include "core/util/median.h"  // the medians of a Row (and of the decode benchmark's runs)
#include "io/read_router.h"
#include "io/storage_profile.h"
#include "io/volume.h"
#include "nlohmann/json.hpp"

namespace k3::cli::bench {

inline constexpr char kName[] = "bench";

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
  std::vector<std::string> volume_flags = {};  // the --volume directories read beside it
  std::string profile = "";
  int queue_depth = 0;
  int drives = 0;                              // the devices the reads went to
  std::vector<io::DeviceReport> devices = {};  // what each did over the runs
  double seconds = 0;                          // the runs' time, summed
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

struct RawSettings {
  std::vector<int> depths;
  std::vector<io::StorageProfile> profiles;
  int repeat = 3;
  int reads = 96;
  uint64_t chunk_bytes = 0;
  bool fio = true;
  bool huge_pages = true;
  bool quiet = false;
  std::vector<io::Volume> volumes;  // --volume
  bool sweep_volumes = false;       // rows with the first 0, 1, ... N of them
};

// The --volume sets the rows read with: every volume, or with --sweep-volumes none, the first,
// the first two, ... all of them.
std::vector<std::vector<io::Volume>> VolumeSets(const RawSettings& s);
// " +2 volumes" for progress lines and labels; "" without --volume.
std::string VolumesLabel(const std::vector<std::string>& volume_flags);

absl::StatusOr<Volume> LoadVolume(const std::string& dir);
// The raw settings from the flags (--queue-depth, --storage-profile, --repeat, --reads, ...).
absl::StatusOr<RawSettings> ReadRawSettings();
// Every (profile, depth) cell of one volume read with the --volume directories `volumes` (a
// ReadRouter over their drives), appended to `rows`.
absl::Status MeasureVolume(const RawSettings& s, Volume& v, const std::vector<io::Volume>& volumes,
                           std::mt19937_64& rng, std::vector<Row>* rows, EngineSetup* setup);

// One drive's rate at each of `depths`: GB/s, the median of `repeat` runs of `reads` random whole
// experts of `v`, read with `profile` from `paths` (one per shard of the checkpoint: the copy on
// that drive, "" where it holds none; experts with bytes in such a shard are left out).
// FailedPrecondition when the drive holds no whole expert.
absl::StatusOr<std::vector<double>> MeasureDrive(const Volume& v,
                                                 const std::vector<std::string>& paths,
                                                 const io::StorageProfile& profile,
                                                 const std::vector<int>& depths, int reads,
                                                 int repeat, std::mt19937_64& rng);

// The io layer's setup and the volumes: the head of both benchmarks' JSON.
nlohmann::json SetupJson(const std::string& benchmark, const std::vector<Volume>& volumes,
                         const EngineSetup& setup);
nlohmann::json RawRowJson(const Row& r);

// k3 bench --raw over `dirs`; the exit code.
int RunRaw(const std::vector<std::string>& dirs);

}  // namespace k3::cli::bench
