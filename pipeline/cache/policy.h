// Replacement policies for the expert cache. The cache owns slots, pins and in-flight state; a
// policy only orders the resident keys and picks a victim among those the cache says may go.
//
// Call protocol (the cache holds its lock across every call, so policies need no locking):
//   every request:  OnRequest(key, kind), then
//     resident key (ready or being filled):  OnHit(key)
//     otherwise, if the cache is full:       ChooseVictim(evictable) -> v, OnRemove(v, kEvicted)
//                 and then:                  OnInsert(key)
//   a fill that failed:                      OnRemove(key, kAbandoned)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "pipeline/cache/expert_key.h"

namespace k3 {

enum class RemovalCause : uint8_t {
  kEvicted,    // chosen by ChooseVictim to make room
  kAbandoned,  // its fill failed; the key was never usable (no ghost entry, no history)
};

// Whether the cache may evict a resident key now (not pinned, not being filled).
using EvictablePredicate = absl::FunctionRef<bool(const ExpertKey&)>;

class ReplacementPolicy {
 public:
  virtual ~ReplacementPolicy() = default;

  virtual std::string_view name() const = 0;
  // Every request, before the cache looks the key up: frequency, position and clock tracking.
  virtual void OnRequest(const ExpertKey& key, RequestKind kind) {}
  // A request for a resident key.
  virtual void OnHit(const ExpertKey& key) = 0;
  // A key that was not resident took a slot.
  virtual void OnInsert(const ExpertKey& key) = 0;
  virtual void OnRemove(const ExpertKey& key, RemovalCause cause) = 0;
  // The resident key to evict next among those `evictable` accepts, or nullopt when it accepts
  // none. Must terminate even when no key is evictable. May reorder internal state (e.g. S3-FIFO
  // promotes on the way) but does not remove the key: the cache follows with OnRemove.
  virtual std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) = 0;
};

struct PolicyOptions {
  // Slots of the cache the policy serves; sizes of ghost lists, windows and ageing periods are
  // fractions or multiples of it, never tuned to a particular trace.
  int64_t capacity = 0;
  // MoE layers a forward pass visits in order (0: infer from the layer ids seen). Layer-aware
  // policies use it to tell how far away the next visit of a layer is.
  int32_t num_layers = 0;
  // The whole request sequence, for the offline optimum ("belady") only: the simulator knows
  // the future, an engine never does. Must outlive the policy.
  std::span<const ExpertKey> future = {};
};

// The engine's default, chosen by replaying the recorded Kimi K3 trace and five synthetic
// incremental-decode traces (docs/CACHE.md has every table). On the recorded trace LRU gets no
// reuse across forward passes (36.2 % at 8-64 GB); layer-reuse reaches 97-99.9 % of Belady's
// hit rate at 8-128 GB. On incremental decoding it is the best online policy in 19 of 25 cases
// and within a point of the best in the others, because it learns whether frequency (skewed
// routing) or recency (token-to-token correlation) predicts reuse instead of assuming one.
// layer-mru and layer-lfu match it on the recorded trace but collapse (layer-mru) or fall far
// behind where recency matters (layer-lfu) on incremental decoding; the classic policies get
// nothing while the cache is smaller than one pass.
inline constexpr std::string_view kDefaultPolicy = "layer-reuse";

// Every policy name MakePolicy accepts, in the order the simulator lists them.
const std::vector<std::string>& PolicyNames();

// InvalidArgument for an unknown name (listing the known ones), for capacity < 1, or for
// "belady" without a future.
absl::StatusOr<std::unique_ptr<ReplacementPolicy>> MakePolicy(std::string_view name,
                                                              const PolicyOptions& options);

}  // namespace k3
