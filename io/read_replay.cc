#include "io/read_replay.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"

namespace k3::io {
namespace {

// The replay's read router, buffers and open files: set up once, used by every replay.
class Replayer {
 public:
  static absl::StatusOr<Replayer> Create(const ReadLog& log, uint64_t max_buffer_bytes,
                                         ReplayResult* result) {
    Replayer p(log);
    for (const LoggedRead& r : log.reads) {
      if (r.file < 0 || static_cast<size_t>(r.file) >= log.paths.size()) {
        return absl::InvalidArgumentError(absl::StrCat("read log: unknown file ", r.file));
      }
      p.slot_bytes_ = std::max(p.slot_bytes_, BufferBytesFor(r.offset, r.length));
    }
    // Twice as many requests submitted as the queue depth admits, when the buffers allow: the
    // engine then issues the next one the moment one completes, as it does in a run, rather
    // than waiting for this thread to wake up and submit it. No more: every buffer is one more
    // to warm up (below), and memory the run's engine had warm long before its decode.
    const int depth = std::max(1, log.options.engine.queue_depth);
    const uint64_t fit = std::max<uint64_t>(1, max_buffer_bytes / p.slot_bytes_);
    p.slots_ = static_cast<int>(std::min<uint64_t>({fit, log.reads.size(), 2ull * depth}));
    result->concurrency = std::min(p.slots_, depth);
    auto arena = BufferArena::Create(p.slot_bytes_ * p.slots_);
    if (!arena.ok()) return arena.status();
    p.arena_ = *std::move(arena);
    ReadRouterOptions options = log.options;
    options.engine.arena = p.arena_.get();
    options.engine.faults = nullptr;
    options.engine.notices = false;    // the run has said what its reads fell back to
    options.check = CopyCheck::kSize;  // and checked its copies
    options.on_warning = [](const std::string&) {};
    auto reads = ReadRouter::Create(options);
    if (!reads.ok()) return reads.status();
    p.reads_ = *std::move(reads);
    for (size_t i = 0; i < log.paths.size(); ++i) {
      if (log.paths[i].empty()) {  // an id the run did not use
        p.ids_.push_back(-1);
        continue;
      }
      auto id = p.reads_->OpenFile(log.paths[i],
                                   i < log.stripes.size() ? log.stripes[i] : std::vector<Extent>{});
      if (!id.ok()) return id.status();
      p.ids_.push_back(*id);
    }
    return p;
  }

  // Reads the log's first `count` requests and returns the time from the first submission to
  // the last completion.
  absl::StatusOr<double> Run(size_t count) {
    count = std::min(count, log_->reads.size());
    size_t next = 0;
    auto submit = [&](int slot) -> absl::Status {
      const LoggedRead& r = log_->reads[next++];
      auto id = reads_->Submit({.file = ids_[r.file],
                                .offset = r.offset,
                                .length = r.length,
                                .buffer = arena_->Slice(slot * slot_bytes_, slot_bytes_),
                                .priority = Priority::kDemand,
                                .user_data = static_cast<uint64_t>(slot)});
      return id.status();
    };
    const auto start = std::chrono::steady_clock::now();
    for (int slot = 0; slot < slots_ && next < count; ++slot) {
      if (absl::Status s = submit(slot); !s.ok()) return s;
    }
    for (size_t done = 0; done < next;) {
      std::optional<ReadResult> r = reads_->WaitAny();
      if (!r) continue;
      if (!r->status.ok()) return r->status;
      ++done;
      if (next < count) {
        if (absl::Status s = submit(static_cast<int>(r->user_data)); !s.ok()) return s;
      }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  int slots() const { return slots_; }
  std::vector<DeviceReport> devices() const { return reads_->devices(); }

 private:
  explicit Replayer(const ReadLog& log) : log_(&log) {}

  const ReadLog* log_;
  uint64_t slot_bytes_ = 0;
  int slots_ = 0;
  std::unique_ptr<BufferArena> arena_;
  std::unique_ptr<ReadRouter> reads_;  // declared after the arena: closed before it is freed
  std::vector<FileId> ids_;
};

}  // namespace

uint64_t ReadLog::bytes() const {
  uint64_t total = 0;
  for (const LoggedRead& r : reads) total += r.length;
  return total;
}

absl::StatusOr<ReplayResult> ReplayReadLog(const ReadLog& log, uint64_t max_buffer_bytes,
                                           const ReplayAgainFn& again) {
  ReplayResult result{.bytes = log.bytes(), .reads = static_cast<int64_t>(log.reads.size())};
  if (log.reads.empty()) return result;
  auto replayer = Replayer::Create(log, max_buffer_bytes, &result);
  if (!replayer.ok()) return replayer.status();
  // The warm-up, untimed: one read into each buffer, so that none is first touched (faulted,
  // zeroed, pinned) inside a timed replay, and the backend has started whatever it starts on
  // its first reads.
  if (auto warm = replayer->Run(replayer->slots()); !warm.ok()) return warm.status();
  do {
    const std::vector<DeviceReport> before = replayer->devices();
    auto seconds = replayer->Run(log.reads.size());
    if (!seconds.ok()) return seconds.status();
    if (result.replay_seconds.empty() || *seconds < result.seconds) {
      result.seconds = *seconds;
      result.devices = DevicesSince(before, replayer->devices());
    }
    result.replay_seconds.push_back(*seconds);
  } while (again && again(result.replay_seconds));
  return result;
}

}  // namespace k3::io
