// The drives a model is read from: its own directory and the --volume directories, grouped as
// the engine's read router groups them (io/read_router.h): the directories of one file system
// (st_dev) are one drive, a volume with a storage profile of its own is a drive of its own. And
// which of the model's files each directory holds. For k3 doctor and k3 tune.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "io/storage_profile.h"
#include "io/volume.h"

namespace k3::cli {

// One directory the model's files are read from.
struct DriveDir {
  std::string dir = "";
  std::string spec = "";  // as --volume gave it; "" for the model's own directory
  // Per shard of the checkpoint: the file read from here, "" when the directory holds none (or
  // one the engine refuses: it differs from the model's).
  std::vector<std::string> copies = {};
  int files = 0;                          // the shards held (copies that match)
  uint64_t bytes = 0;                     // their bytes
  std::vector<std::string> differs = {};  // why other copies are refused, one line each
  bool stripes = false;                   // holds a k3 stripe layout (k3-stripe.json)
};

struct Drive {
  std::string id = "";  // "259:1", or the directory of a volume with its own profile
  io::StorageProfile profile = {};
  std::vector<DriveDir> dirs = {};

  // Per shard: a file to read it from on this drive ("" when none of its directories has one).
  std::vector<std::string> Copies() const;
  int files() const;  // the shards the drive holds (in any of its directories)
};

// The drives of the model's directory (always the first directory of the first drive) and of
// `volumes`; `profile` is that of the model's directory and of
// volumes without one. Each copy is compared with the model's file as `check` says (size, or
// samples too: what the engine checks when it opens them).
absl::StatusOr<std::vector<Drive>> FindDrives(const Checkpoint& ckpt,
                                              const std::vector<io::Volume>& volumes,
                                              const io::StorageProfile& profile,
                                              io::CopyCheck check = io::CopyCheck::kSampled);

}  // namespace k3::cli
