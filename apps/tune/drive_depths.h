// k3 tune's queue depth per drive. The engine reads every drive (the model's directory's file
// system, each --volume's: apps/reports/drives.h) through an engine of its own, each with
// --queue-depth reads in flight. With several drives, k3 tune reads each one alone at every depth
// of its list (random whole experts from the copies it holds, as k3 bench --raw reads them) and
// finds the depth at which its rate stops growing. The engine takes one depth for every drive, so
// the depth chosen is the largest of the drives': none of them is held below its own.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "apps/bench/raw_bench.h"
#include "io/storage_profile.h"
#include "io/volume.h"
#include "nlohmann/json.hpp"

namespace k3::cli::tune {

// One drive's rate by queue depth.
struct DriveDepths {
  std::string id = "";                 // as the engine names the drive ("259:1", or a directory)
  std::vector<std::string> dirs = {};  // the directories on it
  std::string profile = "";
  int files = 0;                 // the model's files it holds
  std::vector<int> depths = {};  // as measured, increasing
  std::vector<double> gbps = {};
  int depth = 0;             // where its rate stops growing (KneeDepth); 0 when it was not measured
  std::string skipped = "";  // why it was not measured ("" when it was)
};

// The smallest depth whose rate is within kMargin (apps/tune/tune_sweep.h) of the fastest
// depth's: deeper queues gain that drive no more than noise. `depths` increasing.
int KneeDepth(const std::vector<int>& depths, const std::vector<double>& gbps);

// Every drive of `v`'s model directory and `volumes` that holds any of its files, each read
// alone at `depths` (increasing) with `profile` (the model's; a volume with a profile of its own
// keeps it): `reads` random whole experts a run, the median of `repeat` runs. Progress on stderr
// unless `quiet`.
absl::StatusOr<std::vector<DriveDepths>> MeasureDriveDepths(const bench::Volume& v,
                                                            const std::vector<io::Volume>& volumes,
                                                            const io::StorageProfile& profile,
                                                            const std::vector<int>& depths,
                                                            int reads, int repeat, bool quiet);

// The depth for --queue-depth: the largest of the measured drives' (0 when none was).
int ChosenDepth(const std::vector<DriveDepths>& drives);

// The markdown table: a row per drive, its GB/s at each depth and the depth chosen for it.
std::string DriveDepthsTable(const std::vector<DriveDepths>& drives);

// [{"id", "dirs", "profile", "files", "depths": [1, 4, ..], "gbps": [..] (one per depth),
//   "queue_depth", "skipped"}]
nlohmann::json DriveDepthsJson(const std::vector<DriveDepths>& drives);

}  // namespace k3::cli::tune
