#include "apps/reports/disk_rate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "io/read_engine.h"

namespace k3::cli {
namespace {

// Keeps reads of `length` bytes at random offsets of the file in flight until the time is up;
// returns the bytes read and sets the time taken.
absl::StatusOr<uint64_t> KeepReading(io::Reads& reads, io::FileId file, uint64_t size,
                                     uint64_t length, const io::BufferArena& arena,
                                     double& seconds) {
  std::mt19937_64 rng(7);
  const uint64_t span = size - length;
  auto submit = [&](int slot) {
    const uint64_t offset = io::AlignDown(span == 0 ? 0 : rng() % span);
    return reads.Submit({.file = file,
                         .offset = offset,
                         .length = length,
                         .buffer = arena.Slice(slot * length, length),
                         .user_data = static_cast<uint64_t>(slot)});
  };
  for (int slot = 0; slot < kReadsInFlight; ++slot) {
    if (auto id = submit(slot); !id.ok()) return id.status();
  }
  const auto start = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  for (int outstanding = kReadsInFlight; outstanding > 0; --outstanding) {
    std::optional<io::ReadResult> r = reads.WaitAny();
    if (!r.has_value()) return absl::InternalError("the read engine lost a read");
    if (!r->status.ok()) return r->status;
    bytes += r->data.size();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds >= kMeasureSeconds) continue;
    if (auto id = submit(static_cast<int>(r->user_data)); !id.ok()) return id.status();
    ++outstanding;
  }
  return bytes;
}

}  // namespace

std::string LargestShard(const Checkpoint& ckpt) {
  std::string best;
  uint64_t best_size = 0;
  for (const std::string& p : ckpt.shard_paths()) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(p, ec);
    if (!ec && size >= best_size) best = p, best_size = size;
  }
  return best;
}

absl::StatusOr<ReadRate> MeasureReads(const std::string& path, const io::StorageProfile& profile) {
  // Declared first so that it outlives the engine, whose destructor waits for reads in flight.
  std::unique_ptr<io::BufferArena> arena;
  io::ReadEngineOptions o;
  o.queue_depth = kReadsInFlight;
  o.notices = false;
  o.profile = profile;
  auto engine = io::ReadEngine::Create(o);
  if (!engine.ok()) return engine.status();
  auto file = (*engine)->OpenFile(path);
  if (!file.ok()) return file.status();
  const io::FileInfo info = (*engine)->file(*file);
  ReadRate rate{.path = path, .direct = info.direct};
  rate.read_bytes = std::min<uint64_t>(kReadBytes, io::AlignDown(info.size));
  if (rate.read_bytes == 0) return absl::FailedPreconditionError(path + " is too small");
  auto created = io::BufferArena::Create(kReadsInFlight * rate.read_bytes);
  if (!created.ok()) return created.status();
  arena = *std::move(created);
  auto bytes = KeepReading(**engine, *file, info.size, rate.read_bytes, *arena, rate.seconds);
  if (!bytes.ok()) return bytes.status();
  rate.bytes_per_second = rate.seconds > 0 ? *bytes / rate.seconds : 0;
  return rate;
}

absl::StatusOr<std::string> WriteScratchFile(const std::string& dir, const std::string& prefix) {
  std::string path = absl::StrCat(dir, "/", prefix, "-XXXXXX");
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot create a file in ", dir));
  std::vector<uint64_t> block(1 << 17);  // 1 MiB
  std::mt19937_64 rng(1);
  bool ok = true;
  for (uint64_t done = 0; ok && done < kScratchBytes; done += block.size() * 8) {
    for (uint64_t& x : block) x = rng();
    ok = ::write(fd, block.data(), block.size() * 8) == static_cast<ssize_t>(block.size() * 8);
  }
  ok = ok && ::fdatasync(fd) == 0;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot write ", kScratchBytes >> 20, " MiB to ", dir));
  }
  return path;
}

bool MostlyHoles(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || st.st_size == 0) return false;
  return static_cast<uint64_t>(st.st_blocks) * 512 < static_cast<uint64_t>(st.st_size) / 2;
}

}  // namespace k3::cli
