// The scheduler behind ReadEngine: queues per priority, admission up to the queue depth,
// splitting into chunks, the meaning of each chunk's outcome (done, short read, retry, error),
// storage-profile holds, and delivery of results. One mutex guards all of it; the backends only
// move chunks between this scheduler and the kernel.
#include "io/read_engine.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "io/engine_internal.h"
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
  std::vector<std::unique_ptr<Chunk>> chunks;

  bool fully_issued() const { return next_issue >= extent.aligned_length; }
  bool stopped() const { return cancelled || !error.ok(); }
  int priority() const { return static_cast<int>(spec.priority); }
};

}  // namespace internal

namespace {

using internal::Chunk;
using internal::FileState;
using internal::RequestState;

constexpr int kMaxTransientRetries = 100;  // EINTR/EAGAIN in a row on one chunk
constexpr int kMaxStalls = 8;              // short reads that made no aligned progress
constexpr int kPrefetch = static_cast<int>(Priority::kPrefetch);
constexpr int kMaxPreadThreads = 64;
constexpr size_t kMaxRingChunks = 4096;

bool IsTransient(int err) { return err == EINTR || err == EAGAIN; }

// Errors worth another attempt after a pause: a flaky medium or link, memory pressure.
bool IsRetryable(int err) {
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

absl::StatusOr<Backend> BackendFromEnvironment(Backend requested) {
  if (requested != Backend::kAuto) return requested;
  const char* env = std::getenv("K3_IO_BACKEND");
  const std::string value = env == nullptr ? "" : env;
  if (value.empty() || value == "auto") return Backend::kAuto;
  if (value == "pread") return Backend::kPread;
  if (value == "uring" || value == "io_uring") return Backend::kUring;
  return absl::InvalidArgumentError(
      absl::StrCat("K3_IO_BACKEND='", value, "': expected auto, uring or pread"));
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

}  // namespace

namespace internal {

void NoticeOnce(const std::string& key, const std::string& text) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* seen = new std::vector<std::string>();
  AnnotatedMutexLock lock(&mu);
  if (std::find(seen->begin(), seen->end(), key) != seen->end()) return;
  seen->push_back(key);
  std::fprintf(stderr, "k3: %s\n", text.c_str());
}

}  // namespace internal

const char* PriorityName(Priority p) {
  switch (p) {
    case Priority::kDemand:
      return "demand";
    case Priority::kTrunk:
      return "trunk";
    case Priority::kPrefetch:
      return "prefetch";
  }
  return "?";
}

struct ReadEngine::Impl : public internal::ChunkSource {
  explicit Impl(const EngineOptions& o) : options(o) {}
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

  const EngineOptions options;
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
  absl::flat_hash_map<ReadId, ReadResult> done ABSL_GUARDED_BY(mu);
  std::deque<ReadId> done_order ABSL_GUARDED_BY(mu);
  ReadId next_id ABSL_GUARDED_BY(mu) = 1;
  size_t backend_in_flight ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool timer_stop ABSL_GUARDED_BY(mu) = false;
  std::optional<StorageEmulator> emulator ABSL_GUARDED_BY(mu);
  EngineStats stats ABSL_GUARDED_BY(mu);
};

// ---------------------------------------------------------------------------------------------
// Setup and shutdown.

absl::Status ReadEngine::Impl::Start() {
  auto which = BackendFromEnvironment(options.backend);
  if (!which.ok()) return which.status();
  max_requests = options.queue_depth;
  if (options.profile.max_in_flight > 0) {
    max_requests = std::min(max_requests, options.profile.max_in_flight);
  }
  max_prefetch = options.max_prefetch_in_flight > 0 ? options.max_prefetch_in_flight
                                                    : std::max(1, max_requests / 2);
  if (options.profile.emulated()) emulator.emplace(options.profile);
  const size_t chunks = std::min<size_t>(
      kMaxRingChunks, static_cast<size_t>(max_requests) * options.chunks_per_request);
  if (absl::Status s = CreateBackend(*which, chunks); !s.ok()) return s;
  if (backend->buffers_registered()) {
    registered_base = options.arena->data();
    registered_size = options.arena->size();
  }
  timer = std::thread([this] { TimerLoop(); });
  backend->Start(this);
  if (options.faults != nullptr) {
    release_listener = options.faults->AddReleaseListener([this] { ReleaseHeld(); });
  }
  return absl::OkStatus();
}

// io_uring unless told otherwise; pread threads when it is refused (unless io_uring was asked
// for by name, which makes that an error).
absl::Status ReadEngine::Impl::CreateBackend(Backend which, size_t chunks) {
  if (which != Backend::kPread) {
    internal::UringSetup setup{.capacity = chunks, .max_files = 1024, .notices = options.notices};
    const BufferArena* arena = options.arena;
    for (size_t off = 0; arena != nullptr && off < arena->size();
         off += internal::kRegisteredSegmentBytes) {
      setup.buffers.push_back(
          {arena->data() + off,
           std::min<size_t>(internal::kRegisteredSegmentBytes, arena->size() - off)});
    }
    auto uring = internal::CreateUringBackend(setup);
    if (uring.ok()) {
      backend = *std::move(uring);
      return absl::OkStatus();
    }
    if (which == Backend::kUring) return uring.status();
    if (options.notices) {
      internal::NoticeOnce("no-io_uring", absl::StrCat("io_uring is not available (",
                                                       std::string(uring.status().message()),
                                                       "); reading with a pool of pread threads"));
    }
  }
  const int threads = options.pread_threads > 0
                          ? options.pread_threads
                          : static_cast<int>(std::min<size_t>(chunks, kMaxPreadThreads));
  backend = internal::CreatePreadBackend(threads);
  return absl::OkStatus();
}

void ReadEngine::Impl::Shutdown() {
  if (backend == nullptr) return;  // Start() failed before anything ran
  // Before taking `mu`: the plan calls its listeners under its own lock, and they take `mu`.
  if (release_listener >= 0) options.faults->RemoveReleaseListener(release_listener);
  std::vector<Finished> out;
  {
    AnnotatedMutexLock lock(&mu);
    stopping = true;
    // With the listener gone no Release() can reach them, and a shutdown must not wait for one.
    LetHeldGo();
    std::vector<RequestState*> all;
    for (auto& [id, r] : live) all.push_back(r.get());
    for (RequestState* r : all) CancelLocked(r, &out);
    for (Finished& f : out) deferred.push_back(std::move(f));
    ++timed_generation;
  }
  backend->Wake();
  {
    AnnotatedMutexLock lock(&mu);
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return live.empty() && deferred.empty();
    };
    Await(mu, absl::Condition(&drained));
    timer_stop = true;
  }
  if (timer.joinable()) timer.join();
  backend->Wake();
  backend->Join();
  AnnotatedMutexLock lock(&mu);
  for (auto& f : files) {
    ::close(f->fd);
    for (int fd : f->retired_fds) ::close(fd);
  }
}

// ---------------------------------------------------------------------------------------------
// Caller side.

absl::StatusOr<FileId> ReadEngine::Impl::OpenFile(const std::string& path) {
  bool direct = options.direct;
  int fd = -1;
  if (direct) {
    const bool refused = options.faults != nullptr && options.faults->refuses_direct();
    fd = refused ? -1 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    const int err = refused ? EINVAL : errno;
    if (fd < 0 && err != EINVAL) return absl::ErrnoToStatus(err, absl::StrCat("opening ", path));
    if (fd < 0) {
      direct = false;
      if (options.notices) {
        internal::NoticeOnce("no-o_direct:" + path,
                             absl::StrCat(path,
                                          ": the file system refuses O_DIRECT; reading "
                                          "through the page cache"));
      }
    }
  }
  if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("opening ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a readable file"));
  }
  auto f = std::make_unique<FileState>();
  f->path = path;
  f->fd = fd;
  f->direct = direct;
  f->size = static_cast<uint64_t>(st.st_size);
  AnnotatedMutexLock lock(&mu);
  f->slot = backend->RegisterFile(fd);
  files.push_back(std::move(f));
  return static_cast<FileId>(files.size() - 1);
}

namespace {

absl::Status CheckBuffer(const ReadRequest& request, const AlignedExtent& extent) {
  if (reinterpret_cast<uintptr_t>(request.buffer.data()) % kDirectAlignment != 0) {
    return absl::InvalidArgumentError("read buffer is not 4 KiB-aligned");
  }
  if (request.buffer.size() < extent.aligned_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "read buffer of ", request.buffer.size(), " bytes is too small: ", request.length,
        " bytes at offset ", request.offset, " need ", extent.aligned_length));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReadId> ReadEngine::Impl::Submit(ReadRequest request) {
  const AlignedExtent extent = ExtentFor(request.offset, request.length);
  if (absl::Status s = CheckBuffer(request, extent); !s.ok()) return s;
  std::vector<Finished> out;
  ReadId id;
  {
    AnnotatedMutexLock lock(&mu);
    if (request.file < 0 || static_cast<size_t>(request.file) >= files.size()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown file id ", request.file));
    }
    FileState* f = files[request.file].get();
    if (request.offset + request.length > f->size) {
      return absl::OutOfRangeError(absl::StrCat("reading ", request.length, " bytes at offset ",
                                                request.offset, " of ", f->path, ": past its end (",
                                                f->size, " bytes)"));
    }
    if (stopping) return absl::FailedPreconditionError("the read engine is shutting down");
    auto r = std::make_unique<RequestState>();
    id = r->id = next_id++;
    r->file = f;
    r->extent = extent;
    r->needed = extent.head + request.length;
    r->submitted = absl::Now();
    r->spec = std::move(request);
    RequestState* raw = r.get();
    live.emplace(id, std::move(r));
    if (raw->spec.length == 0) {  // nothing to read; a callback still runs on an engine thread
      Finish(raw, &out);
      for (Finished& fin : out) deferred.push_back(std::move(fin));
      ++timed_generation;
    } else {
      queued[raw->priority()].push_back(raw);
    }
  }
  backend->Wake();
  return id;
}

ReadResult ReadEngine::Impl::Wait(ReadId id) {
  AnnotatedMutexLock lock(&mu);
  auto it = live.find(id);
  if (it != live.end() && it->second->spec.on_complete) {
    return {.id = id, .status = absl::InvalidArgumentError("this read delivers to a callback")};
  }
  auto ready = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return done.contains(id) || !live.contains(id);
  };
  Await(mu, absl::Condition(&ready));
  auto d = done.find(id);
  if (d == done.end()) {
    return {.id = id,
            .status = absl::NotFoundError(absl::StrCat("no unclaimed read with id ", id))};
  }
  ReadResult result = std::move(d->second);
  done.erase(d);
  return result;
}

std::optional<ReadResult> ReadEngine::Impl::ClaimOldest() {
  while (!done_order.empty()) {
    const ReadId id = done_order.front();
    done_order.pop_front();
    auto d = done.find(id);
    if (d == done.end()) continue;  // claimed by Wait()
    ReadResult result = std::move(d->second);
    done.erase(d);
    return result;
  }
  return std::nullopt;
}

std::optional<ReadResult> ReadEngine::Impl::WaitAny(absl::Duration timeout) {
  AnnotatedMutexLock lock(&mu);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !done.empty(); };
  AwaitWithTimeout(mu, absl::Condition(&ready), timeout);
  return ClaimOldest();
}

bool ReadEngine::Impl::Cancel(ReadId id) {
  {
    AnnotatedMutexLock lock(&mu);
    auto it = live.find(id);
    if (it == live.end()) return false;
    std::vector<Finished> out;
    CancelLocked(it->second.get(), &out);
    for (Finished& f : out) deferred.push_back(std::move(f));
    ++timed_generation;
  }
  backend->Wake();
  return true;
}

int ReadEngine::Impl::CancelPrefetches(const std::function<bool(uint64_t)>& filter) {
  int count = 0;
  {
    AnnotatedMutexLock lock(&mu);
    std::vector<RequestState*> victims;
    for (auto& [id, r] : live) {
      if (r->priority() == kPrefetch && !r->cancelled && (!filter || filter(r->spec.user_data))) {
        victims.push_back(r.get());
      }
    }
    std::vector<Finished> out;
    for (RequestState* r : victims) CancelLocked(r, &out);
    for (Finished& f : out) deferred.push_back(std::move(f));
    ++timed_generation;
    count = static_cast<int>(victims.size());
  }
  backend->Wake();
  return count;
}

void ReadEngine::Impl::CancelLocked(RequestState* r, std::vector<Finished>* out) {
  if (r->cancelled) return;
  r->cancelled = true;
  if (!r->admitted) {
    auto& q = queued[r->priority()];
    q.erase(std::find(q.begin(), q.end(), r));
    Finish(r, out);
    return;
  }
  Stop(r, out);
}

// ---------------------------------------------------------------------------------------------
// Backend side: handing out chunks.

int ReadEngine::Impl::AdmissiblePriority() const {
  if (active >= max_requests) return -1;
  for (int p = 0; p < kNumPriorities; ++p) {
    if (queued[p].empty()) continue;
    if (p == kPrefetch && active_by_priority[p] >= max_prefetch) continue;
    return p;
  }
  return -1;
}

// New chunks of priority `p` may go to the device. Guesses wait while a demand or trunk read
// has chunks to issue (queued or admitted), and only a few of them are at the device at once.
bool ReadEngine::Impl::MayIssue(int p) const {
  if (p != kPrefetch || options.max_prefetch_chunks <= 0) return true;
  if (device_by_priority[kPrefetch] >= options.max_prefetch_chunks) return false;
  for (int q = 0; q < kPrefetch; ++q) {
    if (!queued[q].empty() || !issuing[q].empty()) return false;
  }
  return true;
}

bool ReadEngine::Impl::CanIssue() const {
  if (!retry_ready.empty() || AdmissiblePriority() >= 0) return true;
  for (int p = 0; p < kNumPriorities; ++p) {
    if (!MayIssue(p)) continue;
    for (const RequestState* r : issuing[p]) {
      if (r->outstanding < options.chunks_per_request) return true;
    }
  }
  return false;
}

// Retries first (they hold a request back), then new chunks of admitted requests in priority
// order, admitting queued requests as slots free up: a demand read queued behind prefetches is
// admitted first and its chunks go out ahead of theirs.
Chunk* ReadEngine::Impl::NextChunk() {
  if (!retry_ready.empty()) {
    Chunk* c = retry_ready.front();
    retry_ready.pop_front();
    return Issue(c);
  }
  for (int p = AdmissiblePriority(); p >= 0; p = AdmissiblePriority()) {
    RequestState* r = queued[p].front();
    queued[p].pop_front();
    r->admitted = true;
    ++active;
    ++active_by_priority[p];
    issuing[p].push_back(r);
    stats.peak_requests_in_flight = std::max(stats.peak_requests_in_flight, active);
  }
  for (int p = 0; p < kNumPriorities; ++p) {
    if (!MayIssue(p)) continue;
    auto& list = issuing[p];
    for (auto it = list.begin(); it != list.end(); ++it) {
      RequestState* r = *it;
      if (r->outstanding >= options.chunks_per_request) continue;
      Chunk* c = NewChunk(r);
      if (r->fully_issued()) list.erase(it);
      return Issue(c);
    }
  }
  return nullptr;
}

Chunk* ReadEngine::Impl::NewChunk(RequestState* r) {
  auto c = std::make_unique<Chunk>();
  c->request = r;
  c->begin = r->next_issue;
  c->end = std::min(c->begin + options.chunk_bytes, r->extent.aligned_length);
  const uint8_t* start = r->spec.buffer.data() + c->begin;
  if (registered_base != nullptr && start >= registered_base &&
      start < registered_base + registered_size) {
    // A fixed read must stay inside one registered segment.
    const uint64_t pos = static_cast<uint64_t>(start - registered_base);
    const uint64_t segment_end =
        (pos / internal::kRegisteredSegmentBytes + 1) * internal::kRegisteredSegmentBytes;
    c->end = std::min(c->end, c->begin + (segment_end - pos));
  }
  r->next_issue = c->end;
  ++r->outstanding;
  r->chunks.push_back(std::move(c));
  return r->chunks.back().get();
}

Chunk* ReadEngine::Impl::Issue(Chunk* c) {
  RequestState* r = c->request;
  c->fd = r->file->fd;
  c->file_slot = r->file->slot;
  c->dest = r->spec.buffer.data() + c->begin + c->done;
  c->file_offset = r->extent.aligned_offset + c->begin + c->done;
  c->length = static_cast<uint32_t>(c->end - c->begin - c->done);
  c->buf_index = -1;
  if (registered_base != nullptr && c->dest >= registered_base &&
      c->dest + c->length <= registered_base + registered_size) {
    c->buf_index =
        static_cast<int>((c->dest - registered_base) / internal::kRegisteredSegmentBytes);
  }
  c->issued = absl::Now();
  c->not_before = emulator ? emulator->Schedule(c->issued, c->length) : absl::InfinitePast();
  ++backend_in_flight;
  ++device_by_priority[r->priority()];
  ++stats.operations;
  stats.peak_operations_in_flight =
      std::max(stats.peak_operations_in_flight, static_cast<int>(backend_in_flight));
  return c;
}

bool ReadEngine::Impl::TakeChunks(size_t max, std::vector<Chunk*>* out) {
  AnnotatedMutexLock lock(&mu);
  while (out->size() < max) {
    Chunk* c = NextChunk();
    if (c == nullptr) break;
    out->push_back(c);
  }
  return !(stopping && live.empty());
}

Chunk* ReadEngine::Impl::WaitForChunk() {
  AnnotatedMutexLock lock(&mu);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return CanIssue() || (stopping && live.empty());
  };
  for (;;) {
    Await(mu, absl::Condition(&ready));
    if (Chunk* c = NextChunk()) return c;
    if (stopping && live.empty()) return nullptr;
  }
}

// ---------------------------------------------------------------------------------------------
// Backend side: outcomes.

void ReadEngine::Impl::Complete(Chunk* c, int64_t result) {
  absl::Duration delay = absl::ZeroDuration();
  bool hold = false;
  if (options.faults != nullptr) {
    auto outcome = options.faults->Apply(c->request->file->path, c->file_offset, c->length, result);
    result = outcome.result;
    delay = outcome.delay;
    hold = outcome.held;
  }
  std::vector<Finished> out;
  {
    AnnotatedMutexLock lock(&mu);
    --backend_in_flight;
    const absl::Time release = std::max(c->not_before, c->issued + delay);
    // A Release() since Apply() said to hold has come and gone: parked now, this one would
    // stay held for good.
    if (hold && !stopping && !holds_released) {
      held.push_back({release, c, result, true});
    } else if (!stopping && release > absl::Now()) {
      PushTimed({release, c, result, true});  // the emulated volume is not done yet
    } else {
      HandleResult(c, result, &out);
    }
  }
  Deliver(out);
}

void ReadEngine::Impl::HandleResult(Chunk* c, int64_t result, std::vector<Finished>* out) {
  RequestState* r = c->request;
  --device_by_priority[r->priority()];  // after an emulated volume's hold, not before
  if (result > 0) stats.bytes_read += static_cast<uint64_t>(result);
  if (r->stopped()) return Retire(c, out);
  if (result < 0) return HandleError(c, static_cast<int>(-result), out);
  if (result == 0) {
    Fail(r, EndOfFile(*c, c->file_offset), out);
    return Retire(c, out);
  }
  c->done += static_cast<uint64_t>(result);
  c->error_retries = 0;  // the retry budget is for failures in a row: this attempt made progress
  if (c->begin + c->done >= std::min(c->end, r->needed)) return Retire(c, out);
  HandleShortRead(c, out);
}

// A short read that does not reach the bytes we need: read the rest. O_DIRECT cannot start at
// an unaligned offset, so resume from the block boundary below (re-reading a few bytes into
// the same place).
void ReadEngine::Impl::HandleShortRead(Chunk* c, std::vector<Finished>* out) {
  RequestState* r = c->request;
  ++stats.short_reads;
  ++r->retries;
  // At the end of the file a direct read stops mid-block, and the next one would return the
  // same few bytes again rather than 0: ask the file where it ends.
  struct stat st;
  const uint64_t reached = r->extent.aligned_offset + c->begin + c->done;
  if (::fstat(c->fd, &st) == 0 && static_cast<uint64_t>(st.st_size) <= reached) {
    Fail(r, EndOfFile(*c, reached), out);
    return Retire(c, out);
  }
  if (r->file->direct) {
    const uint64_t attempt_start = c->file_offset - r->extent.aligned_offset;
    const uint64_t resume = AlignDown(c->begin + c->done);
    if (resume <= attempt_start && ++c->stalls > kMaxStalls) {
      Fail(
          r,
          absl::DataLossError(absl::StrCat("reading ", r->file->path, " at offset ", c->file_offset,
                                           ": short reads below the block size make no progress")),
          out);
      return Retire(c, out);
    }
    c->done = resume - c->begin;
  }
  Requeue(c, absl::Now());
}

void ReadEngine::Impl::HandleError(Chunk* c, int err, std::vector<Finished>* out) {
  RequestState* r = c->request;
  if (IsTransient(err) && c->transient_retries < kMaxTransientRetries) {
    ++c->transient_retries;
    ++stats.transient_retries;
    ++r->retries;
    return Requeue(c, absl::Now());
  }
  // Some file systems accept O_DIRECT at open and refuse it per read.
  if (err == EINVAL && r->file->direct && SwitchToBuffered(r->file)) {
    return Requeue(c, absl::Now());
  }
  if (IsRetryable(err) && c->error_retries < options.max_retries) {
    const absl::Duration backoff = options.retry_backoff * (1 << c->error_retries);
    ++c->error_retries;
    ++stats.error_retries;
    ++r->retries;
    return Requeue(c, absl::Now() + backoff);
  }
  std::string what =
      absl::StrCat("reading ", r->file->path, " at offset ", c->file_offset, " (", c->length,
                   " bytes, part of ", r->spec.length, " bytes at offset ", r->spec.offset, ")");
  if (c->error_retries > 0) absl::StrAppend(&what, " after ", c->error_retries, " retries");
  Fail(r, absl::ErrnoToStatus(err, what), out);
  Retire(c, out);
}

absl::Status ReadEngine::Impl::EndOfFile(const Chunk& c, uint64_t at) const {
  const RequestState& r = *c.request;
  struct stat st;
  const int64_t now_size = ::fstat(c.fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
  return absl::DataLossError(absl::StrCat(r.file->path, ": unexpected end of file at offset ", at,
                                          " reading ", r.spec.length, " bytes at offset ",
                                          r.spec.offset, " (the file is ", now_size, " bytes now, ",
                                          r.file->size, " when opened: truncated?)"));
}

bool ReadEngine::Impl::SwitchToBuffered(FileState* f) {
  const int fd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  f->retired_fds.push_back(f->fd);
  f->fd = fd;
  f->direct = false;
  if (f->slot >= 0) backend->UpdateFile(f->slot, fd);
  if (options.notices) {
    internal::NoticeOnce("no-o_direct:" + f->path,
                         absl::StrCat(f->path,
                                      ": the file system refuses O_DIRECT reads; reading "
                                      "through the page cache"));
  }
  return true;
}

void ReadEngine::Impl::Requeue(Chunk* c, absl::Time when) {
  if (when <= absl::Now()) {
    retry_ready.push_back(c);
  } else {
    PushTimed({when, c, 0, false});
  }
}

void ReadEngine::Impl::PushTimed(const Timed& t) {
  timed.push_back(t);
  std::push_heap(timed.begin(), timed.end(), std::greater<>());
  ++timed_generation;
}

void ReadEngine::Impl::Fail(RequestState* r, absl::Status status, std::vector<Finished>* out) {
  if (r->error.ok()) r->error = std::move(status);
  Stop(r, out);
}

// No more chunks for `r`: take it off the issue list, drop its pending retries, and finish it
// once the chunks still in flight have landed.
void ReadEngine::Impl::Stop(RequestState* r, std::vector<Finished>* out) {
  auto& list = issuing[r->priority()];
  list.erase(std::remove(list.begin(), list.end(), r), list.end());
  auto mine = std::remove_if(retry_ready.begin(), retry_ready.end(),
                             [r](Chunk* c) { return c->request == r; });
  r->outstanding -= static_cast<int>(retry_ready.end() - mine);
  retry_ready.erase(mine, retry_ready.end());
  MaybeFinish(r, out);
}

void ReadEngine::Impl::Retire(Chunk* c, std::vector<Finished>* out) {
  --c->request->outstanding;
  MaybeFinish(c->request, out);
}

void ReadEngine::Impl::MaybeFinish(RequestState* r, std::vector<Finished>* out) {
  if (r->outstanding == 0 && (r->fully_issued() || r->stopped())) Finish(r, out);
}

void ReadEngine::Impl::Finish(RequestState* r, std::vector<Finished>* out) {
  ReadResult result{.id = r->id,
                    .user_data = r->spec.user_data,
                    .priority = r->spec.priority,
                    .latency = absl::Now() - r->submitted,
                    .retries = r->retries};
  if (r->cancelled) {
    result.status =
        absl::CancelledError(absl::StrCat("read of ", r->spec.length, " bytes at offset ",
                                          r->spec.offset, " of ", r->file->path, " cancelled"));
    ++stats.cancelled;
  } else if (!r->error.ok()) {
    result.status = r->error;
    ++stats.failed;
  } else {
    result.data = r->spec.buffer.subspan(r->extent.head, r->spec.length);
    ++stats.completed;
    stats.bytes_delivered += r->spec.length;
  }
  if (r->admitted) {
    --active;
    --active_by_priority[r->priority()];
  }
  if (r->spec.on_complete) {
    out->push_back({std::move(result), std::move(r->spec.on_complete)});
  } else {
    done_order.push_back(r->id);
    done.emplace(r->id, std::move(result));
  }
  live.erase(r->id);
}

void ReadEngine::Impl::Deliver(std::vector<Finished>& finished) {
  for (Finished& f : finished) f.callback(std::move(f.result));
  finished.clear();
}

// Releases held completions (storage profiles, slow-read faults) and delayed retries when their
// time comes, and runs callbacks of cancelled requests, so that Cancel() never calls back into
// its caller.
void ReadEngine::Impl::TimerLoop() {
  // Emulated latencies are a few hundred microseconds to milliseconds: the default 50 us timer
  // slack would add to every one of them.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  AnnotatedMutexLock lock(&mu);
  for (;;) {
    std::vector<Finished> out;
    bool released = false;
    const absl::Time now = absl::Now();
    while (!timed.empty() && (stopping || timed.front().when <= now)) {
      std::pop_heap(timed.begin(), timed.end(), std::greater<>());
      const Timed t = timed.back();
      timed.pop_back();
      released = true;
      if (t.is_result) {
        HandleResult(t.chunk, t.result, &out);
      } else if (t.chunk->request->stopped()) {
        Retire(t.chunk, &out);
      } else {
        retry_ready.push_back(t.chunk);
      }
    }
    for (Finished& f : deferred) out.push_back(std::move(f));
    deferred.clear();
    if (released || !out.empty()) {
      TsanReleasing(&mu);
      mu.Unlock();
      Deliver(out);
      backend->Wake();
      mu.Lock();
      TsanAcquired(&mu);
      continue;
    }
    if (timer_stop && timed.empty()) return;
    const uint64_t generation = timed_generation;
    auto changed = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return timed_generation != generation || timer_stop;
    };
    if (timed.empty()) {
      Await(mu, absl::Condition(&changed));
    } else {
      AwaitWithDeadline(mu, absl::Condition(&changed), timed.front().when);
    }
  }
}

// The fault plan's Release(), on the caller's thread.
void ReadEngine::Impl::ReleaseHeld() {
  AnnotatedMutexLock lock(&mu);
  holds_released = true;
  LetHeldGo();
}

// The timer thread completes what was held, as it does a profile's holds (at once when their
// time has passed), so that callbacks still run on an engine thread.
void ReadEngine::Impl::LetHeldGo() {
  for (const Timed& t : held) PushTimed(t);
  held.clear();
}

// ---------------------------------------------------------------------------------------------
// ReadEngine.

ReadEngine::ReadEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ReadEngine::~ReadEngine() = default;

absl::StatusOr<std::unique_ptr<ReadEngine>> ReadEngine::Create(const EngineOptions& options) {
  if (options.queue_depth < 1) return absl::InvalidArgumentError("queue depth must be at least 1");
  if (options.chunk_bytes < kDirectAlignment || options.chunk_bytes % kDirectAlignment != 0 ||
      options.chunk_bytes > (1u << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk size ", options.chunk_bytes,
                                                   " must be a multiple of 4096 up to 1 GiB"));
  }
  if (options.chunks_per_request < 1) {
    return absl::InvalidArgumentError("chunks per request must be at least 1");
  }
  auto impl = std::make_unique<Impl>(options);
  absl::Status s = impl->Start();
  if (!s.ok()) return s;
  return std::unique_ptr<ReadEngine>(new ReadEngine(std::move(impl)));
}

absl::StatusOr<FileId> ReadEngine::OpenFile(const std::string& path) {
  return impl_->OpenFile(path);
}

FileInfo ReadEngine::file(FileId id) const {
  AnnotatedMutexLock lock(&impl_->mu);
  if (id < 0 || static_cast<size_t>(id) >= impl_->files.size()) return {};
  const FileState& f = *impl_->files[id];
  return {.path = f.path, .size = f.size, .direct = f.direct, .registered = f.slot >= 0};
}

absl::StatusOr<ReadId> ReadEngine::Submit(ReadRequest request) {
  return impl_->Submit(std::move(request));
}

absl::StatusOr<std::span<uint8_t>> ReadEngine::Read(ReadRequest request) {
  if (request.on_complete) return absl::InvalidArgumentError("Read() takes no callback");
  auto id = Submit(std::move(request));
  if (!id.ok()) return id.status();
  ReadResult r = Wait(*id);
  if (!r.status.ok()) return r.status;
  return r.data;
}

ReadResult ReadEngine::Wait(ReadId id) { return impl_->Wait(id); }

std::optional<ReadResult> ReadEngine::Poll() {
  AnnotatedMutexLock lock(&impl_->mu);
  return impl_->ClaimOldest();
}

std::optional<ReadResult> ReadEngine::WaitAny(absl::Duration timeout) {
  return impl_->WaitAny(timeout);
}

bool ReadEngine::Cancel(ReadId id) { return impl_->Cancel(id); }

int ReadEngine::CancelPrefetches(std::function<bool(uint64_t user_data)> filter) {
  return impl_->CancelPrefetches(filter);
}

std::string_view ReadEngine::backend_name() const { return impl_->backend->name(); }
bool ReadEngine::buffers_registered() const { return impl_->registered_base != nullptr; }
const EngineOptions& ReadEngine::options() const { return impl_->options; }

EngineStats ReadEngine::stats() const {
  AnnotatedMutexLock lock(&impl_->mu);
  return impl_->stats;
}

}  // namespace k3::io
