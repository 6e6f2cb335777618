// The read engine on real files with both backends: byte-exact reads of arbitrary ranges,
// chunking, queue depth, priorities, cancellation and the ways of receiving completions.
#include "io/read_engine.h"

#include <algorithm>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "io/tsan_mutex.h"
#include "tests/io/io_test_util.h"
#include "tests/util/temp_dir.h"

namespace k3::io {
namespace {

using testing::MakeArena;
using testing::MakeFile;
using testing::MakeRequest;
using testing::OptionsFor;
using testing::SameBytes;
using testing::TestFile;

class ReadEngineTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { file_ = MakeFile(dir_ / "data.bin", kFileBytes, 7); }

  static constexpr size_t kFileBytes = (4 << 20) + 1234;  // not a multiple of the block size
  k3::testing::TempDir dir_;
  TestFile file_;
};

TEST_P(ReadEngineTest, ArbitraryRangesMatchTheFile) {
  ReadEngineOptions o = OptionsFor(GetParam());
  o.queue_depth = 8;
  o.chunk_bytes = 64 << 10;
  auto arena = MakeArena(64 << 20);
  o.arena = arena.get();
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(engine->file(*f).direct);

  constexpr int kReads = 120;
  constexpr uint64_t kSlot = 512 << 10;
  std::mt19937_64 rng(3);
  std::vector<std::pair<uint64_t, uint64_t>> ranges(kReads);
  for (int i = 0; i < kReads; ++i) {
    const uint64_t length = 1 + rng() % (kSlot - 8192);
    const uint64_t offset = rng() % (kFileBytes - length + 1);
    ranges[i] = {offset, length};
    auto id = engine->Submit(
        MakeRequest(*f, offset, length, arena->Slice(i * kSlot, kSlot), Priority::kDemand, i));
    ASSERT_TRUE(id.ok()) << id.status();
  }
  for (int i = 0; i < kReads; ++i) {
    auto r = engine->WaitAny();
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->status.ok()) << r->status;
    const auto [offset, length] = ranges[r->user_data];
    ASSERT_EQ(r->data.size(), length);
    EXPECT_EQ(r->data.data(), arena->data() + r->user_data * kSlot + offset % kDirectAlignment);
    EXPECT_TRUE(SameBytes(file_, offset, r->data)) << "read " << r->user_data;
  }
  EXPECT_EQ(engine->stats().completed, static_cast<uint64_t>(kReads));
  if (GetParam() == Backend::kUring) {
    EXPECT_TRUE(engine->buffers_registered());
  }
}

TEST_P(ReadEngineTest, ReadsIntoUnregisteredMemoryToo) {
  K3_CREATE_ENGINE_OR_SKIP(engine, OptionsFor(GetParam()));
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto buffer = MakeArena(1 << 20);  // an arena the engine does not know about
  auto data = engine->Read(MakeRequest(*f, 4095, 70000, buffer->Slice(0, 1 << 20)));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(SameBytes(file_, 4095, *data));
  EXPECT_FALSE(engine->buffers_registered());
}

TEST_P(ReadEngineTest, ReadsUpToTheUnalignedEndOfTheFile) {
  K3_CREATE_ENGINE_OR_SKIP(engine, OptionsFor(GetParam()));
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(8 << 20);
  for (uint64_t length : {1ul, 1234ul, 5000ul, static_cast<uint64_t>(kFileBytes)}) {
    const uint64_t offset = kFileBytes - length;
    auto data = engine->Read(MakeRequest(*f, offset, length, arena->Slice(0, 8 << 20)));
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_TRUE(SameBytes(file_, offset, *data)) << length;
  }
}

TEST_P(ReadEngineTest, SplitsLongReadsIntoChunks) {
  ReadEngineOptions o = OptionsFor(GetParam());
  o.chunk_bytes = 16 << 10;
  o.chunks_per_request = 4;
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(2 << 20);
  // 1 MiB at offset 100: the aligned superset is 1 MiB + 4 KiB = 64 chunks of 16 KiB and one
  // of 4 KiB.
  auto data = engine->Read(MakeRequest(*f, 100, 1 << 20, arena->Slice(0, 2 << 20)));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(SameBytes(file_, 100, *data));
  const ReadStats s = engine->stats();
  EXPECT_EQ(s.operations, 65u);
  EXPECT_EQ(s.bytes_read, (1u << 20) + 4096);
  EXPECT_LE(s.peak_operations_in_flight, 4);
  EXPECT_GE(s.peak_operations_in_flight, 1);
}

// Many requests against a device that keeps the first `depth` at the device until all are
// queued: the depth is the number of requests in flight, reached and never passed.
TEST_P(ReadEngineTest, QueueDepthBoundsRequestsInFlight) {
  for (int depth : {1, 32}) {
    ReadEngineOptions o = OptionsFor(GetParam());
    o.queue_depth = depth;
    o.faults = std::make_shared<FaultPlan>();
    o.faults->Hold(1, depth);
    K3_CREATE_ENGINE_OR_SKIP(engine, o);
    auto f = engine->OpenFile(file_.path);
    ASSERT_TRUE(f.ok());
    auto arena = MakeArena(32 * 8192);
    for (int i = 0; i < 32; ++i) {
      ASSERT_TRUE(engine
                      ->Submit(MakeRequest(*f, i * 1000, 4000, arena->Slice(i * 8192, 8192),
                                           Priority::kDemand, i))
                      .ok());
    }
    ASSERT_TRUE(o.faults->AwaitHeld(depth));
    o.faults->Release();
    for (int i = 0; i < 32; ++i) {
      auto r = engine->WaitAny();
      ASSERT_TRUE(r && r->status.ok());
      EXPECT_TRUE(SameBytes(file_, r->user_data * 1000, r->data));
    }
    EXPECT_EQ(engine->stats().peak_requests_in_flight, depth);
  }
}

// With one slot, taken by a prefetch at the device, the requests queued behind it are admitted
// by priority, not by arrival: the demand read submitted last goes next, the trunk read after
// it, the other prefetches last and in the order they came.
TEST_P(ReadEngineTest, DemandJumpsAheadOfQueuedPrefetches) {
  ReadEngineOptions o = OptionsFor(GetParam());
  o.queue_depth = 1;
  o.faults = std::make_shared<FaultPlan>();
  o.faults->Hold(1, 1);
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(8 * 8192);
  auto submit = [&](int i, Priority p) {
    ASSERT_TRUE(
        engine->Submit(MakeRequest(*f, i * 8192, 8192, arena->Slice(i * 8192, 8192), p, i)).ok());
  };
  submit(0, Priority::kPrefetch);
  // Everything else is queued while the first read is held at the device, so the order below
  // is the engine's choice and not how fast this thread submits against the engine's threads.
  ASSERT_TRUE(o.faults->AwaitHeld(1));
  for (int i = 1; i < 5; ++i) submit(i, Priority::kPrefetch);
  submit(5, Priority::kTrunk);
  submit(6, Priority::kDemand);
  o.faults->Release();
  std::vector<uint64_t> order;
  for (int i = 0; i < 7; ++i) {
    // A bound only for a broken engine (a prefetch admitted ahead of the trunk read would wait
    // for it forever): with nothing held, each read takes microseconds.
    auto r = engine->WaitAny(absl::Minutes(1));
    ASSERT_TRUE(r && r->status.ok()) << "after " << ::testing::PrintToString(order);
    order.push_back(r->user_data);
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 6, 5, 1, 2, 3, 4}));
  EXPECT_EQ(engine->stats().peak_requests_in_flight, 1);
}

// At depth 1 a prefetch of several chunks may hold the only slot when a demand read arrives.
// The demand read cannot be admitted until the prefetch ends, so the prefetch's remaining
// chunks must still go out (holding them back for the queued demand read deadlocked both).
TEST_P(ReadEngineTest, ADemandReadQueuedBehindAPrefetchHoldingTheOnlySlotLetsItFinish) {
  ReadEngineOptions o = OptionsFor(GetParam());
  o.queue_depth = 1;
  o.chunk_bytes = 64 << 10;
  o.chunks_per_request = 1;
  o.faults = std::make_shared<FaultPlan>();
  o.faults->Hold(1, 1);
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(2 << 20);
  ASSERT_TRUE(engine
                  ->Submit(MakeRequest(*f, 0, 256 << 10, arena->Slice(0, 256 << 10),
                                       Priority::kPrefetch, 0))
                  .ok());
  ASSERT_TRUE(o.faults->AwaitHeld(1));  // its first chunk is at the device, three to go
  ASSERT_TRUE(engine
                  ->Submit(MakeRequest(*f, 1 << 20, 8192, arena->Slice(1 << 20, 8192),
                                       Priority::kDemand, 1))
                  .ok());
  o.faults->Release();
  std::vector<uint64_t> order;
  for (int i = 0; i < 2; ++i) {
    auto r = engine->WaitAny(absl::Minutes(1));  // a bound only for a deadlocked engine
    ASSERT_TRUE(r && r->status.ok()) << "after " << ::testing::PrintToString(order);
    EXPECT_TRUE(SameBytes(file_, r->user_data << 20, r->data));
    order.push_back(r->user_data);
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 1}));
}

TEST_P(ReadEngineTest, PrefetchesNeverTakeEverySlot) {
  ReadEngineOptions o = OptionsFor(GetParam());
  o.queue_depth = 4;  // at most 2 prefetches in flight
  o.faults = std::make_shared<FaultPlan>();
  o.faults->Hold(1, 2);  // the two prefetches admitted first stay at the device
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(9 * 8192);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(engine
                    ->Submit(MakeRequest(*f, i * 8192, 100, arena->Slice(i * 8192, 8192),
                                         Priority::kPrefetch, i))
                    .ok());
  }
  ASSERT_TRUE(o.faults->AwaitHeld(2));
  // Admitted next to them and served while neither has landed: the prefetches did not take
  // the slots, and the demand waited for none of them.
  auto demand = engine->Read(MakeRequest(*f, 0, 100, arena->Slice(8 * 8192, 8192)));
  ASSERT_TRUE(demand.ok()) << demand.status();
  EXPECT_TRUE(SameBytes(file_, 0, *demand));
  EXPECT_EQ(engine->stats().completed, 1u);
  EXPECT_EQ(engine->stats().peak_requests_in_flight, 3);
  o.faults->Release();
  for (int i = 0; i < 8; ++i) {
    auto r = engine->WaitAny();
    ASSERT_TRUE(r && r->status.ok());
  }
}

// Guesses use the disk's idle time: at most max_prefetch_chunks of their chunks are at the
// device, and a demand read submitted behind a long backlog of them is served first.
TEST_P(ReadEngineTest, PrefetchChunksAreCappedAndYieldToDemand) {
  ReadEngineOptions o = OptionsFor(GetParam());
  o.queue_depth = 8;
  o.chunk_bytes = 16 << 10;
  o.chunks_per_request = 8;
  o.max_prefetch_chunks = 2;
  o.faults = std::make_shared<FaultPlan>();
  o.faults->Hold(1, 2);  // the first two prefetch chunks stay at the device
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  constexpr uint64_t kBytes = 128 << 10;  // 8 chunks
  auto arena = MakeArena(5 * kBytes);
  for (int i = 0; i < 4; ++i) {  // 32 prefetch chunks, all four requests admitted
    ASSERT_TRUE(engine
                    ->Submit(MakeRequest(*f, i * kBytes, kBytes, arena->Slice(i * kBytes, kBytes),
                                         Priority::kPrefetch, i))
                    .ok());
  }
  ASSERT_TRUE(o.faults->AwaitHeld(2));
  EXPECT_EQ(engine->stats().operations, 2u) << "the cap, with 30 chunks waiting";
  auto demand = engine->Read(MakeRequest(*f, 4 * kBytes, kBytes, arena->Slice(4 * kBytes, kBytes)));
  ASSERT_TRUE(demand.ok()) << demand.status();
  EXPECT_TRUE(SameBytes(file_, 4 * kBytes, *demand));
  EXPECT_FALSE(engine->Poll().has_value()) << "a prefetch chunk went out before the demand's";
  EXPECT_EQ(engine->stats().operations, 2u + 8u);
  o.faults->Release();
  for (int i = 0; i < 4; ++i) {
    auto r = engine->WaitAny();
    ASSERT_TRUE(r && r->status.ok());
    EXPECT_TRUE(SameBytes(file_, r->user_data * kBytes, r->data));
  }
  EXPECT_LE(engine->stats().peak_operations_in_flight, 2 + 8);
}

TEST_P(ReadEngineTest, CancelsQueuedAndInFlightPrefetches) {
  ReadEngineOptions o = OptionsFor(GetParam());
  o.queue_depth = 1;
  o.max_prefetch_in_flight = 1;
  o.faults = std::make_shared<FaultPlan>();
  o.faults->Hold(1, 1);  // the first stays in flight until it has been cancelled
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(4 * 8192);
  std::vector<ReadId> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = engine->Submit(
        MakeRequest(*f, i * 8192, 8192, arena->Slice(i * 8192, 8192), Priority::kPrefetch, i));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE(o.faults->AwaitHeld(1));
  // Queued: done at once, while the read in flight has not landed.
  EXPECT_TRUE(engine->Cancel(ids[2]));
  EXPECT_EQ(engine->Wait(ids[2]).status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(engine->Cancel(ids[0]));  // in flight: completes when its chunk lands
  o.faults->Release();
  EXPECT_EQ(engine->Wait(ids[0]).status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(engine->Wait(ids[1]).status.ok());
  EXPECT_TRUE(engine->Wait(ids[3]).status.ok());
  EXPECT_FALSE(engine->Cancel(ids[3]));  // already complete
  EXPECT_EQ(engine->stats().cancelled, 2u);
}

TEST_P(ReadEngineTest, CancelPrefetchesByUserData) {
  ReadEngineOptions o = OptionsFor(GetParam());
  o.queue_depth = 1;
  o.faults = std::make_shared<FaultPlan>();
  o.faults->Hold(1, 1);  // the first guess stays in flight: none completes before the cancel
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(7 * 8192);
  for (int i = 0; i < 6; ++i) {  // user_data: the layer the guess was for
    ASSERT_TRUE(engine
                    ->Submit(MakeRequest(*f, 0, 8192, arena->Slice(i * 8192, 8192),
                                         Priority::kPrefetch, i % 2))
                    .ok());
  }
  ASSERT_TRUE(engine->Submit(MakeRequest(*f, 0, 8192, arena->Slice(6 * 8192, 8192))).ok());
  EXPECT_EQ(engine->CancelPrefetches([](uint64_t layer) { return layer == 0; }), 3);
  o.faults->Release();
  int ok = 0, cancelled = 0;
  for (int i = 0; i < 7; ++i) {
    auto r = engine->WaitAny();
    ASSERT_TRUE(r.has_value());
    if (r->status.ok()) ++ok;
    if (r->status.code() == absl::StatusCode::kCancelled) {
      ++cancelled;
      EXPECT_EQ(r->user_data, 0u);
    }
  }
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(cancelled, 3);
}

TEST_P(ReadEngineTest, CallbacksRunOnAnEngineThread) {
  K3_CREATE_ENGINE_OR_SKIP(engine, OptionsFor(GetParam()));
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(16 * 65536);
  absl::Mutex mu;
  std::vector<ReadResult> results;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 16; ++i) {
    ReadRequest r =
        MakeRequest(*f, i * 50000 + 3, 50000, arena->Slice(i * 65536, 65536), Priority::kDemand, i);
    r.on_complete = [&](ReadResult result) {
      k3::io::AnnotatedMutexLock lock(&mu);
      results.push_back(std::move(result));
      threads.push_back(std::this_thread::get_id());
    };
    auto id = engine->Submit(std::move(r));
    ASSERT_TRUE(id.ok());
    // InvalidArgument while in flight, NotFound once delivered: never a result.
    if (i == 0) {
      EXPECT_FALSE(engine->Wait(*id).status.ok());
    }
  }
  k3::io::AnnotatedMutexLock lock(&mu);
  k3::io::Await(mu, absl::Condition(
                        +[](std::vector<ReadResult>* v) { return v->size() == 16; }, &results));
  for (const ReadResult& r : results) {
    ASSERT_TRUE(r.status.ok());
    EXPECT_TRUE(SameBytes(file_, r.user_data * 50000 + 3, r.data));
  }
  for (std::thread::id t : threads) EXPECT_NE(t, std::this_thread::get_id());
  EXPECT_FALSE(engine->Poll().has_value());  // callbacks bypass the completion queue
}

TEST_P(ReadEngineTest, AnotherThreadConsumesCompletions) {
  K3_CREATE_ENGINE_OR_SKIP(engine, OptionsFor(GetParam()));
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(64 * 32768);
  int good = 0;
  std::thread consumer([&] {
    for (int i = 0; i < 64; ++i) {
      auto r = engine->WaitAny(absl::Seconds(10));
      if (r && r->status.ok() && SameBytes(file_, r->user_data * 7777, r->data)) ++good;
    }
  });
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(engine
                    ->Submit(MakeRequest(*f, i * 7777, 20000, arena->Slice(i * 32768, 32768),
                                         Priority::kDemand, i))
                    .ok());
  }
  consumer.join();
  EXPECT_EQ(good, 64);
}

TEST_P(ReadEngineTest, WaitsForOneRequestAmongMany) {
  K3_CREATE_ENGINE_OR_SKIP(engine, OptionsFor(GetParam()));
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(8 * 65536);
  std::vector<ReadId> ids;
  for (int i = 0; i < 8; ++i) {
    auto id = engine->Submit(
        MakeRequest(*f, i * 60000, 60000, arena->Slice(i * 65536, 65536), Priority::kDemand, i));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  ReadResult r = engine->Wait(ids[5]);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.user_data, 5u);
  EXPECT_TRUE(SameBytes(file_, 5 * 60000, r.data));
  EXPECT_EQ(engine->Wait(ids[5]).status.code(), absl::StatusCode::kNotFound);  // claimed
  int rest = 0;
  while (auto other = engine->WaitAny(absl::Seconds(5))) {
    EXPECT_NE(other->user_data, 5u);
    if (++rest == 7) break;
  }
  EXPECT_EQ(rest, 7);
  EXPECT_FALSE(engine->Poll().has_value());
}

TEST_P(ReadEngineTest, RejectsBadRequests) {
  K3_CREATE_ENGINE_OR_SKIP(engine, OptionsFor(GetParam()));
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(1 << 20);
  auto code = [&](ReadRequest r) { return engine->Submit(std::move(r)).status().code(); };
  EXPECT_EQ(code(MakeRequest(*f, 0, 100, arena->Slice(0, 8192).subspan(8))),
            absl::StatusCode::kInvalidArgument);  // unaligned buffer
  EXPECT_EQ(code(MakeRequest(*f, 100, 4096, arena->Slice(0, 4096))),
            absl::StatusCode::kInvalidArgument);  // needs two blocks
  EXPECT_EQ(code(MakeRequest(*f + 1, 0, 100, arena->Slice(0, 4096))),
            absl::StatusCode::kInvalidArgument);  // unknown file
  EXPECT_EQ(code(MakeRequest(*f, kFileBytes - 10, 11, arena->Slice(0, 8192))),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(engine->OpenFile(dir_ / "missing").status().code(), absl::StatusCode::kNotFound);
  auto empty = engine->Read(MakeRequest(*f, 5, 0, arena->Slice(0, 4096)));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST_P(ReadEngineTest, ShutdownWithReadsInFlightCancelsThem) {
  auto arena = MakeArena(32 * 8192);
  std::atomic<int> cancelled{0};
  {
    ReadEngineOptions o = OptionsFor(GetParam());
    o.queue_depth = 2;
    o.faults = std::make_shared<FaultPlan>();
    o.faults->Hold(1, -1);  // never released: the engine's shutdown lets them go
    K3_CREATE_ENGINE_OR_SKIP(engine, o);
    auto f = engine->OpenFile(file_.path);
    ASSERT_TRUE(f.ok());
    for (int i = 0; i < 32; ++i) {
      ReadRequest r = MakeRequest(*f, 0, 8192, arena->Slice(i * 8192, 8192));
      if (i % 2 == 0) {
        r.on_complete = [&](ReadResult res) {
          if (res.status.code() == absl::StatusCode::kCancelled) ++cancelled;
        };
      }
      ASSERT_TRUE(engine->Submit(std::move(r)).ok());
    }
    ASSERT_TRUE(o.faults->AwaitHeld(2));  // two in flight, thirty queued, none done
  }
  EXPECT_EQ(cancelled.load(), 16);
}

INSTANTIATE_TEST_SUITE_P(Backends, ReadEngineTest,
                         ::testing::Values(Backend::kUring, Backend::kPread), testing::BackendName);

}  // namespace
}  // namespace k3::io
