// The expert cache's invariants: an in-flight slot is never a hit and never evicted, pinned
// slots survive pressure, the byte budget holds, statistics add up, and concurrent use is safe
// (run under K3_SANITIZE=thread for the data-race check).
#include "pipeline/cache/expert_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "pipeline/cache/policy.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSlotBytes = 5000;  // deliberately not a multiple of 4 KiB

std::unique_ptr<ReplacementPolicy> Policy(std::string_view name, int64_t capacity) {
  auto p = MakePolicy(name, {.capacity = capacity});
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

// A cache of `slots` slots of kSlotBytes (stride 8 KiB), with memory unless `allocate` is off.
std::unique_ptr<ExpertCache> MakeCache(int64_t slots, std::string_view policy = "lru",
                                       bool allocate = true) {
  ExpertCacheOptions options{.budget_bytes = static_cast<uint64_t>(slots) * 8192 + 100,
                             .slot_bytes = kSlotBytes,
                             .allocate = allocate,
                             .arena = {.huge_pages = false}};
  auto cache = ExpertCache::Create(options, Policy(policy, slots));
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? *std::move(cache) : nullptr;
}

ExpertKey K(int expert, int layer = 1) { return {layer, expert}; }

// Requests `key` and, on a miss, completes the fill at once.
CacheOutcome Use(ExpertCache& cache, const ExpertKey& key) {
  auto grant = cache.Request(key);
  EXPECT_TRUE(grant.ok()) << grant.status();
  if (grant.ok() && grant->outcome == CacheOutcome::kFill) {
    EXPECT_TRUE(cache.MarkFilled(key).ok());
  }
  return grant.ok() ? grant->outcome : CacheOutcome::kInFlight;
}

void ExpectStatsAddUp(const CacheStats& s) {
  EXPECT_EQ(s.requests, s.hits + s.in_flight + s.misses + s.rejected);
  EXPECT_EQ(s.misses, s.fills_completed + s.fills_abandoned + s.filling_slots);
  EXPECT_EQ(s.bytes_filled, s.fills_completed * kSlotBytes);
  const uint64_t resident_slots = s.misses - s.evictions - s.fills_abandoned;
  EXPECT_EQ(s.bytes_resident, resident_slots * kSlotBytes);
  EXPECT_LE(s.bytes_resident, s.bytes_capacity);
}

TEST(ExpertCacheTest, BudgetBelowOneSlotIsInvalid) {
  ExpertCacheOptions options{.budget_bytes = 8191, .slot_bytes = kSlotBytes, .allocate = false};
  auto cache = ExpertCache::Create(options, Policy("lru", 1));
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExpertCacheTest, SlotsAreAlignedDisjointAndWithinTheBudget) {
  auto cache = MakeCache(6);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->slots(), 6);
  EXPECT_EQ(cache->slot_stride(), 8192u);
  const CacheStats s = cache->stats();
  EXPECT_LE(static_cast<uint64_t>(cache->slots()) * cache->slot_stride(), 6u * 8192 + 100);
  EXPECT_EQ(s.bytes_capacity, 6 * kSlotBytes);
  std::vector<uint8_t*> starts;
  for (int e = 0; e < 6; ++e) {
    auto grant = cache->Request(K(e));
    ASSERT_TRUE(grant.ok());
    ASSERT_EQ(grant->bytes.size(), kSlotBytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(grant->bytes.data()) % 4096, 0u);
    EXPECT_TRUE(cache->arena()->Contains(grant->bytes.data(), kSlotBytes));
    starts.push_back(grant->bytes.data());
    std::memset(grant->bytes.data(), e + 1, kSlotBytes);  // the slot is writable memory
    ASSERT_TRUE(cache->MarkFilled(K(e)).ok());
  }
  std::sort(starts.begin(), starts.end());
  for (size_t i = 1; i < starts.size(); ++i) EXPECT_GE(starts[i] - starts[i - 1], 8192);
  // The bytes written by the fill are what a hit hands out.
  for (int e = 0; e < 6; ++e) {
    auto grant = cache->Request(K(e));
    ASSERT_TRUE(grant.ok());
    ASSERT_EQ(grant->outcome, CacheOutcome::kHit);
    EXPECT_EQ(grant->bytes[0], e + 1);
    EXPECT_EQ(grant->bytes[kSlotBytes - 1], e + 1);
  }
}

TEST(ExpertCacheTest, MissThenInFlightThenHit) {
  auto cache = MakeCache(4);
  auto first = cache->Request(K(7));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->outcome, CacheOutcome::kFill);
  auto second = cache->Request(K(7));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->outcome, CacheOutcome::kInFlight);  // never a hit before MarkFilled
  EXPECT_EQ(second->slot, first->slot);
  EXPECT_FALSE(cache->Contains(K(7)));
  ASSERT_TRUE(cache->MarkFilled(K(7)).ok());
  EXPECT_TRUE(cache->Contains(K(7)));
  EXPECT_EQ(Use(*cache, K(7)), CacheOutcome::kHit);
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.in_flight, 1u);
  EXPECT_EQ(s.hits, 1u);
  ExpectStatsAddUp(s);
}

TEST(ExpertCacheTest, InFlightSlotIsNeverEvicted) {
  for (const std::string& policy : PolicyNames()) {
    if (policy == "belady") continue;  // needs a future; covered by the replay tests
    SCOPED_TRACE(policy);
    auto cache = MakeCache(2, policy);
    ASSERT_TRUE(cache->Request(K(0)).ok());  // stays in flight
    for (int e = 1; e < 50; ++e) {
      auto grant = cache->Request(K(e));
      ASSERT_TRUE(grant.ok()) << grant.status();
      ASSERT_EQ(grant->outcome, CacheOutcome::kFill);
      ASSERT_TRUE(cache->MarkFilled(K(e)).ok());
      auto again = cache->Request(K(0));
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(again->outcome, CacheOutcome::kInFlight);
    }
    ExpectStatsAddUp(cache->stats());
  }
}

TEST(ExpertCacheTest, AllSlotsBusyIsResourceExhaustedNotAnEviction) {
  auto cache = MakeCache(3);
  ASSERT_TRUE(cache->Request(K(0), {.pin = true}).ok());  // filling and pinned
  ASSERT_TRUE(cache->Request(K(1)).ok());                 // filling
  ASSERT_EQ(Use(*cache, K(2)), CacheOutcome::kFill);
  ASSERT_TRUE(cache->Pin(K(2)).ok());
  auto rejected = cache->Request(K(3));
  ASSERT_EQ(rejected.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(rejected.status().message()), HasSubstr("pinned or being filled"));
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.pinned_slots, 2);
  EXPECT_EQ(s.filling_slots, 2);
  ExpectStatsAddUp(s);
  // Once a slot may go again, the same request succeeds and evicts exactly that one.
  ASSERT_TRUE(cache->Unpin(K(2)).ok());
  auto granted = cache->Request(K(3));
  ASSERT_TRUE(granted.ok());
  EXPECT_EQ(granted->outcome, CacheOutcome::kFill);
  EXPECT_FALSE(cache->Contains(K(2)));
}

TEST(ExpertCacheTest, PinnedSlotsSurvivePressureUnderEveryPolicy) {
  for (const std::string& policy : PolicyNames()) {
    if (policy == "belady") continue;
    SCOPED_TRACE(policy);
    auto cache = MakeCache(8, policy);
    for (int e = 0; e < 3; ++e) {
      auto grant = cache->Request(K(e, 5), {.pin = true});
      ASSERT_TRUE(grant.ok());
      ASSERT_TRUE(cache->MarkFilled(K(e, 5)).ok());
    }
    std::mt19937 rng(1);
    for (int i = 0; i < 2000; ++i) {
      const ExpertKey key = K(static_cast<int>(rng() % 40), static_cast<int>(rng() % 6) + 1);
      ASSERT_TRUE(cache->Request(key).ok());
      if (!cache->Contains(key)) {
        ASSERT_TRUE(cache->MarkFilled(key).ok());
      }
      for (int e = 0; e < 3; ++e) {
        ASSERT_TRUE(cache->Contains(K(e, 5)));
      }
    }
    for (int e = 0; e < 3; ++e) {
      ASSERT_TRUE(cache->Unpin(K(e, 5)).ok());
    }
    ExpectStatsAddUp(cache->stats());
  }
}

TEST(ExpertCacheTest, PinsNestAndUnpinChecksState) {
  auto cache = MakeCache(2);
  EXPECT_EQ(cache->Pin(K(1)).code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(Use(*cache, K(1)), CacheOutcome::kFill);
  EXPECT_EQ(cache->Unpin(K(1)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(cache->Pin(K(1)).ok());
  ASSERT_TRUE(cache->Pin(K(1)).ok());
  ASSERT_EQ(Use(*cache, K(2)), CacheOutcome::kFill);
  ASSERT_TRUE(cache->Unpin(K(1)).ok());
  ASSERT_EQ(Use(*cache, K(3)), CacheOutcome::kFill);  // evicts 2: 1 is still pinned once
  EXPECT_TRUE(cache->Contains(K(1)));
  EXPECT_FALSE(cache->Contains(K(2)));
  ASSERT_TRUE(cache->Unpin(K(1)).ok());
  EXPECT_EQ(cache->stats().pinned_slots, 0);
}

TEST(ExpertCacheTest, CompletionCallsCheckTheState) {
  auto cache = MakeCache(2);
  EXPECT_EQ(cache->MarkFilled(K(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache->Abandon(K(1)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(Use(*cache, K(1)), CacheOutcome::kFill);
  EXPECT_EQ(cache->MarkFilled(K(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache->Request({-1, 3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Request({1, -3}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExpertCacheTest, AbandonFreesTheSlotAndForgetsTheKey) {
  auto cache = MakeCache(1);
  ASSERT_TRUE(cache->Request(K(1), {.pin = true}).ok());
  ASSERT_TRUE(cache->Abandon(K(1)).ok());
  EXPECT_FALSE(cache->Contains(K(1)));
  CacheStats s = cache->stats();
  EXPECT_EQ(s.pinned_slots, 0);
  EXPECT_EQ(s.bytes_resident, 0u);
  EXPECT_EQ(Use(*cache, K(2)), CacheOutcome::kFill);  // the only slot is free again
  EXPECT_EQ(Use(*cache, K(1)), CacheOutcome::kFill);  // a new miss, not a hit
  s = cache->stats();
  EXPECT_EQ(s.fills_abandoned, 1u);
  EXPECT_EQ(s.evictions, 1u);
  ExpectStatsAddUp(s);
}

// A caller that gets kInFlight pins the slot being filled and waits for the filler's read (as
// the streaming provider does): until the fill completes the key is never a hit, however long
// it takes; once another thread completes it the key is ready and the waiter's pin holds.
TEST(ExpertCacheTest, APinOnAFillInFlightHoldsWhenAnotherThreadCompletesIt) {
  auto cache = MakeCache(2);
  ASSERT_EQ(cache->Request(K(1))->outcome, CacheOutcome::kFill);
  ASSERT_EQ(cache->Request(K(1))->outcome, CacheOutcome::kInFlight);
  ASSERT_TRUE(cache->Pin(K(1)).ok());
  EXPECT_FALSE(cache->Contains(K(1)));
  EXPECT_EQ(cache->Request(K(1))->outcome, CacheOutcome::kInFlight);  // pinned, still no hit
  std::thread io([&] {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(cache->MarkFilled(K(1)).ok());
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!cache->Contains(K(1)) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  io.join();
  EXPECT_TRUE(cache->Contains(K(1)));
  EXPECT_EQ(cache->stats().pinned_slots, 1);
  ASSERT_EQ(Use(*cache, K(2)), CacheOutcome::kFill);
  ASSERT_EQ(Use(*cache, K(3)), CacheOutcome::kFill);  // evicts 2: 1 is pinned
  EXPECT_EQ(Use(*cache, K(1)), CacheOutcome::kHit);
  ASSERT_TRUE(cache->Unpin(K(1)).ok());
  ExpectStatsAddUp(cache->stats());
}

// An abandoned fill takes the waiters' pins with it: the key is gone (Pin: NotFound), their pin
// is not there to release, and the next request fills it anew.
TEST(ExpertCacheTest, AnAbandonedFillDropsThePinsOfItsWaiters) {
  auto cache = MakeCache(2);
  ASSERT_EQ(cache->Request(K(1))->outcome, CacheOutcome::kFill);
  ASSERT_EQ(cache->Request(K(1))->outcome, CacheOutcome::kInFlight);
  ASSERT_TRUE(cache->Pin(K(1)).ok());
  std::thread io([&] {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(cache->Abandon(K(1)).ok());
  });
  io.join();
  EXPECT_FALSE(cache->Contains(K(1)));
  EXPECT_EQ(cache->stats().pinned_slots, 0);
  EXPECT_EQ(cache->Pin(K(1)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache->Unpin(K(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Use(*cache, K(1)), CacheOutcome::kFill);
  ExpectStatsAddUp(cache->stats());
}

TEST(ExpertCacheTest, RequestCanWaitForASlot) {
  auto cache = MakeCache(1);
  ASSERT_TRUE(cache->Request(K(1), {.pin = true}).ok());
  ASSERT_TRUE(cache->MarkFilled(K(1)).ok());
  std::thread compute([&] {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(cache->Unpin(K(1)).ok());
  });
  auto grant = cache->Request(K(2), {.wait_for_slot = absl::Seconds(10)});
  compute.join();
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->outcome, CacheOutcome::kFill);
  EXPECT_EQ(cache->stats().evictions, 1u);
}

TEST(ExpertCacheTest, ResetStatsKeepsOccupancy) {
  auto cache = MakeCache(2);
  Use(*cache, K(1));
  cache->ResetStats();
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.requests, 0u);
  EXPECT_EQ(s.bytes_resident, kSlotBytes);
  EXPECT_EQ(Use(*cache, K(1)), CacheOutcome::kHit);
}

// Several threads play I/O and compute at once: request (pinned), fill or abandon, wait for
// fills of others, unpin. Afterwards every count must add up and nothing may stay pinned.
void Hammer(std::string_view policy) {
  constexpr int kThreads = 6;
  constexpr int kOps = 3000;
  auto cache = MakeCache(16, policy, /*allocate=*/false);
  std::atomic<int> errors{0};
  // A waiter on another's fill pins it; an abandon drops that pin. The streaming provider knows
  // of the abandon from its own read; here each key's abandons are counted, and a waiter pins
  // and abandons happen under one lock so that the count tells a waiter whether its pin is gone.
  std::mutex abandon_mu;
  std::map<ExpertKey, int> abandons;
  auto abandoned = [&](const ExpertKey& key) {
    std::lock_guard<std::mutex> lock(abandon_mu);
    return abandons[key];
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kOps; ++i) {
        const ExpertKey key = K(static_cast<int>(rng() % 24), static_cast<int>(rng() % 4) + 1);
        auto grant = cache->Request(key, {.pin = true, .wait_for_slot = absl::Seconds(5)});
        if (!grant.ok()) {
          ++errors;
          continue;
        }
        bool pinned = grant->outcome != CacheOutcome::kInFlight;
        if (grant->outcome == CacheOutcome::kFill) {
          if (rng() % 10 == 0) {
            std::lock_guard<std::mutex> lock(abandon_mu);
            if (!cache->Abandon(key).ok()) ++errors;
            ++abandons[key];
            pinned = false;
          } else if (!cache->MarkFilled(key).ok()) {
            ++errors;
          }
        } else if (grant->outcome == CacheOutcome::kInFlight) {
          int seen = 0;
          {
            std::lock_guard<std::mutex> lock(abandon_mu);
            pinned = cache->Pin(key).ok();  // NotFound when the filler abandoned it already
            seen = abandons[key];
          }
          // Wait for the fill; a pinned key cannot be evicted, only abandoned (and then maybe
          // filled again by another thread, without this pin).
          while (pinned && !cache->Contains(key) && abandoned(key) == seen) {
            std::this_thread::yield();
          }
          pinned = pinned && abandoned(key) == seen;
        }
        if (pinned && !cache->Unpin(key).ok()) ++errors;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  const CacheStats s = cache->stats();
  EXPECT_EQ(s.requests, static_cast<uint64_t>(kThreads * kOps));
  EXPECT_EQ(s.pinned_slots, 0);
  EXPECT_EQ(s.filling_slots, 0);
  ExpectStatsAddUp(s);
}

TEST(ExpertCacheTest, ConcurrentUseKeepsTheInvariants) {
  for (const char* policy : {"lru", "s3fifo", "layer-reuse"}) {
    SCOPED_TRACE(policy);
    Hammer(policy);
  }
}

}  // namespace
}  // namespace k3
