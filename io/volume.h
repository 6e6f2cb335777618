// A volume (`--volume DIR[@PROFILE]`): a directory holding copies of any of the checkpoint's
// files (same names), or a striped layout's pieces, read beside the model's own directory. Parsed
// once where the flag is read; everything after takes the parsed Volume. And the check that a
// copy holds the same bytes as the file it stands in for, before anything reads from it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "io/storage_profile.h"

namespace k3::io {

struct Volume {
  std::string dir = "";
  std::optional<StorageProfile> profile = std::nullopt;  // its own drive; else the default's
  std::string spec = "";  // as the flag gave it, for reports; "" for one built in code
};

// "DIR" or "DIR@PROFILE", the profile as --storage-profile takes it (commas kept):
// "/mnt/b/k3@bw=1000MB/s,lat=100us". InvalidArgument naming the spec.
absl::StatusOr<Volume> ParseVolume(std::string_view spec);

// The volumes of a list flag that the flag library has split at commas (and repeated flags
// joined with them): a part that is a profile setting (lat=, bw=, iops=, qd=) continues the
// profile of the volume before it, any other part starts a volume.
// {"/a@bw=1GB/s", "lat=1ms", "/b"} is {"/a@bw=1GB/s,lat=1ms", "/b"}.
std::vector<std::string> JoinVolumeParts(const std::vector<std::string>& parts);

// The specs of `volumes`, in order: what reports name them by.
std::vector<std::string> VolumeSpecs(const std::vector<Volume>& volumes);

enum class CopyCheck {
  kSize,     // the size only
  kSampled,  // the size, the first 64 KiB and 16 samples of 4 KiB spread over the file
  kFull,     // every byte (k3 inspect --verify-volumes)
};

// Compares `copy` with `original` as `check` says: OK, or FailedPrecondition naming the copy and
// what differs (size, or the first differing offset).
absl::Status CheckCopy(const std::string& original, const std::string& copy, CopyCheck check,
                       const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace k3::io
