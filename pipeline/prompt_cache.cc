#include "pipeline/prompt_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "io/tsan_mutex.h"
#include "pipeline/prompt_cache_file.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;

// Part of a path: letters, digits, '-' and '_' only.
bool IsPlainName(std::string_view s) {
  return !s.empty() && s.size() <= kMaxPromptCacheFingerprint &&
         std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  c == '-' || c == '_';
         });
}

bool IsProperPrefix(std::span<const int32_t> tokens, std::span<const int32_t> ids) {
  return !tokens.empty() && tokens.size() < ids.size() &&
         std::equal(tokens.begin(), tokens.end(), ids.begin());
}

int64_t NowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int64_t ModifiedNs(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// The names in `dir` (none when it cannot be read).
std::vector<std::string> ListDirectory(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

// Publishes `temp` as `path` unless `path` exists: 0, EEXIST, or the errno of the failure.
int PublishWithoutReplacing(const std::string& temp, const std::string& path) {
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  // A file system without RENAME_NOREPLACE: a hard link fails on an existing name too.
  if (::link(temp.c_str(), path.c_str()) == 0) {
    ::unlink(temp.c_str());
    return 0;
  }
  if (errno == EEXIST) return EEXIST;
  // Neither (vfat): a rename, which may replace a file of the same key, and so of the same state.
  return ::rename(temp.c_str(), path.c_str()) == 0 ? 0 : errno;
}

// Creates the temporary file `temp` and locks it, which tells a cleaner (Scan) that it has a
// live writer. A cleaner that locked it first, between the creation and the lock, has removed
// it: then it is made again.
int CreateLocked(const std::string& temp) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    ::flock(fd, LOCK_EX);  // where locks are not supported, cleaners cannot lock either
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_nlink > 0) return fd;
    ::close(fd);
  }
  errno = ENOENT;
  return -1;
}

void SyncDirectory(const std::string& dir) {
  if (int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    ::fsync(fd);  // best effort: some file systems refuse fsync on directories
    ::close(fd);
  }
}

}  // namespace

PromptCache::PromptCache(const ModelConfig& config, std::string fingerprint,
                         PromptCacheOptions options, std::function<void(std::string_view)> warn)
    : config_(config),
      fingerprint_(std::move(fingerprint)),
      options_(std::move(options)),
      warn_(std::move(warn)),
      dir_(absl::StrCat(options_.dir, "/", fingerprint_, "/v", kPromptCacheVersion)) {}

PromptCache::~PromptCache() = default;

absl::StatusOr<std::unique_ptr<PromptCache>> PromptCache::Open(
    const ModelConfig& config, std::string fingerprint, PromptCacheOptions options,
    std::function<void(std::string_view)> warn) {
  if (!IsPlainName(fingerprint)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt cache fingerprint \"", fingerprint, "\" is not a plain name"));
  }
  std::unique_ptr<PromptCache> cache(
      new PromptCache(config, std::move(fingerprint), std::move(options), std::move(warn)));
  if (!cache->on_disk()) return cache;
  if (absl::Status s = io::MakeDirectories(cache->dir_); !s.ok()) return s;
  std::error_code ec;
  fs::directory_iterator check(cache->dir_, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("prompt cache: cannot read ", cache->dir_, ": ", ec.message()));
  }
  cache->Scan(/*clean=*/true);
  return cache;
}

void PromptCache::Scan(bool clean) {
  // The time is taken first: a file published during the scan changes it again.
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0) return;
  std::vector<std::string> names = ListDirectory(dir_);
  absl::flat_hash_set<std::string> present;
  std::vector<std::string> unknown;
  for (std::string& name : names) {
    if (name.find(kPromptCacheTempInfix) != std::string::npos) {
      if (!clean) continue;
      // Its writer holds a lock on it until it is renamed; a lock had at once means the writer
      // is gone (killed mid-write): nothing will ever complete the file.
      const std::string path = io::JoinPath(dir_, name);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(path.c_str()) == 0) {
        Warn(absl::StrCat("prompt cache: ", path,
                          ": a partial file left by an interrupted write; removed"));
        io::AnnotatedMutexLock lock(&mu_);
        ++stats_.damaged;
      }
      ::close(fd);
    } else if (absl::EndsWith(name, kPromptCacheSuffix)) {
      present.insert(name);
    }
  }
  {
    io::AnnotatedMutexLock lock(&mu_);
    absl::erase_if(disk_, [&](const auto& entry) { return !present.contains(entry.first); });
    for (const std::string& name : present) {
      if (!disk_.contains(name)) unknown.push_back(name);
    }
  }
  std::sort(unknown.begin(), unknown.end());
  for (const std::string& name : unknown) Adopt(name, {});
  io::AnnotatedMutexLock lock(&mu_);
  dir_mtime_ns_ = ModifiedNs(st);
}

bool PromptCache::Adopt(const std::string& name, std::span<const int32_t> tokens) {
  auto file = io::RandomAccessFile::Open(io::JoinPath(dir_, name));
  if (!file.ok()) {
    if (!absl::IsNotFound(file.status())) Damaged(name, std::string(file.status().message()));
    return false;
  }
  auto header = ReadPromptCacheHeader(**file, fingerprint_);
  if (!header.ok()) {
    Damaged(name, std::string(header.status().message()));
    return false;
  }
  if (name != absl::StrCat(PromptCacheKey(fingerprint_, header->tokens), kPromptCacheSuffix)) {
    Damaged(name, "holds other tokens than its name says (a hash collision or a renamed file)");
    return false;
  }
  const bool same =
      std::equal(header->tokens.begin(), header->tokens.end(), tokens.begin(), tokens.end());
  io::AnnotatedMutexLock lock(&mu_);
  disk_[name] = {std::move(header->tokens), header->file_bytes()};
  return same;
}

PromptCache::Load PromptCache::LoadFile(const std::string& name, std::span<const int32_t> tokens,
                                        std::optional<SequenceState>& out) {
  const std::string path = io::JoinPath(dir_, name);
  auto file = io::RandomAccessFile::Open(path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) return Load::kGone;  // evicted by another process
    Damaged(name, std::string(file.status().message()));
    return Load::kDamaged;
  }
  auto state = ReadPromptCacheFile(**file, fingerprint_, tokens, config_);
  if (!state.ok()) {
    Damaged(name, std::string(state.status().message()));
    return Load::kDamaged;
  }
  Touch(path);
  io::AnnotatedMutexLock lock(&mu_);
  stats_.bytes_read += (*file)->size();
  out = *std::move(state);
  return Load::kHit;
}

std::optional<SequenceState> PromptCache::Lookup(std::span<const int32_t> ids) {
  struct stat st {};
  bool changed = false;
  if (on_disk() && ::stat(dir_.c_str(), &st) == 0) {
    io::AnnotatedMutexLock lock(&mu_);
    changed = ModifiedNs(st) != dir_mtime_ns_;
  }
  if (changed) Scan(/*clean=*/false);  // another process published or removed a file

  std::shared_ptr<const SequenceState> in_memory;
  std::vector<std::pair<size_t, std::string>> candidates;  // longest first
  {
    io::AnnotatedMutexLock lock(&mu_);
    ++stats_.lookups;
    auto best = memory_.end();
    for (auto it = memory_.begin(); it != memory_.end(); ++it) {
      const auto& tokens = (*it)->tokens();
      if (IsProperPrefix(tokens, ids) &&
          (best == memory_.end() || tokens.size() > (*best)->tokens().size())) {
        best = it;
      }
    }
    if (best != memory_.end()) {
      memory_.splice(memory_.begin(), memory_, best);
      in_memory = memory_.front();
    }
    const size_t floor = in_memory ? in_memory->tokens().size() : 0;
    for (const auto& [name, entry] : disk_) {
      if (entry.tokens.size() > floor && IsProperPrefix(entry.tokens, ids)) {
        candidates.emplace_back(entry.tokens.size(), name);
      }
    }
  }
  std::sort(candidates.begin(), candidates.end(), std::greater<>());
  for (const auto& [length, name] : candidates) {
    std::optional<SequenceState> state;
    const Load result = LoadFile(name, ids.first(length), state);
    if (result == Load::kHit) {
      if (options_.memory_states > 0) KeepInMemory(std::make_shared<const SequenceState>(*state));
      io::AnnotatedMutexLock lock(&mu_);
      ++stats_.disk_hits;
      return state;
    }
    if (result == Load::kGone) {
      io::AnnotatedMutexLock lock(&mu_);
      disk_.erase(name);
    }
  }
  if (in_memory == nullptr) {
    io::AnnotatedMutexLock lock(&mu_);
    ++stats_.misses;
    return std::nullopt;
  }
  // Used from memory is used: the disk's copy should not be the first to go.
  if (on_disk()) Touch(PathFor(in_memory->tokens()));
  {
    io::AnnotatedMutexLock lock(&mu_);
    ++stats_.memory_hits;
  }
  return *in_memory;
}

void PromptCache::KeepInMemory(std::shared_ptr<const SequenceState> state) {
  if (options_.memory_states == 0) return;
  io::AnnotatedMutexLock lock(&mu_);
  memory_.remove_if([&](const auto& s) { return s->tokens() == state->tokens(); });
  memory_.push_front(std::move(state));
  while (memory_.size() > options_.memory_states) memory_.pop_back();
}

void PromptCache::Store(const SequenceState& state) {
  if (state.tokens().empty()) return;
  if (options_.memory_states > 0) KeepInMemory(std::make_shared<const SequenceState>(state));
  if (!on_disk()) return;
  const std::string name =
      absl::StrCat(PromptCacheKey(fingerprint_, state.tokens()), kPromptCacheSuffix);
  const std::string path = io::JoinPath(dir_, name);
  bool known = false;
  {
    io::AnnotatedMutexLock lock(&mu_);
    auto it = disk_.find(name);
    known = it != disk_.end() && it->second.tokens == state.tokens();
  }
  // On disk already (written here, or by another process since the last scan): used again.
  if (known && Touch(path)) return;
  if (!known && io::FileExists(path) && Adopt(name, state.tokens())) {
    Touch(path);
    return;
  }
  const uint64_t bytes = PromptCacheFileBytes(fingerprint_, state);
  const bool too_big = options_.max_bytes > 0 && bytes > options_.max_bytes;
  bool warn_too_big = false;
  {
    io::AnnotatedMutexLock lock(&mu_);
    if (!too_big && paused_stores_ > 0) {
      --paused_stores_;
      return;
    }
    warn_too_big = too_big && !std::exchange(warned_too_big_, true);
  }
  if (too_big) {
    if (warn_too_big) {
      Warn(absl::StrCat("prompt cache: a state of ", bytes, " bytes is larger than the bound of ",
                        options_.max_bytes, " bytes: states this large are not written"));
    }
    return;
  }
  if (Write(name, state)) Evict();
}

bool PromptCache::Write(const std::string& name, const SequenceState& state) {
  static std::atomic<uint64_t> serial = 0;  // temp names of their own for every writer
  const std::string path = io::JoinPath(dir_, name);
  const std::string temp =
      absl::StrCat(path, kPromptCacheTempInfix, ::getpid(), ".", serial.fetch_add(1));
  const uint64_t bytes = PromptCacheFileBytes(fingerprint_, state);
  struct statvfs vfs {};
  if (::statvfs(dir_.c_str(), &vfs) == 0 && uint64_t{vfs.f_bavail} * vfs.f_frsize < bytes) {
    WriteFailed(absl::StrCat("no room in ", dir_, " for a state of ", bytes, " bytes (",
                             uint64_t{vfs.f_bavail} * vfs.f_frsize, " free)"));
    return false;
  }
  const int fd = CreateLocked(temp);
  if (fd < 0) {
    WriteFailed(absl::StrCat("creating ", temp, ": ", std::strerror(errno)));
    return false;
  }
  absl::Status s = WritePromptCacheFile(fd, temp, fingerprint_, state, options_.write_fault);
  int published = -1;
  if (s.ok()) {
    Touch(temp);
    published = PublishWithoutReplacing(temp, path);
    if (published != 0 && published != EEXIST) {
      s = absl::InternalError(
          absl::StrCat("renaming ", temp, " to ", path, ": ", std::strerror(published)));
    }
  }
  if (published != 0) ::unlink(temp.c_str());
  ::close(fd);
  if (!s.ok()) {
    WriteFailed(std::string(s.message()));
    return false;
  }
  if (published == EEXIST) {  // another writer of the same state was first: its file stays
    if (Adopt(name, state.tokens())) Touch(path);
    return false;
  }
  SyncDirectory(dir_);
  io::AnnotatedMutexLock lock(&mu_);
  disk_[name] = {state.tokens(), bytes};
  ++stats_.stored;
  stats_.bytes_written += bytes;
  failing_ = false;
  return true;
}

void PromptCache::WriteFailed(std::string_view what) {
  bool first = false;
  {
    io::AnnotatedMutexLock lock(&mu_);
    ++stats_.store_failures;
    paused_stores_ = options_.pause_stores;
    first = !failing_;
    failing_ = true;
  }
  if (first) {
    Warn(absl::StrCat("prompt cache: ", std::string(what), "; the next ", options_.pause_stores,
                      " states are not written to disk (requests are served as before)"));
  }
}

bool PromptCache::Touch(const std::string& path) {
  int64_t stamp = 0;
  {
    io::AnnotatedMutexLock lock(&mu_);
    stamp = std::max(NowNs(), last_stamp_ns_ + 1);
    last_stamp_ns_ = stamp;
  }
  const timespec times[2] = {{0, UTIME_OMIT}, {stamp / 1'000'000'000, stamp % 1'000'000'000}};
  // Another user's file cannot be touched (EPERM) but is still there.
  return ::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0 || errno != ENOENT;
}

void PromptCache::Evict() {
  if (options_.max_bytes == 0) return;
  // One evicting process at a time, or two would both remove files for the same excess.
  const std::string lock_path = io::JoinPath(options_.dir, "lock");
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd >= 0) ::flock(lock_fd, LOCK_EX);
  struct File {
    bool bad;
    int64_t modified_ns;
    std::string path;
    uint64_t bytes;
  };
  // Every fingerprint and version under the root: the bound is DIR's, and a model used no more
  // leaves files that only eviction removes.
  std::vector<File> files;
  uint64_t total = 0;
  for (const std::string& model : ListDirectory(options_.dir)) {
    const std::string model_dir = io::JoinPath(options_.dir, model);
    for (const std::string& version : ListDirectory(model_dir)) {
      const std::string dir = io::JoinPath(model_dir, version);
      for (const std::string& name : ListDirectory(dir)) {
        const bool bad = absl::EndsWith(name, kPromptCacheBadSuffix);
        if (!bad && !absl::EndsWith(name, kPromptCacheSuffix)) continue;
        const std::string path = io::JoinPath(dir, name);
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        files.push_back({bad, ModifiedNs(st), path, static_cast<uint64_t>(st.st_size)});
        total += static_cast<uint64_t>(st.st_size);
      }
    }
  }
  // Files moved aside first, then the least recently used.
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) {
    return std::make_tuple(!a.bad, a.modified_ns, std::string_view(a.path)) <
           std::make_tuple(!b.bad, b.modified_ns, std::string_view(b.path));
  });
  for (const File& f : files) {
    if (total <= options_.max_bytes) break;
    if (::unlink(f.path.c_str()) != 0) continue;
    total -= f.bytes;
    io::AnnotatedMutexLock lock(&mu_);
    ++stats_.evicted;
    if (f.path.starts_with(dir_ + "/")) disk_.erase(f.path.substr(dir_.size() + 1));
  }
  if (lock_fd >= 0) ::close(lock_fd);  // and with it the lock
}

void PromptCache::Damaged(const std::string& name, std::string_view what) {
  const std::string path = io::JoinPath(dir_, name);
  const std::string aside = absl::StrCat(path, kPromptCacheBadSuffix);
  std::string fate;
  if (::rename(path.c_str(), aside.c_str()) == 0) {
    fate = absl::StrCat("moved aside to ", name, kPromptCacheBadSuffix);
  } else if (errno == ENOENT) {
    fate = "gone already";
  } else {
    fate = ::unlink(path.c_str()) == 0 ? "removed" : "left in place";
  }
  Warn(absl::StrCat("prompt cache: ", path, ": ", std::string(what), "; ", fate));
  io::AnnotatedMutexLock lock(&mu_);
  ++stats_.damaged;
  disk_.erase(name);
}

void PromptCache::Warn(std::string_view message) const {
  if (warn_) {
    warn_(message);
  } else {
    std::fprintf(stderr, "k3: warning: %.*s\n", static_cast<int>(message.size()), message.data());
  }
}

PromptCacheStats PromptCache::stats() const {
  io::AnnotatedMutexLock lock(&mu_);
  return stats_;
}

size_t PromptCache::states_in_memory() const {
  io::AnnotatedMutexLock lock(&mu_);
  return memory_.size();
}

uint64_t PromptCache::disk_bytes() const {
  io::AnnotatedMutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [name, entry] : disk_) total += entry.bytes;
  return total;
}

std::string PromptCache::PathFor(std::span<const int32_t> tokens) const {
  return io::JoinPath(dir_, absl::StrCat(PromptCacheKey(fingerprint_, tokens), kPromptCacheSuffix));
}

}  // namespace k3
