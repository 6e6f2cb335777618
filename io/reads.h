// Reads of checkpoint bytes, whoever does them: the types of a read (its request, its result,
// the file it is from) and the interface every reader implements. A read engine drives one
// device (one io_uring ring or pread pool: io/read_engine.h); a read router spreads each read
// over the drives that hold its bytes, through an engine per drive (io/read_router.h). Both are
// Reads, so that what only submits and waits (the expert and trunk streams, k3 bench's raw reads,
// the disk check of k3 doctor) takes either, and one name, `reads`, serves for both.
//
// An interface rather than an engine private to io/: the router is built from engines, and the
// io tests, k3 doctor and the io benchmark measure one device alone, without copies, parts or
// routing; with the interface the two only differ where they do (how a file is opened: the
// router opens its copies and stripes too; their options; the router's devices).
//
// Ownership: a request's buffer belongs to the caller but must stay valid and untouched until
// the request's result has been delivered (also after Cancel: bytes may still be landing in it).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

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
  // Optional. When set, the result goes to this callback (on a thread of the io layer; keep it
  // short, e.g. a flow-graph try_put) instead of the completion queue; Wait() does not apply.
  std::function<void(ReadResult)> on_complete = nullptr;
};

// One request as a read log records it (Reads::StartLog).
struct LoggedRead {
  FileId file = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
  Priority priority = Priority::kDemand;
};

struct ReadStats {
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

class Reads {
 public:
  virtual ~Reads() = default;

  // The file behind an id of this reader's OpenFile.
  virtual FileInfo file(FileId id) const = 0;

  // Queues a read. Errors here are about the request itself (bad file, unaligned or short
  // buffer, range past the end of the file at open): InvalidArgument or OutOfRange.
  virtual absl::StatusOr<ReadId> Submit(ReadRequest request) = 0;
  // Submit + Wait: the requested bytes, or the error.
  absl::StatusOr<std::span<uint8_t>> Read(ReadRequest request);

  // Blocks until this request's result is available and claims it. NotFound for an unknown
  // or already claimed id, InvalidArgument for a request with a callback.
  virtual ReadResult Wait(ReadId id) = 0;
  // Claims the oldest unclaimed result, if any (results of requests with callbacks never
  // appear here). Any thread.
  virtual std::optional<ReadResult> Poll() = 0;
  // (Every implementation gives the same defaults as here.)
  virtual std::optional<ReadResult> WaitAny(absl::Duration timeout = absl::InfiniteDuration()) = 0;

  // Drops a request that is no longer wanted (meant for prefetches; any priority works). A
  // queued request completes at once with Cancelled; one in flight stops issuing chunks and
  // completes with Cancelled when its in-flight chunks have landed. Returns false when the
  // request had already completed (its result stands) or is unknown. Cancelled results of
  // requests with callbacks are delivered on a thread of the io layer, never inside this call.
  virtual bool Cancel(ReadId id) = 0;
  // Cancels every prefetch not yet complete for which `filter(user_data)` holds (all when no
  // filter is given), e.g. the guesses for a layer that has already run. Returns how many.
  virtual int CancelPrefetches(std::function<bool(uint64_t user_data)> filter = nullptr) = 0;

  // Records every request submitted from now on that is then delivered OK, until TakeLog: the
  // reads of a run, to replay them without the compute (io/read_replay.h; k3 bench's I/O floor).
  virtual void StartLog() = 0;
  // The recorded reads, in submission order; recording stops.
  virtual std::vector<LoggedRead> TakeLog() = 0;

  virtual std::string_view backend_name() const = 0;  // "io_uring" or "pread"
  virtual bool buffers_registered() const = 0;
  virtual ReadStats stats() const = 0;
};

}  // namespace k3::io
