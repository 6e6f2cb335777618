// The read engine's caller side: setup and shutdown, opening files, submitting, waiting and
// cancelling, and the public ReadEngine. The scheduler behind it (admission, chunks, outcomes,
// delivery) is io/read_scheduler.cc; one mutex guards all of it, and the backends only move
// chunks between the scheduler and the kernel.
#include "io/read_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "io/read_engine_impl.h"

namespace k3::io {
namespace {

constexpr int kMaxPreadThreads = 64;
constexpr size_t kMaxRingChunks = 4096;

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
        // Once per directory: a model's shards share their file system, and 60 lines of the
        // same notice would bury the plan.
        const size_t slash = path.rfind('/');
        const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
        internal::NoticeOnce("no-o_direct:" + dir,
                             absl::StrCat(path,
                                          ": the file system refuses O_DIRECT; reading "
                                          "through the page cache (said once for ",
                                          dir, ")"));
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
  f->index = static_cast<int>(files.size());
  files.push_back(std::move(f));
  return static_cast<FileId>(files.size() - 1);
}

absl::StatusOr<ReadId> ReadEngine::Impl::Submit(ReadRequest request) {
  const AlignedExtent extent = ExtentFor(request.offset, request.length);
  if (absl::Status s = internal::CheckReadBuffer(request); !s.ok()) return s;
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
    r->logged = logging;
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
  if (auto result = done.Claim(id)) return *std::move(result);
  return {.id = id, .status = absl::NotFoundError(absl::StrCat("no unclaimed read with id ", id))};
}

std::optional<ReadResult> ReadEngine::Impl::ClaimOldest() { return done.ClaimOldest(); }

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
// ReadEngine.

ReadEngine::ReadEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ReadEngine::~ReadEngine() = default;

absl::StatusOr<std::unique_ptr<ReadEngine>> ReadEngine::Create(const ReadEngineOptions& options) {
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
const ReadEngineOptions& ReadEngine::options() const { return impl_->options; }

void ReadEngine::StartLog() {
  AnnotatedMutexLock lock(&impl_->mu);
  impl_->logging = true;
  impl_->log.clear();
}

std::vector<LoggedRead> ReadEngine::TakeLog() {
  AnnotatedMutexLock lock(&impl_->mu);
  impl_->logging = false;
  return internal::InRequestOrder(std::exchange(impl_->log, {}));
}

ReadStats ReadEngine::stats() const {
  AnnotatedMutexLock lock(&impl_->mu);
  return impl_->stats;
}

}  // namespace k3::io
