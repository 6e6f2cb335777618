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
// The request and result types and the methods to submit and wait are the Reads interface's
// (io/reads.h), which the read router (io/read_router.h) implements too.
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
#include "io/reads.h"
#include "io/storage_profile.h"

namespace k3::io {

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

// One device's reads (the Reads interface, io/reads.h).
class ReadEngine final : public Reads {
 public:
  static absl::StatusOr<std::unique_ptr<ReadEngine>> Create(const ReadEngineOptions& options);
  // Cancels what is queued, waits for what is in flight (buffers stay in use until then) and
  // delivers Cancelled to pending callbacks; undelivered queued results are dropped.
  ~ReadEngine() override;
  ReadEngine(const ReadEngine&) = delete;
  ReadEngine& operator=(const ReadEngine&) = delete;

  // Opens a file for reading (O_DIRECT unless refused) and registers it with the ring.
  absl::StatusOr<FileId> OpenFile(const std::string& path);
  const ReadEngineOptions& options() const;

  FileInfo file(FileId id) const override;
  absl::StatusOr<ReadId> Submit(ReadRequest request) override;
  ReadResult Wait(ReadId id) override;
  std::optional<ReadResult> Poll() override;
  std::optional<ReadResult> WaitAny(absl::Duration timeout = absl::InfiniteDuration()) override;
  bool Cancel(ReadId id) override;
  int CancelPrefetches(std::function<bool(uint64_t user_data)> filter = nullptr) override;
  void StartLog() override;
  std::vector<LoggedRead> TakeLog() override;
  std::string_view backend_name() const override;
  bool buffers_registered() const override;
  ReadStats stats() const override;

  struct Impl;

 private:
  explicit ReadEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::io
