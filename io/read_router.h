// Reads from several drives at once. A file of the checkpoint may have copies in other
// directories (`--volume DIR[@PROFILE]`) and pieces in striped directories (k3 stripe); every
// device has its own read engine (io_uring ring, queue depth), and each read goes to the copies
// whose devices will finish it first, from the rates measured as the run goes. A long read is
// split over the devices so that its parts land together: a layer's reads are in flight on every
// drive at once, each drive's share in proportion to what it delivers. A copy that fails is set
// aside with one warning and its part read again from another copy.
//
// A device is a file system (st_dev): two directories on one disk are one queue. A directory with
// its own emulated storage profile counts as its own drive, whatever its inodes, so that tests
// and benchmarks can emulate drives with hard links on one disk.
//
// Reads as the read engine does (the Reads interface, io/reads.h) for files opened here; with one
// device every read goes to it whole, as it would to the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "io/read_engine.h"
#include "io/storage_profile.h"
#include "io/volume.h"

namespace k3::io {

// Bytes [offset, offset + length) of a file are also at `at` in `path` (a striped piece). `at`
// and `offset` are equal modulo 4096, so a read lands where it would from the file.
struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string path = "";
  uint64_t at = 0;
};

struct ReadRouterOptions {
  // For every device: queue depth, chunking, O_DIRECT, the registered arena, faults. `profile`
  // is the profile of the files' own directories and of volumes without one.
  ReadEngineOptions engine = {};
  std::vector<Volume> volumes = {};
  CopyCheck check = CopyCheck::kSampled;
  // A read is split over devices only into parts at least this long (a part is one request to
  // its device's engine; small reads go whole to one device).
  uint64_t min_part_bytes = 1 << 20;
  // With several drives, the parts each has at its engine at once (at most the queue depth);
  // the others wait in the router, demand first, so that a drive's reads land in the order
  // they were asked for (read_router.cc says why).
  int parts_in_flight_per_drive = 4;
  // Warnings (a copy refused at open, a copy failing mid-run); default: "k3: warning: ..." on
  // stderr.
  std::function<void(const std::string&)> on_warning = nullptr;
};

// What one device did, for the run summary, --report-json and /metrics.
struct DeviceReport {
  std::string id = "";                 // "259:1", or the directory of a drive of its own
  std::vector<std::string> dirs = {};  // the directories read through it
  std::string profile = "direct";      // StorageProfile::Describe()
  int queue_depth = 0;
  uint64_t bytes = 0;       // delivered to reads
  int64_t reads = 0;        // parts read
  double busy_seconds = 0;  // wall time with a read in flight
  double rate = 0;          // bytes per second the router plans with (measured once known)
  int64_t failovers = 0;    // parts read again elsewhere after this device's copy failed
};

// What the devices of one router did between two of its reports (`before` taken first): bytes,
// reads, busy seconds and failovers are the differences, the rest is as `after` says. A device
// that `before` does not name counts whole.
std::vector<DeviceReport> DevicesSince(const std::vector<DeviceReport>& before,
                                       const std::vector<DeviceReport>& after);

// Several devices' reads (the Reads interface, io/reads.h).
class ReadRouter final : public Reads {
 public:
  static absl::StatusOr<std::unique_ptr<ReadRouter>> Create(const ReadRouterOptions& options);
  // As the engine's: cancels what is queued, waits for what is in flight.
  ~ReadRouter() override;
  ReadRouter(const ReadRouter&) = delete;
  ReadRouter& operator=(const ReadRouter&) = delete;

  // Opens `path` and its copies: the file of the same name in every volume (checked as the
  // options say; a copy that differs is refused with a warning naming it and never read), and
  // `stripes`, pieces of it held elsewhere (read instead of `path` for the ranges they hold).
  absl::StatusOr<FileId> OpenFile(const std::string& path, std::vector<Extent> stripes = {});
  FileInfo file(FileId id) const override;  // of `path` itself
  // The other places the file is read from (copies, then stripe files).
  std::vector<std::string> copies(FileId id) const;
  // The stripes it was opened with.
  std::vector<Extent> stripes(FileId id) const;

  const ReadRouterOptions& options() const;
  std::vector<DeviceReport> devices() const;

  absl::StatusOr<ReadId> Submit(ReadRequest request) override;
  ReadResult Wait(ReadId id) override;
  std::optional<ReadResult> Poll() override;
  std::optional<ReadResult> WaitAny(absl::Duration timeout = absl::InfiniteDuration()) override;
  bool Cancel(ReadId id) override;
  int CancelPrefetches(std::function<bool(uint64_t user_data)> filter = nullptr) override;
  // The reads asked of the router (not their parts), as an engine logs them.
  void StartLog() override;
  std::vector<LoggedRead> TakeLog() override;
  std::string_view backend_name() const override;
  bool buffers_registered() const override;
  ReadStats stats() const override;  // summed over the devices (peaks: the largest)

  struct Impl;

 private:
  explicit ReadRouter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::io
