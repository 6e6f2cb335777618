// Fault injection against real files, with both backends: transient faults are retried and the
// bytes are right; permanent ones fail with an error naming the file and the offset.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/read_engine.h"
#include "tests/io/io_test_util.h"
#include "tests/util/temp_dir.h"

namespace k3::io {
namespace {

using ::testing::HasSubstr;
using testing::MakeArena;
using testing::MakeFile;
using testing::MakeRequest;
using testing::OptionsFor;
using testing::SameBytes;
using testing::TestFile;

class FaultsTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    file_ = MakeFile(dir_ / "shard.bin", kFileBytes, 11);
    arena_ = MakeArena(2 << 20);
  }

  ReadEngineOptions Options() {
    ReadEngineOptions o = OptionsFor(GetParam());
    o.chunk_bytes = 64 << 10;
    o.queue_depth = 1;
    o.chunks_per_request = 1;  // one attempt at a time: attempt numbers are deterministic
    o.retry_backoff = absl::Microseconds(200);
    o.faults = faults_;
    return o;
  }

  // Reads [offset, offset + length) and checks the bytes when it succeeds.
  absl::Status ReadAndCheck(ReadEngine& engine, uint64_t offset, uint64_t length) {
    auto f = engine.OpenFile(file_.path);
    if (!f.ok()) return f.status();
    auto data = engine.Read(MakeRequest(*f, offset, length, arena_->Slice(0, 2 << 20)));
    if (!data.ok()) return data.status();
    EXPECT_TRUE(SameBytes(file_, offset, *data));
    return absl::OkStatus();
  }

  static constexpr size_t kFileBytes = 1 << 20;
  k3::testing::TempDir dir_;
  TestFile file_;
  std::unique_ptr<BufferArena> arena_;
  std::shared_ptr<FaultPlan> faults_ = std::make_shared<FaultPlan>();
};

TEST_P(FaultsTest, TransientIoErrorIsRetried) {
  faults_->FailAttempts(3, 1, EIO);
  K3_CREATE_ENGINE_OR_SKIP(engine, Options());
  EXPECT_TRUE(ReadAndCheck(*engine, 1000, 900000).ok());
  EXPECT_EQ(engine->stats().error_retries, 1u);
  EXPECT_EQ(faults_->injected(), 1);
}

TEST_P(FaultsTest, EintrAndEagainAreRetried) {
  faults_->FailAttempts(1, 3, EINTR).FailAttempts(6, 2, EAGAIN);
  K3_CREATE_ENGINE_OR_SKIP(engine, Options());
  EXPECT_TRUE(ReadAndCheck(*engine, 77, 500000).ok());
  EXPECT_EQ(engine->stats().transient_retries, 5u);
  EXPECT_EQ(engine->stats().error_retries, 0u);
}

TEST_P(FaultsTest, ShortReadsAreResubmittedForTheRest) {
  faults_->ShortReads(5000);  // every attempt: more than a block, not block-aligned
  ReadEngineOptions o = Options();
  o.queue_depth = 4;
  o.chunks_per_request = 4;
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  EXPECT_TRUE(ReadAndCheck(*engine, 333, 700001).ok());
  EXPECT_GT(engine->stats().short_reads, 100u);
}

TEST_P(FaultsTest, TinyShortReadsOnABufferedFileStillProgress) {
  faults_->ShortReads(777);
  ReadEngineOptions o = Options();
  o.direct = false;  // buffered reads may resume at any byte
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  EXPECT_TRUE(ReadAndCheck(*engine, 5, 100000).ok());
}

TEST_P(FaultsTest, ShortReadsWithoutProgressFail) {
  faults_->ShortReads(100);  // below the block size: O_DIRECT can never resume past it
  K3_CREATE_ENGINE_OR_SKIP(engine, Options());
  absl::Status s = ReadAndCheck(*engine, 0, 10000);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr(file_.path));
}

TEST_P(FaultsTest, PermanentErrorNamesFileAndOffset) {
  faults_->FailAtOffset(300000, EIO);  // a bad sector: every read covering it fails
  K3_CREATE_ENGINE_OR_SKIP(engine, Options());
  absl::Status s = ReadAndCheck(*engine, 1000, 900000);
  ASSERT_FALSE(s.ok());
  const std::string msg(s.message());
  EXPECT_THAT(msg, HasSubstr(file_.path));
  EXPECT_THAT(msg, HasSubstr("at offset 262144"));  // the 64 KiB chunk holding byte 300000
  EXPECT_THAT(msg, HasSubstr("Input/output error"));
  EXPECT_THAT(msg, HasSubstr("after 3 retries"));
  EXPECT_EQ(engine->stats().failed, 1u);
}

TEST_P(FaultsTest, PermanentErrorOnOneReadLeavesOthersIntact) {
  faults_->FailAtOffset(65536 * 5, EBADMSG);  // not retryable: fails at once
  ReadEngineOptions o = Options();
  o.queue_depth = 4;
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto bad = engine->Read(MakeRequest(*f, 65536 * 4, 65536 * 2, arena_->Slice(0, 1 << 20)));
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(engine->stats().error_retries, 0u);
  auto good = engine->Read(MakeRequest(*f, 0, 65536, arena_->Slice(1 << 20, 1 << 20)));
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(SameBytes(file_, 0, *good));
}

TEST_P(FaultsTest, FileTruncatedAfterOpenIsDataLoss) {
  K3_CREATE_ENGINE_OR_SKIP(engine, Options());
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(::truncate(file_.path.c_str(), 200000), 0);
  auto data = engine->Read(MakeRequest(*f, 150000, 100000, arena_->Slice(0, 1 << 20)));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  const std::string msg(data.status().message());
  EXPECT_THAT(msg, HasSubstr(file_.path));
  EXPECT_THAT(msg, HasSubstr("unexpected end of file"));
  EXPECT_THAT(msg, HasSubstr("200000 bytes now"));
  // What is still there reads fine.
  auto head = engine->Read(MakeRequest(*f, 100, 150000, arena_->Slice(0, 1 << 20)));
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_TRUE(SameBytes(file_, 100, *head));
}

TEST_P(FaultsTest, SlowReadsArriveLateButRight) {
  faults_->Slow(absl::Milliseconds(15));
  // Four requests of three chunks each go to the device together, not one slow read after
  // another: the plan keeps each chunk there, and all twelve are there at once.
  faults_->Hold(1, 12);
  ReadEngineOptions o = Options();
  o.queue_depth = 4;
  o.chunks_per_request = 8;
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  ReadId ids[4];
  for (int i = 0; i < 4; ++i) {
    auto id =
        engine->Submit(MakeRequest(*f, i * 200000 + 1, 150000, arena_->Slice(i * 262144, 262144)));
    ASSERT_TRUE(id.ok());
    ids[i] = *id;
  }
  ASSERT_TRUE(faults_->AwaitHeld(12));
  faults_->Release();
  for (int i = 0; i < 4; ++i) {
    ReadResult r = engine->Wait(ids[i]);
    ASSERT_TRUE(r.status.ok());
    EXPECT_TRUE(SameBytes(file_, i * 200000 + 1, r.data));
    EXPECT_GE(r.latency, absl::Milliseconds(15));  // a lower bound: the load can only add
  }
}

TEST_P(FaultsTest, HeldReadsStayInFlightUntilReleased) {
  faults_->Hold(1, 1).Hold(2, 1);
  K3_CREATE_ENGINE_OR_SKIP(engine, Options());
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto id = engine->Submit(MakeRequest(*f, 10, 1000, arena_->Slice(0, 8192)));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(faults_->AwaitHeld(1));
  EXPECT_FALSE(engine->Poll().has_value());
  faults_->Release();
  ReadResult r = engine->Wait(*id);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(SameBytes(file_, 10, r.data));
  // Released for good: the second attempt runs through although a rule covers it.
  EXPECT_TRUE(ReadAndCheck(*engine, 5000, 1000).ok());
  EXPECT_EQ(faults_->attempts(), 2);
  EXPECT_EQ(faults_->injected(), 0);
}

TEST_P(FaultsTest, EinvalFromADirectReadFallsBackToBufferedReads) {
  faults_->FailAttempts(1, 1, EINVAL);
  ReadEngineOptions o = Options();
  o.notices = false;
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(engine->file(*f).direct);
  auto data = engine->Read(MakeRequest(*f, 10, 200000, arena_->Slice(0, 1 << 20)));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(SameBytes(file_, 10, *data));
  EXPECT_FALSE(engine->file(*f).direct);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultsTest, ::testing::Values(Backend::kUring, Backend::kPread),
                         testing::BackendName);

}  // namespace
}  // namespace k3::io
