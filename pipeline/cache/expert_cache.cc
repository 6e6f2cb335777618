#include "pipeline/cache/expert_cache.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace k3 {
namespace {

// Debian's Abseil is not built with ThreadSanitizer, so TSan cannot see the happens-before
// edges absl::Mutex provides and would call every access under the lock a race. Under TSan the
// lock is annotated by hand: taking it acquires, letting it go (also to wait) releases. Waits
// use a CondVar and re-check their condition on their own thread, under the lock, rather than
// absl::Condition, which other threads would evaluate inside Unlock where no annotation reaches.
void Acquired(absl::Mutex* mu) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(mu);
#endif
}
void Releasing(absl::Mutex* mu) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(mu);
#endif
}

class ABSL_SCOPED_LOCKABLE Lock {
 public:
  explicit Lock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
    Acquired(mu_);
  }
  ~Lock() ABSL_UNLOCK_FUNCTION() {
    Releasing(mu_);
    mu_->Unlock();
  }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  absl::Mutex* mu_;
};

// Waits on `cv` with `mu` held, until signalled or `deadline`.
void WaitUntil(absl::Mutex* mu, absl::CondVar* cv, absl::Time deadline) {
  Releasing(mu);
  cv->WaitWithDeadline(mu, deadline);
  Acquired(mu);
}

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

absl::Status CheckKey(const ExpertKey& key) {
  if (key.layer >= 0 && key.expert >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("expert cache: negative id in request for ", key.ToString()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertCache>> ExpertCache::Create(
    const ExpertCacheOptions& options, std::unique_ptr<ReplacementPolicy> policy) {
  if (policy == nullptr) return absl::InvalidArgumentError("expert cache: no policy");
  if (options.slot_bytes == 0) return absl::InvalidArgumentError("expert cache: slot_bytes is 0");
  if (!IsPowerOfTwo(options.alignment)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert cache: alignment ", options.alignment, " is not a power of two"));
  }
  const uint64_t stride = (options.slot_bytes + options.alignment - 1) & ~(options.alignment - 1);
  const uint64_t slots = options.budget_bytes / stride;
  if (slots == 0) {
    return absl::InvalidArgumentError(absl::StrCat("expert cache: a budget of ",
                                                   options.budget_bytes, " bytes holds no slot of ",
                                                   stride, " bytes"));
  }
  if (slots > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("expert cache: ", slots, " slots is too many"));
  }
  std::unique_ptr<io::BufferArena> arena;
  if (options.allocate) {
    auto created = io::BufferArena::Create(slots * stride, options.arena);
    if (!created.ok()) return created.status();
    arena = *std::move(created);
  }
  return std::unique_ptr<ExpertCache>(new ExpertCache(options, stride, static_cast<int64_t>(slots),
                                                      std::move(arena), std::move(policy)));
}

ExpertCache::ExpertCache(const ExpertCacheOptions& options, uint64_t stride, int64_t slots,
                         std::unique_ptr<io::BufferArena> arena,
                         std::unique_ptr<ReplacementPolicy> policy)
    : options_(options),
      stride_(stride),
      num_slots_(slots),
      arena_(std::move(arena)),
      policy_(std::move(policy)),
      slots_(slots) {
  // Everything the request path touches is sized here, so requests do not allocate (the
  // policy's bookkeeping aside).
  free_.reserve(slots);
  for (int64_t i = slots - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
  index_.reserve(slots);
  stats_.slots = slots;
  stats_.bytes_capacity = static_cast<uint64_t>(slots) * options.slot_bytes;
}

CacheGrant ExpertCache::GrantFor(CacheOutcome outcome, int32_t slot) const {
  CacheGrant grant{outcome, slot, {}};
  if (arena_ != nullptr) grant.bytes = arena_->Slice(slot * stride_, options_.slot_bytes);
  return grant;
}

absl::StatusOr<CacheGrant> ExpertCache::Request(const ExpertKey& key, const CacheRequest& request) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  Lock lock(&mu_);
  policy_->OnRequest(key, request.kind);
  ++stats_.requests;
  const absl::Time deadline = absl::Now() + request.wait_for_slot;
  while (true) {
    if (auto it = index_.find(key); it != index_.end()) return Found(it->second, request.pin);
    absl::StatusOr<int32_t> slot = TakeSlot();
    if (slot.ok()) return StartFill(key, *slot, request.pin);
    if (slot.status().code() != absl::StatusCode::kResourceExhausted ||
        request.wait_for_slot <= absl::ZeroDuration() || absl::Now() >= deadline) {
      ++stats_.rejected;
      return slot.status();
    }
    // A fill completing or failing, or an unpin, may have made a slot free to take.
    WaitUntil(&mu_, &changed_, deadline);
  }
}

CacheGrant ExpertCache::Found(int32_t slot, bool pin) {
  Slot& s = slots_[slot];
  policy_->OnHit(s.key);
  if (s.state == SlotState::kFilling) {
    ++stats_.in_flight;
    return GrantFor(CacheOutcome::kInFlight, slot);
  }
  ++stats_.hits;
  if (pin) AddPin(slot);
  return GrantFor(CacheOutcome::kHit, slot);
}

CacheGrant ExpertCache::StartFill(const ExpertKey& key, int32_t slot, bool pin) {
  Slot& s = slots_[slot];
  s.key = key;
  s.state = SlotState::kFilling;
  s.pins = 0;
  if (pin) AddPin(slot);
  ++filling_slots_;
  index_[key] = slot;
  policy_->OnInsert(key);
  ++stats_.misses;
  stats_.bytes_resident += options_.slot_bytes;
  return GrantFor(CacheOutcome::kFill, slot);
}

bool ExpertCache::Evictable(const ExpertKey& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const Slot& s = slots_[it->second];
  return s.state == SlotState::kReady && s.pins == 0;
}

absl::StatusOr<int32_t> ExpertCache::TakeSlot() {
  if (!free_.empty()) {
    const int32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  auto evictable = [this](const ExpertKey& k)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS { return Evictable(k); };
  std::optional<ExpertKey> victim = policy_->ChooseVictim(evictable);
  if (!victim) return NoSlotError();
  if (!Evictable(*victim)) {
    return absl::InternalError(absl::StrCat("expert cache: policy ", std::string(policy_->name()),
                                            " chose ", victim->ToString(),
                                            ", which is not an evictable resident"));
  }
  const int32_t slot = index_[*victim];
  policy_->OnRemove(*victim, RemovalCause::kEvicted);
  index_.erase(*victim);
  slots_[slot].state = SlotState::kFree;
  ++stats_.evictions;
  stats_.bytes_resident -= options_.slot_bytes;
  return slot;
}

absl::Status ExpertCache::NoSlotError() const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "expert cache: all ", num_slots_, " slots are pinned or being filled (", pinned_slots_,
      " pinned, ", filling_slots_, " filling); wait for a fill or an unpin, or raise the budget"));
}

absl::StatusOr<int32_t> ExpertCache::FindFilling(const ExpertKey& key) const {
  auto it = index_.find(key);
  if (it == index_.end() || slots_[it->second].state != SlotState::kFilling) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert cache: ", key.ToString(), " is not being filled"));
  }
  return it->second;
}

absl::Status ExpertCache::MarkFilled(const ExpertKey& key) {
  Lock lock(&mu_);
  absl::StatusOr<int32_t> slot = FindFilling(key);
  if (!slot.ok()) return slot.status();
  slots_[*slot].state = SlotState::kReady;
  --filling_slots_;
  ++stats_.fills_completed;
  stats_.bytes_filled += options_.slot_bytes;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status ExpertCache::Abandon(const ExpertKey& key) {
  Lock lock(&mu_);
  absl::StatusOr<int32_t> slot = FindFilling(key);
  if (!slot.ok()) return slot.status();
  policy_->OnRemove(key, RemovalCause::kAbandoned);
  Slot& s = slots_[*slot];
  if (s.pins > 0) --pinned_slots_;
  s = Slot{};
  index_.erase(key);
  free_.push_back(*slot);
  --filling_slots_;
  ++stats_.fills_abandoned;
  stats_.bytes_resident -= options_.slot_bytes;
  changed_.SignalAll();
  return absl::OkStatus();
}

void ExpertCache::AddPin(int32_t slot) {
  if (slots_[slot].pins++ == 0) ++pinned_slots_;
}

absl::Status ExpertCache::Pin(const ExpertKey& key) {
  Lock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("expert cache: cannot pin ", key.ToString(), ": not resident"));
  }
  AddPin(it->second);
  return absl::OkStatus();
}

absl::Status ExpertCache::Unpin(const ExpertKey& key) {
  Lock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end() || slots_[it->second].pins == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert cache: ", key.ToString(), " is not pinned"));
  }
  if (--slots_[it->second].pins == 0) {
    --pinned_slots_;
    changed_.SignalAll();
  }
  return absl::OkStatus();
}

std::string_view ExpertCache::policy_name() const {
  Lock lock(&mu_);
  return policy_->name();
}

bool ExpertCache::Contains(const ExpertKey& key) const {
  Lock lock(&mu_);
  auto it = index_.find(key);
  return it != index_.end() && slots_[it->second].state == SlotState::kReady;
}

CacheStats ExpertCache::stats() const {
  Lock lock(&mu_);
  CacheStats s = stats_;
  s.pinned_slots = pinned_slots_;
  s.filling_slots = filling_slots_;
  return s;
}

void ExpertCache::ResetStats() {
  Lock lock(&mu_);
  const CacheStats kept = stats_;
  stats_ = CacheStats{};
  stats_.slots = kept.slots;
  stats_.bytes_capacity = kept.bytes_capacity;
  stats_.bytes_resident = kept.bytes_resident;
}

}  // namespace k3
