// The expert cache: a byte budget of RAM split into equal slots, each holding one routed expert
// exactly as stored on disk (MXFP4 blocks and scales; the cache stores bytes and never decodes).
//
// A request for (layer, expert) is answered with one of
//   kHit:      the bytes are in the slot, ready to use;
//   kInFlight: another caller is filling the slot; pin it (Pin) and wait for that caller's
//              read rather than read again;
//   kFill:     a slot was reserved for the key and the caller must read the expert into it,
//              then call MarkFilled (or Abandon when the read failed).
// A slot being filled is never handed out as a hit and never evicted; pinned slots (e.g. the
// experts the current layer multiplies, or ones a read is landing in) are never evicted. When
// every slot is pinned or being filled a request fails with ResourceExhausted (or waits for a
// slot, if asked to), never by evicting a pinned slot.
//
// Memory: one io::BufferArena allocated up front (slots x slot stride, 4 KiB-aligned so O_DIRECT
// reads and io_uring fixed buffers can target the slots directly); the cache allocates nothing
// per request (the policy's small bookkeeping aside).
// Thread-safe: I/O completions and compute threads may call it concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "io/aligned_buffer.h"
#include "pipeline/cache/expert_key.h"
#include "pipeline/cache/policy.h"

namespace k3 {

struct ExpertCacheOptions {
  // RAM the slots may use, in bytes; slots = budget_bytes / slot stride, rounded down.
  uint64_t budget_bytes = 0;
  // Bytes one slot must hold: the caller's read buffer for an expert, i.e.
  // io::BufferBytesFor(offset, expert bytes) for the worst offset (the expert plus alignment
  // slack), or the plain expert size when every expert starts 4 KiB-aligned.
  uint64_t slot_bytes = 0;
  // Slots start at multiples of this (a power of two). 4 KiB for O_DIRECT; 1 gives the
  // simulator's convention of budget / expert size slots.
  uint64_t alignment = io::kDirectAlignment;
  // false: bookkeeping only, no memory (the simulator); slots then have empty byte spans.
  bool allocate = true;
  io::BufferArena::Options arena = {};
};

enum class CacheOutcome : uint8_t { kHit, kInFlight, kFill };

struct CacheRequest {
  RequestKind kind = RequestKind::kDemand;
  // Pin the slot for the caller on kHit and kFill (for kFill the pin holds after MarkFilled);
  // release it with Unpin. kInFlight never pins: the caller pins the slot being filled (Pin),
  // which keeps it once the fill completes and goes with it if the fill is abandoned.
  bool pin = false;
  // How long to wait for a slot to become free when every slot is pinned or being filled;
  // zero fails at once with ResourceExhausted.
  absl::Duration wait_for_slot = absl::ZeroDuration();
};

struct CacheGrant {
  CacheOutcome outcome = CacheOutcome::kFill;
  int32_t slot = -1;
  std::span<uint8_t> bytes = {};  // the slot's memory: slot_bytes long; empty without arena
};

struct CacheStats {
  // Every request ends in exactly one of hits, in_flight, misses or rejected.
  uint64_t requests = 0;
  uint64_t hits = 0;
  uint64_t in_flight = 0;  // found the key being filled by someone else
  uint64_t misses = 0;     // got a slot to fill
  uint64_t rejected = 0;   // no slot could be freed (all pinned or filling)
  uint64_t evictions = 0;
  uint64_t fills_completed = 0;
  uint64_t fills_abandoned = 0;
  uint64_t bytes_filled = 0;    // slot_bytes per completed fill: what the reads brought in
  uint64_t bytes_resident = 0;  // slot_bytes per occupied slot (ready or being filled)
  uint64_t bytes_capacity = 0;  // slots x slot_bytes (never above the budget)
  int64_t slots = 0;
  int64_t pinned_slots = 0;
  int64_t filling_slots = 0;

  double hit_rate() const {
    return requests == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(requests);
  }
};

class ExpertCache {
 public:
  // InvalidArgument when the budget holds no slot or the options make no sense; the arena's
  // error when the memory cannot be allocated.
  static absl::StatusOr<std::unique_ptr<ExpertCache>> Create(
      const ExpertCacheOptions& options, std::unique_ptr<ReplacementPolicy> policy);
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Looks `key` up; on a miss reserves a slot for the caller to fill, evicting the policy's
  // victim if the cache is full. ResourceExhausted when every slot is pinned or being filled
  // (after waiting request.wait_for_slot); InvalidArgument for negative ids.
  absl::StatusOr<CacheGrant> Request(const ExpertKey& key, const CacheRequest& request = {});

  // The fill of `key` is complete (all bytes arrived and were checked by the caller): the slot
  // becomes a hit for everyone. FailedPrecondition if `key` is not being filled.
  absl::Status MarkFilled(const ExpertKey& key);
  // The fill of `key` failed: the slot is freed (with any pins on it, also those of callers
  // that got kInFlight) and the key forgotten; they may Request again.
  absl::Status Abandon(const ExpertKey& key);

  // Pins a resident key (ready or being filled); NotFound if it is not resident. Pins nest.
  absl::Status Pin(const ExpertKey& key);
  // FailedPrecondition if `key` is not pinned.
  absl::Status Unpin(const ExpertKey& key);

  bool Contains(const ExpertKey& key) const;  // resident and ready
  CacheStats stats() const;
  void ResetStats();  // request and eviction counters only; occupancy stays

  int64_t slots() const { return num_slots_; }
  uint64_t slot_bytes() const { return options_.slot_bytes; }
  uint64_t slot_stride() const { return stride_; }
  std::string_view policy_name() const;
  // The memory the slots live in, to register with the read engine; null without arena.
  const io::BufferArena* arena() const { return arena_.get(); }

 private:
  enum class SlotState : uint8_t { kFree, kFilling, kReady };
  struct Slot {
    ExpertKey key;
    SlotState state = SlotState::kFree;
    int32_t pins = 0;
  };

  ExpertCache(const ExpertCacheOptions& options, uint64_t stride, int64_t slots,
              std::unique_ptr<io::BufferArena> arena, std::unique_ptr<ReplacementPolicy> policy);

  CacheGrant GrantFor(CacheOutcome outcome, int32_t slot) const;
  // The key is resident in `slot`: a hit, or in flight while it is being filled.
  CacheGrant Found(int32_t slot, bool pin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CacheGrant StartFill(const ExpertKey& key, int32_t slot, bool pin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free slot, else the slot of the policy's victim (evicted). ResourceExhausted when every
  // slot is pinned or being filled; Internal when the policy names a key it may not evict.
  absl::StatusOr<int32_t> TakeSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Evictable(const ExpertKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NoSlotError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int32_t> FindFilling(const ExpertKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddPin(int32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ExpertCacheOptions options_;
  const uint64_t stride_;
  const int64_t num_slots_;
  const std::unique_ptr<io::BufferArena> arena_;

  mutable absl::Mutex mu_;
  // Signalled when a fill completes or fails and when a slot's last pin goes: what Request
  // waits for when every slot is pinned or being filled.
  absl::CondVar changed_;
  std::unique_ptr<ReplacementPolicy> policy_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);  // stack of free slot indices
  absl::flat_hash_map<ExpertKey, int32_t> index_ ABSL_GUARDED_BY(mu_);
  int64_t pinned_slots_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t filling_slots_ ABSL_GUARDED_BY(mu_) = 0;
  CacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace k3
