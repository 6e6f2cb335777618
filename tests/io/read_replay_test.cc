// The read log and its replay (k3 bench's I/O floor): the log holds what was read while it
// recorded, in the order it was asked for; the replay reads the same bytes at the run's queue
// depth, and an emulated volume's bandwidth bounds it from below.
#include "io/read_replay.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <vector>

#include "gtest/gtest.h"
#include "tests/io/io_test_util.h"
#include "tests/util/temp_dir.h"

namespace k3::io {
namespace {

using testing::MakeArena;
using testing::MakeFile;
using testing::MakeRequest;
using testing::OptionsFor;
using testing::TestFile;

constexpr uint64_t kSlot = 256 << 10;

class ReadReplayTest : public ::testing::Test {
 protected:
  void SetUp() override { file_ = MakeFile(dir_ / "data.bin", kFileBytes, 5); }

  static constexpr size_t kFileBytes = 4 << 20;
  k3::testing::TempDir dir_;
  TestFile file_;
};

// Reads `n` ranges of `length` bytes at offsets 0, 300 KiB, ... and waits for them all.
void ReadAll(ReadEngine& engine, FileId f, const BufferArena& arena, int first, int n,
             uint64_t length, Priority priority = Priority::kDemand) {
  for (int i = first; i < first + n; ++i) {
    auto id = engine.Submit(MakeRequest(f, i * (300ull << 10), length,
                                        arena.Slice((i % 8) * kSlot, kSlot), priority, i));
    ASSERT_TRUE(id.ok()) << id.status();
    engine.Wait(*id);
  }
}

TEST_F(ReadReplayTest, TheLogHoldsTheReadsDeliveredWhileItRecordedInTheOrderAsked) {
  ReadEngineOptions o = OptionsFor(Backend::kPread);
  auto faults = std::make_shared<FaultPlan>();
  faults->FailAtOffset(3 * (300ull << 10) + 10, EINVAL);  // read 3 fails for good
  o.faults = faults;
  auto arena = MakeArena(8 * kSlot);
  K3_CREATE_ENGINE_OR_SKIP(engine, o);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok()) << f.status();
  ReadAll(*engine, *f, *arena, 0, 2, 1000);  // before the log: not in it
  engine->StartLog();
  ReadAll(*engine, *f, *arena, 2, 3, 5000, Priority::kPrefetch);
  ReadAll(*engine, *f, *arena, 5, 2, 7000, Priority::kTrunk);
  const std::vector<LoggedRead> log = engine->TakeLog();
  ReadAll(*engine, *f, *arena, 7, 1, 1000);  // after: not in it
  ASSERT_EQ(log.size(), 4u);                 // reads 2, 4 (3 failed), 5, 6
  const uint64_t offsets[] = {2, 4, 5, 6};
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i].file, *f);
    EXPECT_EQ(log[i].offset, offsets[i] * (300ull << 10));
    EXPECT_EQ(log[i].length, i < 2 ? 5000u : 7000u);
    EXPECT_EQ(log[i].priority, i < 2 ? Priority::kPrefetch : Priority::kTrunk);
  }
  EXPECT_TRUE(engine->TakeLog().empty());
}

TEST_F(ReadReplayTest, TheReplayReadsTheLoggedBytesAtTheQueueDepthNoFasterThanTheVolume) {
  ReadLog log{
      .paths = {file_.path}, .reads = {}, .options = {.engine = OptionsFor(Backend::kAuto)}};
  for (int i = 0; i < 12; ++i) {
    log.reads.push_back({.file = 0, .offset = i * (300ull << 10) + 7, .length = 200 << 10});
  }
  log.options.engine.queue_depth = 4;
  auto profile = ParseStorageProfile("bw=40MB/s");
  ASSERT_TRUE(profile.ok()) << profile.status();
  log.options.engine.profile = *profile;
  auto replay = ReplayReadLog(log);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->bytes, 12u * (200 << 10));
  EXPECT_EQ(replay->reads, 12);
  EXPECT_EQ(replay->concurrency, 4);
  // The emulated pipe passes at most 40 MB/s (aligned bytes, so a little more than requested):
  // a lower bound that load on the machine can only raise.
  EXPECT_GE(replay->seconds, static_cast<double>(replay->bytes) / 40e6);

  // Buffers for two requests at most: two in flight.
  auto capped = ReplayReadLog(log, 2 * BufferBytesFor(7, 200 << 10));
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->concurrency, 2);
  EXPECT_EQ(capped->bytes, replay->bytes);
}

TEST_F(ReadReplayTest, TheLogIsReplayedWhileAskedAndTheFastestReplayIsTheFloor) {
  ReadLog log{
      .paths = {file_.path}, .reads = {}, .options = {.engine = OptionsFor(Backend::kAuto)}};
  for (int i = 0; i < 6; ++i) {
    log.reads.push_back({.file = 0, .offset = i * (300ull << 10), .length = 100 << 10});
  }
  log.options.engine.queue_depth = 2;
  auto profile = ParseStorageProfile("bw=40MB/s");
  ASSERT_TRUE(profile.ok()) << profile.status();
  log.options.engine.profile = *profile;
  std::vector<size_t> asked;  // how many replays each question saw
  auto replay = ReplayReadLog(log, 1ull << 30, [&](const std::vector<double>& seconds) {
    asked.push_back(seconds.size());
    return seconds.size() < 3;
  });
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(asked, (std::vector<size_t>{1, 2, 3}));
  ASSERT_EQ(replay->replay_seconds.size(), 3u);
  EXPECT_EQ(replay->seconds,
            *std::min_element(replay->replay_seconds.begin(), replay->replay_seconds.end()));
  EXPECT_EQ(replay->bytes, 6u * (100 << 10));  // one replay's bytes
  EXPECT_EQ(replay->concurrency, 2);
  for (double s : replay->replay_seconds) EXPECT_GE(s, static_cast<double>(replay->bytes) / 40e6);

  // Without a question: once.
  auto once = ReplayReadLog(log);
  ASSERT_TRUE(once.ok()) << once.status();
  EXPECT_EQ(once->replay_seconds.size(), 1u);
  EXPECT_EQ(once->seconds, once->replay_seconds[0]);
}

// The replay reads over the run's drives (a volume with its own profile holds a copy here), and
// says what each did in the fastest replay: their bytes are the log's.
TEST_F(ReadReplayTest, TheReplayReadsOverTheLogsVolumesAndSaysWhatEachDriveDid) {
  std::filesystem::create_directories(dir_ / "volume");
  std::filesystem::create_hard_link(file_.path, dir_ / "volume/data.bin");
  ReadLog log{
      .paths = {file_.path}, .reads = {}, .options = {.engine = OptionsFor(Backend::kAuto)}};
  for (int i = 0; i < 8; ++i) {
    log.reads.push_back({.file = 0, .offset = i * (300ull << 10), .length = 200 << 10});
  }
  log.options.engine.queue_depth = 4;
  auto volume = ParseVolume(dir_ / "volume@bw=400MB/s");
  ASSERT_TRUE(volume.ok()) << volume.status();
  log.options.volumes = {*volume};
  auto replay = ReplayReadLog(log, 1ull << 30, [](const auto& s) { return s.size() < 2; });
  ASSERT_TRUE(replay.ok()) << replay.status();
  ASSERT_EQ(replay->devices.size(), 2u);
  EXPECT_EQ(replay->devices[1].id, dir_ / "volume");
  uint64_t bytes = 0;
  int64_t reads = 0;
  for (const DeviceReport& d : replay->devices) {
    bytes += d.bytes;
    reads += d.reads;
  }
  EXPECT_EQ(bytes, replay->bytes);
  EXPECT_GE(reads, replay->reads);  // a read may be split over the drives
}

TEST(DevicesSinceTest, CountersAreTheDifferenceAndANewDeviceCountsWhole) {
  const std::vector<DeviceReport> before = {
      {.id = "8:0", .bytes = 100, .reads = 2, .busy_seconds = 1.0, .rate = 5, .failovers = 1}};
  const std::vector<DeviceReport> after = {
      {.id = "8:0", .bytes = 350, .reads = 7, .busy_seconds = 1.5, .rate = 9, .failovers = 1},
      {.id = "/mnt/b", .bytes = 40, .reads = 1, .busy_seconds = 0.25, .rate = 3}};
  const std::vector<DeviceReport> d = DevicesSince(before, after);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].bytes, 250u);
  EXPECT_EQ(d[0].reads, 5);
  EXPECT_DOUBLE_EQ(d[0].busy_seconds, 0.5);
  EXPECT_EQ(d[0].failovers, 0);
  EXPECT_EQ(d[0].rate, 9);  // as it is now
  EXPECT_EQ(d[1].bytes, 40u);
  EXPECT_DOUBLE_EQ(d[1].busy_seconds, 0.25);
}

TEST_F(ReadReplayTest, AnEmptyLogTakesNoTimeAndABadOneIsRefused) {
  ReadLog log{.paths = {file_.path}, .reads = {}, .options = {}};
  auto empty = ReplayReadLog(log);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->seconds, 0);
  EXPECT_EQ(empty->bytes, 0u);
  EXPECT_TRUE(empty->replay_seconds.empty());
  log.reads.push_back({.file = 3, .offset = 0, .length = 10});
  EXPECT_EQ(ReplayReadLog(log).status().code(), absl::StatusCode::kInvalidArgument);
  log.reads[0] = {.file = 0, .offset = kFileBytes - 5, .length = 10};  // past the end
  EXPECT_FALSE(ReplayReadLog(log).ok());
}

}  // namespace
}  // namespace k3::io
