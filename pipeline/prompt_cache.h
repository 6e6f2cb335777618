// The persistent prompt cache (`--prompt-cache DIR`, docs/PROMPT-CACHE.md): sequence states
// kept by the tokens they hold, in memory (first tier: the server's saved states) and on disk
// (second tier: one checksummed file per state under DIR/<fingerprint>/v<version>/,
// pipeline/prompt_cache_file.h), so that a request whose tokens extend a cached prefix runs
// only the tokens after it, also after a restart.
//
// A KDA state cannot be cut back to an earlier position, so a cached state is of use only when
// the request repeats every one of its tokens: the lookup is for the longest stored prefix, and
// it must be a proper one (at least one token is left to run, for its logits).
//
// The cache never fails a request: a damaged file is a warning and a miss, a failed write a
// warning and a pause in writing. Two processes may share DIR: files are published by rename
// and never overwritten, and eviction runs under a lock file.
//
//   auto cache = PromptCache::Open(config, *PromptCacheFingerprint(ckpt), {.dir = dir});
//   std::optional<SequenceState> hit = (*cache)->Lookup(ids);  // then run the rest of ids
//   (*cache)->Store(state);                                     // at a message boundary
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/config.h"
#include "core/model/sequence_state.h"
#include "pipeline/prompt_cache_file.h"

namespace k3 {

struct PromptCacheOptions {
  // The root; the files live under dir/<fingerprint>/v<version>/. Empty: memory only.
  std::string dir = "";
  uint64_t max_bytes = 0;    // the bound on the cache files under dir (0: none), LRU out
  size_t memory_states = 0;  // states kept in memory as well (0: none)
  // Stores that skip the disk after a failed write: a full disk stays full for a while, and
  // trying again on every store would cost a failed write of a whole state each time.
  int pause_stores = 16;
  // For tests: called before each write to a cache file with the offset it writes at; an errno
  // it returns (ENOSPC, EIO) fails that write as the system would.
  std::function<int(uint64_t offset)> write_fault = nullptr;
};

struct PromptCacheStats {
  int64_t lookups = 0;
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t misses = 0;
  int64_t damaged = 0;  // files moved aside: truncated, corrupt, foreign, or left by a kill
  int64_t stored = 0;   // states written to disk
  int64_t store_failures = 0;
  int64_t evicted = 0;  // files this process removed to keep within max_bytes
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

class PromptCache {
 public:
  // Creates the directories and rebuilds the index from the files' headers (not their
  // payloads); a file whose header is damaged or foreign, and a temporary file whose writer was
  // killed, is moved aside or removed with a warning. `warn` gets each warning as one line
  // (default: stderr). Fails only when the directory cannot be made or read.
  static absl::StatusOr<std::unique_ptr<PromptCache>> Open(
      const ModelConfig& config, std::string fingerprint, PromptCacheOptions options,
      std::function<void(std::string_view)> warn = {});
  ~PromptCache();
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  // A copy of the cached state with the most tokens that are a proper prefix of `ids` (memory
  // first, the disk for a longer one; a disk hit is kept in memory too). A file that fails any
  // check (length, checksum, fingerprint, version, tokens) is one warning naming it and what is
  // wrong; it is moved aside and the next-longest candidate is tried. What is returned is
  // exactly what was stored, bit for bit, or nothing.
  std::optional<SequenceState> Lookup(std::span<const int32_t> ids);

  // Keeps a copy in memory and writes the state to disk: atomically (a temporary name in the
  // same directory, fsync, rename without replacing, fsync of the directory) and checksummed.
  // A state already on disk is not written again, only marked as used. Never fails: an error
  // (ENOSPC, EIO, anything) removes the temporary file, warns once and pauses writing for
  // pause_stores stores. Then evicts least recently used files until DIR is within max_bytes.
  // Safe to call from another thread than Lookup's (a writer thread).
  void Store(const SequenceState& state);

  PromptCacheStats stats() const;
  size_t states_in_memory() const;
  // The bytes of this cache's files (this fingerprint and version) that this process knows of.
  uint64_t disk_bytes() const;
  // Where this cache's files live: dir/<fingerprint>/v<version>.
  const std::string& directory() const { return dir_; }
  bool on_disk() const { return !options_.dir.empty(); }
  // The path of the file that holds (or would hold) the state after `tokens`.
  std::string PathFor(std::span<const int32_t> tokens) const;

 private:
  struct DiskEntry {
    std::vector<int32_t> tokens;
    uint64_t bytes = 0;
  };
  enum class Load { kHit, kGone, kDamaged };

  PromptCache(const ModelConfig& config, std::string fingerprint, PromptCacheOptions options,
              std::function<void(std::string_view)> warn);
  // Reads the directory: indexes the files it does not know (by their headers), forgets those
  // gone, and, when `clean`, removes the temporary files of killed writers.
  void Scan(bool clean);
  // Indexes the file `name` by its header (a damaged or foreign one moves it aside): true when
  // it holds `tokens`.
  bool Adopt(const std::string& name, std::span<const int32_t> tokens);
  Load LoadFile(const std::string& name, std::span<const int32_t> tokens,
                std::optional<SequenceState>& out);
  void KeepInMemory(std::shared_ptr<const SequenceState> state);
  bool Write(const std::string& name, const SequenceState& state);
  void WriteFailed(std::string_view what);
  // Sets the file's modification time, the LRU clock shared with other processes, to now, or
  // just after the last time this process set (files used in one clock tick stay ordered).
  bool Touch(const std::string& path);
  void Evict();
  // Moves the file `name` of dir_ aside, with one warning saying `what` is wrong with it.
  void Damaged(const std::string& name, std::string_view what);
  void Warn(std::string_view message) const;

  const ModelConfig config_;
  const std::string fingerprint_;
  const PromptCacheOptions options_;
  const std::function<void(std::string_view)> warn_;
  const std::string dir_;

  mutable absl::Mutex mu_;
  std::list<std::shared_ptr<const SequenceState>> memory_ ABSL_GUARDED_BY(mu_);  // MRU first
  absl::flat_hash_map<std::string, DiskEntry> disk_ ABSL_GUARDED_BY(mu_);        // by file name
  PromptCacheStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t last_stamp_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int paused_stores_ ABSL_GUARDED_BY(mu_) = 0;  // stores left that skip the disk
  bool failing_ ABSL_GUARDED_BY(mu_) = false;   // since the last warning, no write succeeded
  bool warned_too_big_ ABSL_GUARDED_BY(mu_) = false;
  int64_t dir_mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;  // of dir_ when last scanned
};

}  // namespace k3
