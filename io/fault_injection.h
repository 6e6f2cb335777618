// Fault injection for tests: a plan of failures that the read engine applies to every read
// attempt it makes, with either backend (io_uring or pread). The real read happens first and the
// plan may then replace its result with an error, cut it short or hold it back, so the engine's
// retry, resubmission and error paths run against real files and real buffers. (A file
// truncated after it was opened needs no plan: the test truncates it.)
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace k3::io {

class FaultPlan {
 public:
  // Attempts are numbered from 1 in the order they complete; one chunk read (or one retry of
  // it) is one attempt. `count` < 0 means "from `first` on, forever".

  // Attempts first .. first+count-1 fail with errno `err` (EIO, EINTR, EAGAIN, ...).
  FaultPlan& FailAttempts(int64_t first, int count, int err);
  // Attempts whose file range contains byte `offset` of a file whose path ends with
  // `path_suffix` ("" = any file) fail with `err`, `count` times (< 0: always; a permanent
  // bad sector).
  FaultPlan& FailAtOffset(uint64_t offset, int err, int count = -1,
                          const std::string& path_suffix = "");
  // Every attempt from attempt `first` on that reads a file whose path ends with `path_suffix`
  // fails with `err`: a copy on a drive gone bad (EIO), or a file that vanished from a network
  // volume (ENOENT).
  FaultPlan& FailFile(const std::string& path_suffix, int err, int64_t first = 1);
  // Attempts first .. first+count-1 transfer at most `max_bytes` (short reads).
  FaultPlan& ShortReads(uint64_t max_bytes, int64_t first = 1, int count = -1);
  // Each attempt fails with `err` with this probability, decided by a hash of (seed, attempt
  // number) so a run is reproducible: transient faults scattered over a long run (soak tests).
  FaultPlan& FailRandomly(double probability, int err, uint64_t seed);
  // Every attempt completes no sooner than `delay` after it was issued (a slow disk).
  FaultPlan& Slow(absl::Duration delay);
  // Opening a file with O_DIRECT fails with EINVAL, as tmpfs and some FUSE file systems do.
  FaultPlan& RefuseDirect();
  // Attempts first .. first+count-1 stay in flight, their requests holding their slots, until
  // Release(): a test queues, cancels or shuts down behind reads it knows to be at the device,
  // so what it checks is the engine's choice and not how the threads happened to run. Only
  // the completion waits; the engine goes on issuing. An engine shutting down lets them go.
  FaultPlan& Hold(int64_t first = 1, int count = 1);
  // Blocks until at least `n` attempts are being held; false if they are not within `timeout`,
  // which only turns a broken engine's hang into a test failure.
  [[nodiscard]] bool AwaitHeld(int n, absl::Duration timeout = absl::Minutes(1));
  // Lets every held attempt complete, and ends holding for good: later attempts run through.
  void Release();

  struct Outcome {
    int64_t result;        // bytes transferred, or -errno
    absl::Duration delay;  // hold the completion this long after issue
    bool held = false;     // and until Release() (the engine's release listener says when)
  };
  // Called by the engine with the real result of reading [offset, offset + length) of `path`.
  Outcome Apply(const std::string& path, uint64_t offset, uint64_t length, int64_t result);

  // For engines: `on_release` runs, under the plan's lock, when Release() is called, until
  // the listener is removed (which waits for a call in progress); the engine then lets go of
  // the completions it holds. It must not call back into the plan.
  int AddReleaseListener(std::function<void()> on_release);
  void RemoveReleaseListener(int id);

  bool refuses_direct() const;
  int64_t attempts() const;
  int64_t injected() const;  // attempts whose result the plan changed

  // A plan from a spec such as "random=0.01,seed=7" or "eio-attempt=5,short=4096" (comma-separated
  // random=P, seed=N, eio-attempt=N, eio-offset=N (permanent), short=BYTES, slow=MS,
  // from=N then eio-file=SUFFIX or gone-file=SUFFIX: that file's reads fail with EIO or ENOENT
  // from attempt N on (1 unless given before); what the
  // K3_FAULTS environment variable of the k3 command takes (docs/RELIABILITY.md).
  static absl::StatusOr<std::shared_ptr<FaultPlan>> Parse(const std::string& spec);

 private:
  enum class Kind { kFailAttempts, kFailAtOffset, kFailFile, kShortReads, kRandom, kHold };
  struct Rule {
    Kind kind = Kind::kFailAttempts;
    int64_t first = 1;
    int64_t count = -1;  // remaining for kFailAtOffset; span of attempts otherwise
    int err = 0;
    uint64_t offset = 0;
    uint64_t max_bytes = 0;
    std::string path_suffix = "";
    double probability = 0;
    uint64_t seed = 0;
  };
  bool Covers(const Rule& rule, int64_t attempt) const;
  bool Matches(Rule& rule, int64_t attempt, const std::string& path, uint64_t offset,
               uint64_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<Rule> rules_ ABSL_GUARDED_BY(mu_);
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool refuse_direct_ ABSL_GUARDED_BY(mu_) = false;
  int64_t attempts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int next_listener_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::function<void()>> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace k3::io
