// The read engine's scheduler state (ReadEngine::Impl) and its request bookkeeping, shared by
// the caller side (io/read_engine.cc: setup, submit, wait, cancel) and the backend side
// (io/read_scheduler.cc: admission, chunks, outcomes, delivery). Not for use outside io/.
#pragma once

#include <cerrno>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "io/engine_internal.h"
#include "io/read_engine.h"
#include "io/read_results.h"
#include "io/tsan_mutex.h"

namespace k3::io {
namespace internal {

struct FileState {
  std::string path;
  int fd = -1;
  std::vector<int> retired_fds;  // replaced by a buffered fd; in-flight reads may still use them
  bool direct = false;
  uint64_t size = 0;
  int slot = -1;
  int index = -1;  // its FileId
};

struct RequestState {
  ReadId id = 0;
  ReadRequest spec;
  FileState* file = nullptr;
  AlignedExtent extent;
  uint64_t needed = 0;      // head + length: bytes from the aligned start that must arrive
  uint64_t next_issue = 0;  // where the next new chunk starts (relative to the aligned start)
  int outstanding = 0;      // chunks issued and not retired (in flight, held or awaiting retry)
  bool admitted = false;
  bool cancelled = false;
  absl::Status error;
  absl::Time submitted;
  int retries = 0;
  bool logged = false;  // submitted while a read log was recording
  std::vector<std::unique_ptr<Chunk>> chunks;

  bool fully_issued() const { return next_issue >= extent.aligned_length; }
  bool stopped() const { return cancelled || !error.ok(); }
  int priority() const { return static_cast<int>(spec.priority); }
};

constexpr int kMaxTransientRetries = 100;  // EINTR/EAGAIN in a row on one chunk
constexpr int kMaxStalls = 8;              // short reads that made no aligned progress
constexpr int kPrefetch = static_cast<int>(Priority::kPrefetch);

inline bool IsTransient(int err) { return err == EINTR || err == EAGAIN; }

// Errors worth another attempt after a pause: a flaky medium or link, memory pressure.
inline bool IsRetryable(int err) {
  switch (err) {
    case EIO:
    case ETIMEDOUT:
    case ENOMEM:
    case ENOBUFS:
    case ECONNRESET:
    case ENOLINK:
    case EREMOTEIO:
      return true;
    default:
      return false;
  }
}

struct Finished {
  ReadResult result;
  std::function<void(ReadResult)> callback;
};

// A chunk outcome or a retry waiting for its time.
struct Timed {
  absl::Time when;
  Chunk* chunk;
  int64_t result;
  bool is_result;  // false: a retry to issue
  bool operator>(const Timed& o) const { return when > o.when; }
};

}  // namespace internal

using internal::Chunk;
using internal::FileState;
using internal::Finished;
using internal::kMaxStalls;
using internal::kMaxTransientRetries;
using internal::kPrefetch;
using internal::RequestState;
using internal::Timed;

struct ReadEngine::Impl : public internal::ChunkSource {
  explicit Impl(const ReadEngineOptions& o) : options(o) {}
  ~Impl() override { Shutdown(); }

  absl::Status Start();
  absl::Status CreateBackend(Backend which, size_t chunks);
  void Shutdown();

  absl::StatusOr<FileId> OpenFile(const std::string& path);
  absl::StatusOr<ReadId> Submit(ReadRequest request);
  ReadResult Wait(ReadId id);
  std::optional<ReadResult> WaitAny(absl::Duration timeout);
  bool Cancel(ReadId id);
  int CancelPrefetches(const std::function<bool(uint64_t)>& filter);

  // ChunkSource.
  bool TakeChunks(size_t max, std::vector<Chunk*>* out) override;
  Chunk* WaitForChunk() override;
  void Complete(Chunk* chunk, int64_t result) override;

  // Scheduling; all under mu.
  int AdmissiblePriority() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool MayIssue(int priority) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool CanIssue() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  Chunk* NextChunk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  Chunk* NewChunk(RequestState* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  Chunk* Issue(Chunk* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void HandleResult(Chunk* c, int64_t result, std::vector<Finished>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void HandleShortRead(Chunk* c, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void HandleError(Chunk* c, int err, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool SwitchToBuffered(FileState* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Requeue(Chunk* c, absl::Time when) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void PushTimed(const Timed& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Fail(RequestState* r, absl::Status status, std::vector<Finished>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Stop(RequestState* r, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Retire(Chunk* c, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void MaybeFinish(RequestState* r, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Finish(RequestState* r, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void CancelLocked(RequestState* r, std::vector<Finished>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::optional<ReadResult> ClaimOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status EndOfFile(const Chunk& c, uint64_t at) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void TimerLoop();
  void ReleaseHeld();
  void LetHeldGo() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  static void Deliver(std::vector<Finished>& finished);

  const ReadEngineOptions options;
  std::unique_ptr<internal::Backend> backend;
  int max_requests = 0;
  int max_prefetch = 0;
  const uint8_t* registered_base = nullptr;  // the arena, when io_uring registered it
  size_t registered_size = 0;
  std::thread timer;
  int release_listener = -1;  // on options.faults, while the engine runs

  mutable absl::Mutex mu;
  std::vector<std::unique_ptr<FileState>> files ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<ReadId, std::unique_ptr<RequestState>> live ABSL_GUARDED_BY(mu);
  std::deque<RequestState*> queued[kNumPriorities] ABSL_GUARDED_BY(mu);
  std::deque<RequestState*> issuing[kNumPriorities] ABSL_GUARDED_BY(mu);  // admitted, chunks left
  int active ABSL_GUARDED_BY(mu) = 0;
  int active_by_priority[kNumPriorities] ABSL_GUARDED_BY(mu) = {};
  // Chunks issued and not yet handled (at the device, or held by an emulated volume).
  int device_by_priority[kNumPriorities] ABSL_GUARDED_BY(mu) = {};
  std::deque<Chunk*> retry_ready ABSL_GUARDED_BY(mu);
  std::vector<Timed> timed ABSL_GUARDED_BY(mu);  // min-heap on `when`
  // Completions a fault plan holds until its Release(), and whether that has come.
  std::vector<Timed> held ABSL_GUARDED_BY(mu);
  bool holds_released ABSL_GUARDED_BY(mu) = false;
  uint64_t timed_generation ABSL_GUARDED_BY(mu) = 0;
  std::vector<Finished> deferred ABSL_GUARDED_BY(mu);  // callbacks for the timer thread to run
  internal::UnclaimedResults done ABSL_GUARDED_BY(mu);
  ReadId next_id ABSL_GUARDED_BY(mu) = 1;
  size_t backend_in_flight ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool timer_stop ABSL_GUARDED_BY(mu) = false;
  std::optional<StorageEmulator> emulator ABSL_GUARDED_BY(mu);
  ReadStats stats ABSL_GUARDED_BY(mu);
  bool logging ABSL_GUARDED_BY(mu) = false;
  std::vector<std::pair<ReadId, LoggedRead>> log ABSL_GUARDED_BY(mu);
};

}  // namespace k3::io
