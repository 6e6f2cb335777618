// The storage read engine: every read of checkpoint bytes on the streaming path goes through
// here. io_uring with O_DIRECT into 4 KiB-aligned (optionally registered, huge-page) buffers,
// registered files, a queue depth in requests, long reads split into chunks, per-request
// completions, short-read resubmission, retries of transient errors, errors that name file and
// offset, three priorities and cancellable prefetches; a pread thread pool where io_uring cannot
// be set up and buffered reads where O_DIRECT is refused; storage-profile emulation and fault
// injection on top of either backend.
//
// Usage:
//   auto engine = ReadEngine::Create({.queue_depth = 16});
//   FileId f = *(*engine)->OpenFile(path);
//   std::span<uint8_t> buf = arena->Slice(0, BufferBytesFor(offset, length));
//   ReadId id = *(*engine)->Submit({.file = f, .offset = offset, .length = length,
//                                   .buffer = buf, .priority = Priority::kPrefetch});
//   ReadResult r = (*engine)->Wait(id);          // or Poll() / WaitAny() from another thread,
//   if (!r.status.ok()) ...; use r.data;         // or a callback in the request
//
// Ownership: the buffer belongs to the caller but must stay valid and untouched until the
// request's result has been delivered (also after Cancel: bytes may still be landing in it).
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
#include "io/aligned_buffer.h"
#include "io/fault_injection.h"
#include "io/storage_profile.h"

namespace k3::io {

using FileId = int32_t;
using ReadId = uint64_t;  // never 0

// Demand: a computation is waiting for these bytes now. Trunk: streamed dense weights, needed
// soon on a known schedule. Prefetch: a guess; may be cancelled and is never allowed to hold a
// demand read back (demand requests are admitted and their chunks issued first, and prefetches
// are capped below the queue depth).
enum class Priority : uint8_t { kDemand = 0, kTrunk = 1, kPrefetch = 2 };
inline constexpr int kNumPriorities = 3;

struct ReadResult {
  ReadId id = 0;
  uint64_t user_data = 0;
  Priority priority = Priority::kDemand;
  // OK; Cancelled; DataLoss (end of file before the requested bytes); or the errno's code with
  // a message naming the file and the offset of the read that failed.
  absl::Status status = absl::OkStatus();
  std::span<uint8_t> data = {};  // the requested bytes inside the caller's buffer; empty unless OK
  absl::Duration latency = absl::ZeroDuration();  // submit to delivery
  int retries = 0;  // attempts repeated for this request (EINTR, EIO, short reads)
};

struct ReadRequest {
  FileId file = -1;
  uint64_t offset = 0;  // any byte offset
  uint64_t length = 0;
  // 4 KiB-aligned, at least BufferBytesFor(offset, length) bytes. The requested bytes land at
  // buffer.data() + offset % 4096 (ReadResult::data points there).
  std::span<uint8_t> buffer = {};
  Priority priority = Priority::kDemand;
  uint64_t user_data = 0;  // handed back in the result
  // Optional. When set, the result goes to this callback (on an engine thread; keep it short,
  // e.g. a flow-graph try_put) instead of the completion queue; Wait() does not apply.
  std::function<void(ReadResult)> on_complete = nullptr;
};

// One request as a read log records it (ReadEngine::StartLog).
struct LoggedRead {
  FileId file = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
  Priority priority = Priority::kDemand;
};

enum class Backend { kAuto, kUring, kPread };

// Reads in flight when nothing else is asked (`--queue-depth`; k3 bench and k3 tune sweep it).
inline constexpr int kDefaultQueueDepth = 32;

struct ReadEngineOptions {
  // Requests (whole reads: one expert, one trunk tensor) in flight at once.
  int queue_depth = kDefaultQueueDepth;
  // Reads are split into chunks of this size (a multiple of 4 KiB), issued as separate
  // operations: a demand read waits for at most one chunk of a prefetch rather than all of it,
  // and a short read or an error costs one chunk. 4 MiB is the largest single request of common
  // NVMe and virtio disks (max_sectors_kb); 1 MiB to unsplit measured the same on the bench
  // machine (docs/PERFORMANCE.md).
  uint64_t chunk_bytes = 4 << 20;
  // Chunks of one request in flight at once (so one long read cannot take every slot).
  int chunks_per_request = 8;
  // Prefetch requests in flight at once; 0 means half the depth (at least 1), so demand reads
  // always find a free slot once the depth is 2 or more.
  int max_prefetch_in_flight = 0;
  // Chunks of prefetch reads at the device at once, and a prefetch chunk is issued only while
  // no demand or trunk read is waiting to be issued: guesses use the time the disk would be
  // idle, and a demand read waits behind at most this many of their chunks. 0: neither rule
  // (prefetches then fill the device like any read, up to max_prefetch_in_flight requests).
  int max_prefetch_chunks = 4;
  // kAuto: io_uring, or pread threads with a notice when io_uring cannot be set up. The
  // environment variable K3_IO_BACKEND=pread (or uring) overrides kAuto.
  Backend backend = Backend::kAuto;
  int pread_threads = 0;  // 0: one per chunk in flight, at most 64
  // O_DIRECT, falling back to buffered reads (with a notice) where the file system refuses it.
  bool direct = true;
  // Retries of an operation failing with EIO-like errors, in a row (an attempt that transfers
  // bytes resets the count); EINTR/EAGAIN retry without counting.
  int max_retries = 3;
  absl::Duration retry_backoff = absl::Milliseconds(1);  // doubles per retry
  // Emulated volume on top of the real one ("direct" = none).
  StorageProfile profile = {};
  // Memory registered with io_uring once (fixed buffers). Reads into it skip page pinning;
  // reads into other aligned memory work too. Not owned; must outlive the engine.
  const BufferArena* arena = nullptr;
  std::shared_ptr<FaultPlan> faults = nullptr;  // tests only
  bool notices = true;                          // one-line stderr notices about fallbacks
};

struct EngineStats {
  uint64_t completed = 0;  // requests delivered OK
  uint64_t failed = 0;
  uint64_t cancelled = 0;
  uint64_t bytes_delivered = 0;  // requested bytes of OK requests
  uint64_t bytes_read = 0;       // bytes the device transferred (aligned supersets, re-reads)
  uint64_t operations = 0;       // chunk reads issued, retries included
  uint64_t short_reads = 0;
  uint64_t transient_retries = 0;  // EINTR, EAGAIN
  uint64_t error_retries = 0;      // EIO and the like
  int peak_requests_in_flight = 0;
  int peak_operations_in_flight = 0;
};

struct FileInfo {
  std::string path = "";
  uint64_t size = 0;  // at open
  bool direct = false;
  bool registered = false;  // an io_uring fixed file
};

class ReadEngine {
 public:
  static absl::StatusOr<std::unique_ptr<ReadEngine>> Create(const ReadEngineOptions& options);
  // Cancels what is queued, waits for what is in flight (buffers stay in use until then) and
  // delivers Cancelled to pending callbacks; undelivered queued results are dropped.
  ~ReadEngine();
  ReadEngine(const ReadEngine&) = delete;
  ReadEngine& operator=(const ReadEngine&) = delete;

  // Opens a file for reading (O_DIRECT unless refused) and registers it with the ring.
  absl::StatusOr<FileId> OpenFile(const std::string& path);
  FileInfo file(FileId id) const;

  // Queues a read. Errors here are about the request itself (bad file, unaligned or short
  // buffer, range past the end of the file at open): InvalidArgument or OutOfRange.
  absl::StatusOr<ReadId> Submit(ReadRequest request);
  // Submit + Wait: the requested bytes, or the error.
  absl::StatusOr<std::span<uint8_t>> Read(ReadRequest request);

  // Blocks until this request's result is available and claims it. NotFound for an unknown
  // or already claimed id, InvalidArgument for a request with a callback.
  ReadResult Wait(ReadId id);
  // Claims the oldest unclaimed result, if any (results of requests with callbacks never
  // appear here). Any thread.
  std::optional<ReadResult> Poll();
  std::optional<ReadResult> WaitAny(absl::Duration timeout = absl::InfiniteDuration());

  // Drops a request that is no longer wanted (meant for prefetches; any priority works). A
  // queued request completes at once with Cancelled; one in flight stops issuing chunks and
  // completes with Cancelled when its in-flight chunks have landed. Returns false when the
  // request had already completed (its result stands) or is unknown. Cancelled results of
  // requests with callbacks are delivered on an engine thread, never inside this call.
  bool Cancel(ReadId id);
  // Cancels every prefetch not yet complete for which `filter(user_data)` holds (all when no
  // filter is given), e.g. the guesses for a layer that has already run. Returns how many.
  int CancelPrefetches(std::function<bool(uint64_t user_data)> filter = nullptr);

  // Records every request submitted from now on that is then delivered OK, until TakeLog: the
  // reads of a run, to replay them without the compute (io/read_replay.h; k3 bench's I/O floor).
  void StartLog();
  // The recorded reads, in submission order; recording stops.
  std::vector<LoggedRead> TakeLog();

  std::string_view backend_name() const;  // "io_uring" or "pread"
  bool buffers_registered() const;
  const ReadEngineOptions& options() const;
  EngineStats stats() const;

  struct Impl;

 private:
  explicit ReadEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::io
