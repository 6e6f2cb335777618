// The disk's read rate as `k3 doctor` measures it (random 16 MiB reads, 4 in flight, for a few
// seconds, through the engine's own read path), shared with `k3 inspect`'s forecasts.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "io/storage_profile.h"

namespace k3::cli {

inline constexpr uint64_t kReadBytes = 16 << 20;  // one read, as large as an expert group
inline constexpr int kReadsInFlight = 4;
inline constexpr double kMeasureSeconds = 2.5;
// The scratch file measured where there is no model to read.
inline constexpr uint64_t kScratchBytes = 128ull << 20;

struct ReadRate {
  std::string path;
  uint64_t read_bytes = 0;  // per read: 16 MiB, or the whole file when it is smaller
  bool direct = false;
  double bytes_per_second = 0;
  double seconds = 0;
};

// The largest shard: the longest run of 16 MiB reads without wrapping.
std::string LargestShard(const Checkpoint& ckpt);

// Random 16 MiB reads at 4 in flight through the engine's own read path for a few seconds, on
// the device or (`profile`) an emulated one layered on it.
absl::StatusOr<ReadRate> MeasureReads(const std::string& path,
                                      const io::StorageProfile& profile = {});

// A file of kScratchBytes random bytes in `dir` (named `prefix`-XXXXXX) to read back where
// there is no model, flushed and dropped from the page cache so that buffered reads (where
// O_DIRECT is refused) do not just hit memory. The caller deletes it.
absl::StatusOr<std::string> WriteScratchFile(const std::string& dir, const std::string& prefix);

// Whether most of the file is holes (a sparse checkpoint: its reads run at memory speed).
bool MostlyHoles(const std::string& path);

}  // namespace k3::cli
