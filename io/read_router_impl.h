// The read router's state (ReadRouter::Impl), shared by its setup and caller side
// (io/read_router.cc) and its routing (io/read_routing.cc: splitting reads over the drives,
// parts waiting for a drive, outcomes, fail-over). Not for use outside io/.
//
// Locking: one mutex guards the router. It is held while a part is submitted to or cancelled in
// a device's engine, and the engines call back (OnPart) without their own locks held and never
// inside Submit or Cancel: the order is always router, then engine.
#pragma once

#include <sys/stat.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "io/read_results.h"
#include "io/read_router.h"
#include "io/tsan_mutex.h"

namespace k3::io {
namespace router_internal {

// What a device is assumed to deliver until it has been measured (a profile's bandwidth when
// it has one): a guess only orders the first reads, the measured rate soon replaces it.
constexpr double kUnmeasuredRate = 2e9;
// Rates are measured over windows of this many bytes delivered, and each window's figure is
// averaged with the rate before (a noisy window moves the plan half way).
constexpr uint64_t kRateWindowBytes = 32 << 20;

inline std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

inline std::string BaseOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

struct Inode {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const Inode& o) const { return dev == o.dev && ino == o.ino; }
};

inline absl::StatusOr<Inode> InodeOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::ErrnoToStatus(errno, path);
  return Inode{st.st_dev, st.st_ino};
}

}  // namespace router_internal

struct ReadRouter::Impl {
  struct Device {
    std::string key;  // "dev:MAJ:MIN" or "volume:N"
    DeviceReport report;
    StorageProfile profile;
    std::unique_ptr<ReadEngine> engine;
    uint64_t outstanding = 0;  // bytes of parts routed here and not delivered (waiting too)
    int in_flight = 0;         // parts at the engine
    // Parts routed here beyond the parts in flight a drive gets, by priority: (request, part).
    std::deque<std::pair<ReadId, size_t>> waiting[kNumPriorities];
    absl::Time busy_since;
    bool measured = false;
    uint64_t window_bytes = 0;
    double window_busy = 0;  // busy seconds when the window opened

    double busy_now(absl::Time now) const {
      return report.busy_seconds + (in_flight > 0 ? absl::ToDoubleSeconds(now - busy_since) : 0);
    }
    // When the bytes already asked of it will have arrived, from now.
    double backlog() const { return static_cast<double>(outstanding) / report.rate; }
  };

  // A place the bytes of a file can be read from.
  struct Source {
    int device = 0;
    FileId file = -1;  // in the device's engine
    std::string path;
    bool stripe = false;
    uint64_t begin = 0, end = 0;  // the file's range it holds (stripes)
    int64_t delta = 0;            // its offset minus the file's (stripes)
    bool bad = false;
  };

  struct File {
    std::string path;
    FileInfo info;
    // [0]: the file itself, then its copies, then the stripes by offset (from first_stripe).
    std::vector<Source> sources;
    size_t first_stripe = 0;
    std::vector<Extent> stripes;  // as opened
  };

  struct Part {
    int source = 0;
    uint64_t offset = 0, length = 0;
    std::span<uint8_t> buffer;
    ReadId inner = 0;  // at its device's engine; 0 while waiting
    bool done = false;
  };

  struct Request {
    ReadId id = 0;
    ReadRequest spec;
    std::vector<Part> parts;
    int open_parts = 0;
    absl::Status error;
    bool cancelled = false;
    absl::Time submitted;
    int retries = 0;
    bool logged = false;
  };

  struct Finished {
    ReadResult result;
    std::function<void(ReadResult)> callback;
  };

  explicit Impl(const ReadRouterOptions& o) : options(o) {}

  absl::StatusOr<int> DeviceFor(const std::string& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::StatusOr<int> AddSource(File& f, const std::string& path, Source s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::vector<int> Candidates(const File& f, uint64_t offset, uint64_t length) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // [offset, offset + length) cut where a stripe piece begins or ends inside it at a 4 KiB
  // boundary (a sliced layout: one expert's pieces on several drives): {offset, length} each.
  std::vector<std::pair<uint64_t, uint64_t>> Segments(const File& f, uint64_t offset,
                                                      uint64_t length) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::vector<Part> Split(const File& f, const std::vector<int>& candidates, uint64_t offset,
                          uint64_t length, std::span<uint8_t> buffer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status SubmitPart(Request& r, size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status Send(Request& r, size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Pump(Device& d, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool HasRoom(const Device& d, Priority p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void OnPart(ReadId id, size_t index, ReadResult result);
  bool FailOver(Request& r, size_t index, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Measure(Device& d, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Stop(Request& r, absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Finish(Request& r, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::optional<ReadResult> ClaimOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Warn(const std::string& text) const;
  static void Deliver(std::vector<Finished>& out) {
    for (Finished& f : out) f.callback(std::move(f.result));
  }

  const ReadRouterOptions options;
  std::vector<std::optional<router_internal::Inode>>
      volume_inodes;  // of each volume's directory, if it exists

  mutable absl::Mutex mu;
  std::vector<std::unique_ptr<Device>> devices ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, FileId> opened ABSL_GUARDED_BY(mu);  // by path
  std::vector<File> files ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<ReadId, std::unique_ptr<Request>> live ABSL_GUARDED_BY(mu);
  internal::UnclaimedResults done ABSL_GUARDED_BY(mu);
  ReadId next_id ABSL_GUARDED_BY(mu) = 1;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool logging ABSL_GUARDED_BY(mu) = false;
  std::vector<std::pair<ReadId, LoggedRead>> log ABSL_GUARDED_BY(mu);
};

}  // namespace k3::io
