#include "io/read_replay.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"

namespace k3::io {

uint64_t ReadLog::bytes() const {
  uint64_t total = 0;
  for (const LoggedRead& r : reads) total += r.length;
  return total;
}

absl::StatusOr<ReplayResult> ReplayReadLog(const ReadLog& log, uint64_t max_buffer_bytes) {
  ReplayResult result{.bytes = log.bytes(), .reads = static_cast<int64_t>(log.reads.size())};
  if (log.reads.empty()) return result;
  uint64_t slot_bytes = 0;
  for (const LoggedRead& r : log.reads) {
    if (r.file < 0 || static_cast<size_t>(r.file) >= log.paths.size()) {
      return absl::InvalidArgumentError(absl::StrCat("read log: unknown file ", r.file));
    }
    slot_bytes = std::max(slot_bytes, BufferBytesFor(r.offset, r.length));
  }
  // More requests submitted than the queue depth admits, when the buffers allow: the engine then
  // issues the next one the moment one completes, as it does in a run, rather than waiting for
  // this thread to wake up and submit it.
  const uint64_t fit = std::max<uint64_t>(1, max_buffer_bytes / slot_bytes);
  const int slots = static_cast<int>(std::min<uint64_t>(fit, log.reads.size()));
  result.concurrency = std::min(slots, std::max(1, log.options.engine.queue_depth));
  auto arena = BufferArena::Create(slot_bytes * slots);
  if (!arena.ok()) return arena.status();
  ReadRouterOptions options = log.options;
  options.engine.arena = arena->get();
  options.engine.faults = nullptr;
  options.engine.notices = false;    // the run has said what its reads fell back to
  options.check = CopyCheck::kSize;  // and checked its copies
  options.on_warning = [](const std::string&) {};
  auto engine = ReadRouter::Create(options);
  if (!engine.ok()) return engine.status();
  std::vector<FileId> ids;
  for (size_t i = 0; i < log.paths.size(); ++i) {
    const std::string& path = log.paths[i];
    if (path.empty()) {  // an id the run did not use
      ids.push_back(-1);
      continue;
    }
    auto id =
        (*engine)->OpenFile(path, i < log.stripes.size() ? log.stripes[i] : std::vector<Extent>{});
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  size_t next = 0;
  auto submit = [&](int slot) -> absl::Status {
    const LoggedRead& r = log.reads[next++];
    auto id = (*engine)->Submit({.file = ids[r.file],
                                 .offset = r.offset,
                                 .length = r.length,
                                 .buffer = (*arena)->Slice(slot * slot_bytes, slot_bytes),
                                 .priority = Priority::kDemand,
                                 .user_data = static_cast<uint64_t>(slot)});
    return id.status();
  };
  const auto start = std::chrono::steady_clock::now();
  for (int slot = 0; slot < slots; ++slot) {
    if (absl::Status s = submit(slot); !s.ok()) return s;
  }
  for (size_t done = 0; done < log.reads.size();) {
    std::optional<ReadResult> r = (*engine)->WaitAny();
    if (!r) continue;
    if (!r->status.ok()) return r->status;
    ++done;
    if (next < log.reads.size()) {
      if (absl::Status s = submit(static_cast<int>(r->user_data)); !s.ok()) return s;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace k3::io
