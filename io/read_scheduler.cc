// The read engine's scheduler: which request is admitted next (priorities, queue depth,
// prefetch caps), splitting requests into chunks for the backends, the meaning of each chunk's
// outcome (done, short read, retry, error), storage-profile holds, and delivery of results.
// Everything here runs under ReadEngine::Impl::mu (io/read_engine_impl.h).
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/read_engine_impl.h"

namespace k3::io {

using internal::IsRetryable;
using internal::IsTransient;

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
// has chunks to issue (admitted, or queued with a slot free to admit it), and only a few of
// them are at the device at once. A queued read with no slot free does not hold guesses back:
// where they hold every slot (queue depth 1) only their end frees one, and waiting for it
// would deadlock both.
bool ReadEngine::Impl::MayIssue(int p) const {
  if (p != kPrefetch || options.max_prefetch_chunks <= 0) return true;
  if (device_by_priority[kPrefetch] >= options.max_prefetch_chunks) return false;
  const bool slot_free = active < max_requests;
  for (int q = 0; q < kPrefetch; ++q) {
    if (!issuing[q].empty() || (slot_free && !queued[q].empty())) return false;
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
    if (r->logged && logging) {
      log.emplace_back(r->id, LoggedRead{.file = static_cast<FileId>(r->file->index),
                                         .offset = r->spec.offset,
                                         .length = r->spec.length,
                                         .priority = r->spec.priority});
    }
  }
  if (r->admitted) {
    --active;
    --active_by_priority[r->priority()];
  }
  if (r->spec.on_complete) {
    out->push_back({std::move(result), std::move(r->spec.on_complete)});
  } else {
    done.Add(std::move(result));
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

}  // namespace k3::io
