// Internals of the read engine shared by its two backends (io/uring_backend.cc,
// io/pread_backend.cc) and the engine (io/read_engine_impl.h): the unit of work (a chunk read)
// and the narrow interface between the scheduler (io/read_scheduler.cc) and a backend, which
// the engine's setup (io/read_engine.cc) creates. Not for use outside io/.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace k3::io::internal {

struct RequestState;

// One read operation handed to a backend: `length` bytes of file `fd` at `file_offset` into
// `dest`. The backend reports the raw outcome (bytes or -errno); the scheduler decides what it
// means (done, short read, retry, error). The fields below `request` are filled by the scheduler
// under its lock before the chunk is handed out and are not touched while the backend has it.
struct Chunk {
  RequestState* request = nullptr;
  uint64_t begin = 0;  // [begin, end): the chunk's range relative to the request's aligned start
  uint64_t end = 0;
  uint64_t done = 0;  // bytes from `begin` that have arrived
  int transient_retries = 0;
  int error_retries = 0;
  int stalls = 0;  // short reads that made no aligned progress

  // The current attempt.
  int fd = -1;
  int file_slot = -1;  // registered file index, or -1
  int buf_index = -1;  // registered buffer index, or -1
  uint8_t* dest = nullptr;
  uint64_t file_offset = 0;
  uint32_t length = 0;
  absl::Time issued = absl::InfinitePast();
  // Storage-profile emulation: the completion is held until then.
  absl::Time not_before = absl::InfinitePast();
};

// What a backend calls; implemented by the engine.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Appends up to `max` chunks ready to issue to `out`, without blocking. Returns false once
  // the engine is shutting down and has nothing left in flight: the backend may stop.
  virtual bool TakeChunks(size_t max, std::vector<Chunk*>* out) = 0;
  // Blocks until a chunk is ready (for thread backends); nullptr at shutdown.
  virtual Chunk* WaitForChunk() = 0;
  // The outcome of one attempt: bytes transferred (0 at end of file) or -errno.
  virtual void Complete(Chunk* chunk, int64_t result) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Chunks the backend can have in flight at once.
  virtual size_t capacity() const = 0;
  virtual void Start(ChunkSource* source) = 0;
  // New work may be available (or shutdown began). Cheap, any thread, without the engine lock.
  virtual void Wake() = 0;
  // Returns once the backend's threads have exited (after TakeChunks returned false / nullptr).
  virtual void Join() = 0;
  // Registers `fd` as a fixed file; returns its slot, or -1 when files are not registered.
  virtual int RegisterFile(int fd) { return -1; }
  // Replaces the file in `slot` (after a fallback to buffered reads reopened it).
  virtual void UpdateFile(int slot, int fd) {}
  virtual bool buffers_registered() const { return false; }
};

// Buffers registered with io_uring are split into segments of at most this size (the kernel's
// limit per registered buffer); a chunk never crosses a segment boundary.
inline constexpr uint64_t kRegisteredSegmentBytes = 1ull << 30;

struct UringSetup {
  size_t capacity = 0;              // chunks in flight
  int max_files = 0;                // fixed-file table size
  std::vector<iovec> buffers = {};  // segments to register (may be empty)
  bool notices = true;
};

// io_uring, or an error saying why not (EPERM/ENOSYS in locked-down containers).
absl::StatusOr<std::unique_ptr<Backend>> CreateUringBackend(const UringSetup& setup);
std::unique_ptr<Backend> CreatePreadBackend(int threads);

// Prints "k3: <text>" on stderr once per process for each distinct `key`.
void NoticeOnce(const std::string& key, const std::string& text);

}  // namespace k3::io::internal
