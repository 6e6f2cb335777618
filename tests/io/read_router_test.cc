// The read router against real files: copies in volume directories, each directory with its own
// emulated profile counted as a drive; reads split over them in proportion to their rates and
// land byte-exact; a failing or vanished copy is read again elsewhere with one warning; stripes
// are read instead of the file for the ranges they hold.
#include "io/read_router.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "tests/io/io_test_util.h"
#include "tests/util/temp_dir.h"

namespace k3::io {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeArena;
using testing::MakeFile;
using testing::MakeRequest;
using testing::SameBytes;
using ::testing::SizeIs;
using testing::TestFile;

constexpr size_t kFileBytes = 16 << 20;
constexpr uint64_t kReadBytes = 8 << 20;

class ReadRouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_ / "model");
    file_ = MakeFile(dir_ / "model/shard.bin", kFileBytes, 5);
    arena_ = MakeArena(kReadBytes + (64 << 10));
  }

  // A volume directory holding a copy of the shard (a hard link, or bytes of its own).
  std::string Volume(const std::string& name, bool link = true) {
    const std::string vol = dir_ / name;
    std::filesystem::create_directories(vol);
    if (link) {
      std::filesystem::create_hard_link(file_.path, vol + "/shard.bin");
    } else {
      std::filesystem::copy_file(file_.path, vol + "/shard.bin");
    }
    return vol;
  }

  ReadRouterOptions Options(std::vector<std::string> specs) {
    ReadRouterOptions o;
    o.engine.notices = false;
    o.engine.chunk_bytes = 1 << 20;
    o.engine.retry_backoff = absl::Microseconds(100);
    o.engine.faults = faults_;
    o.on_warning = [this](const std::string& w) { warnings_.push_back(w); };
    for (const std::string& spec : specs) {
      auto v = ParseVolume(spec);
      EXPECT_TRUE(v.ok()) << v.status();
      if (v.ok()) o.volumes.push_back(*v);
    }
    return o;
  }

  std::unique_ptr<ReadRouter> Open(const ReadRouterOptions& o, std::vector<Extent> stripes = {}) {
    auto router = ReadRouter::Create(o);
    EXPECT_TRUE(router.ok()) << router.status();
    if (!router.ok()) return nullptr;
    auto id = (*router)->OpenFile(file_.path, std::move(stripes));
    EXPECT_TRUE(id.ok()) << id.status();
    file_id_ = id.ok() ? *id : -1;
    return *std::move(router);
  }

  absl::Status ReadAndCheck(ReadRouter& router, uint64_t offset, uint64_t length) {
    auto data =
        router.Read(MakeRequest(file_id_, offset, length, arena_->Slice(0, arena_->size())));
    if (!data.ok()) return data.status();
    if (!SameBytes(file_, offset, *data)) return absl::DataLossError("wrong bytes");
    return absl::OkStatus();
  }

  k3::testing::TempDir dir_;
  TestFile file_;
  FileId file_id_ = -1;
  std::unique_ptr<BufferArena> arena_;
  std::shared_ptr<FaultPlan> faults_ = std::make_shared<FaultPlan>();
  std::vector<std::string> warnings_;
};

TEST(ParseVolumeTest, ADirectoryWithOrWithoutItsOwnProfile) {
  auto plain = ParseVolume("/mnt/b/k3/");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->dir, "/mnt/b/k3");
  EXPECT_FALSE(plain->profile.has_value());
  auto own = ParseVolume("/mnt/b/k3@bw=1000MB/s,lat=100us");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->dir, "/mnt/b/k3");
  ASSERT_TRUE(own->profile.has_value());
  EXPECT_DOUBLE_EQ(own->profile->bytes_per_second, 1e9);
  EXPECT_EQ(own->profile->latency, absl::Microseconds(100));
  EXPECT_FALSE(ParseVolume("@network").ok());
  auto bad = ParseVolume("/mnt/b@warp=9");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("/mnt/b@warp=9"));
}

TEST_F(ReadRouterTest, ALongReadIsSplitOverTheDrivesInProportionToTheirRates) {
  const std::string a = Volume("a"), b = Volume("b");
  ReadRouterOptions o = Options({a + "@bw=300MB/s", b + "@bw=100MB/s"});
  o.min_part_bytes = 64 << 10;
  auto router = Open(o);
  ASSERT_NE(router, nullptr);
  EXPECT_THAT(router->copies(file_id_), ElementsAre(a + "/shard.bin", b + "/shard.bin"));
  // The model's own directory is a third drive (unmeasured: assumed 2 GB/s), so the shares are
  // 2000 : 300 : 100 of the read, rounded to 4 KiB.
  ASSERT_TRUE(ReadAndCheck(*router, 12345, kReadBytes).ok());
  const std::vector<DeviceReport> devices = router->devices();
  ASSERT_THAT(devices, SizeIs(3));
  EXPECT_EQ(devices[1].id, a);
  EXPECT_EQ(devices[2].id, b);
  EXPECT_EQ(devices[0].bytes + devices[1].bytes + devices[2].bytes, kReadBytes);
  EXPECT_NEAR(static_cast<double>(devices[1].bytes), kReadBytes * 300.0 / 2400, 8192);
  EXPECT_NEAR(static_cast<double>(devices[2].bytes), kReadBytes * 100.0 / 2400, 8192);
  EXPECT_THAT(warnings_, SizeIs(0));
}

TEST_F(ReadRouterTest, ReadsOfEverySizeAndOffsetAreExact) {
  const std::string a = Volume("a"), b = Volume("b", /*link=*/false);
  ReadRouterOptions o = Options({a + "@bw=2000MB/s", b + "@bw=2000MB/s"});
  o.min_part_bytes = 64 << 10;
  auto router = Open(o);
  ASSERT_NE(router, nullptr);
  for (uint64_t offset : {0ul, 1ul, 4095ul, 4096ul, 777777ul}) {
    for (uint64_t length : {0ul, 1ul, 4096ul, 100000ul, 3ul << 20, kReadBytes - 4096}) {
      EXPECT_TRUE(ReadAndCheck(*router, offset, length).ok()) << offset << " " << length;
    }
  }
  for (const DeviceReport& d : router->devices()) EXPECT_GT(d.bytes, 0u) << d.id;
}

TEST_F(ReadRouterTest, WithSeveralDrivesEachKeepsFewPartsInFlightAndTheRestWait) {
  const std::string a = Volume("a");
  ReadRouterOptions o = Options({a + "@bw=1000MB/s"});
  o.engine.profile = *ParseStorageProfile("bw=1000MB/s");
  o.min_part_bytes = 256 << 10;
  auto router = Open(o);
  ASSERT_NE(router, nullptr);
  // 24 reads of 512 KiB at once, each split over the two drives: 24 parts a drive, of which
  // at most 4 are ever at its engine.
  constexpr int kReads = 24;
  constexpr uint64_t kBytes = 512 << 10;
  auto arena = MakeArena(kReads * (kBytes + 4096));
  std::vector<ReadId> ids;
  for (int i = 0; i < kReads; ++i) {
    const uint64_t offset = 100 + static_cast<uint64_t>(i) * kBytes;
    auto id = router->Submit(
        MakeRequest(file_id_, offset, kBytes, arena->Slice(i * (kBytes + 4096), kBytes + 4096)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  for (int i = 0; i < kReads; ++i) {
    const ReadResult r = router->Wait(ids[i]);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_TRUE(SameBytes(file_, 100 + static_cast<uint64_t>(i) * kBytes, r.data)) << i;
  }
  EXPECT_LE(router->stats().peak_requests_in_flight, 4);
  int64_t parts = 0;
  for (const DeviceReport& d : router->devices()) {
    EXPECT_GT(d.reads, 4) << d.id;
    parts += d.reads;
  }
  EXPECT_GE(parts, kReads);
}

TEST_F(ReadRouterTest, TwoDirectoriesOnOneDiskAreOneQueue) {
  const std::string a = Volume("a");
  const std::string c = Volume("c", /*link=*/false);
  auto router = Open(Options({a, c}));
  ASSERT_NE(router, nullptr);
  EXPECT_THAT(router->devices(), SizeIs(1));
  EXPECT_THAT(router->copies(file_id_), SizeIs(0));
  EXPECT_TRUE(ReadAndCheck(*router, 0, kReadBytes).ok());
}

TEST_F(ReadRouterTest, ACopyThatDiffersIsRefusedByNameAndNeverRead) {
  const std::string a = Volume("a", /*link=*/false);
  {
    FILE* f = std::fopen((a + "/shard.bin").c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 1000, SEEK_SET);
    std::fputc(file_.bytes[1000] ^ 1, f);
    std::fclose(f);
  }
  const std::string b = Volume("b", /*link=*/false);
  ASSERT_EQ(::truncate((b + "/shard.bin").c_str(), kFileBytes - 1), 0);
  auto router = Open(Options({a + "@bw=1GB/s", b + "@bw=1GB/s"}));
  ASSERT_NE(router, nullptr);
  EXPECT_THAT(router->copies(file_id_), SizeIs(0));
  ASSERT_THAT(warnings_, SizeIs(2));
  EXPECT_THAT(warnings_[0], HasSubstr(a + "/shard.bin differs from"));
  EXPECT_THAT(warnings_[0], HasSubstr("at offset 1000"));
  EXPECT_THAT(warnings_[1], HasSubstr(b + "/shard.bin is 16777215 bytes"));
  EXPECT_TRUE(ReadAndCheck(*router, 0, kReadBytes).ok());
}

TEST_F(ReadRouterTest, AByteThatDiffersAnywhereFailsTheFullCheck) {
  const std::string a = Volume("a", /*link=*/false);
  const uint64_t at = kFileBytes / 2 + 12345;  // between the samples
  FILE* f = std::fopen((a + "/shard.bin").c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, static_cast<long>(at), SEEK_SET);
  std::fputc(file_.bytes[at] ^ 0x80, f);
  std::fclose(f);
  EXPECT_TRUE(CheckCopy(file_.path, a + "/shard.bin", CopyCheck::kSampled).ok());
  absl::Status full = CheckCopy(file_.path, a + "/shard.bin", CopyCheck::kFull);
  EXPECT_THAT(full.message(), HasSubstr(absl::StrCat(a, "/shard.bin differs from ", file_.path,
                                                     " at offset ", at)));
}

TEST_F(ReadRouterTest, ACopyFailingMidRunIsReadAgainElsewhereWithOneWarning) {
  const std::string a = Volume("a"), b = Volume("b");
  for (uint64_t at = 0; at < kFileBytes; at += 256 << 10) {
    faults_->FailAtOffset(at, EIO, -1, "/a/shard.bin");  // wherever its part falls
  }
  auto router = Open(Options({a + "@bw=2GB/s", b + "@bw=2GB/s"}));
  ASSERT_NE(router, nullptr);
  EXPECT_TRUE(ReadAndCheck(*router, 0, kReadBytes).ok());
  EXPECT_TRUE(ReadAndCheck(*router, kFileBytes - kReadBytes, kReadBytes).ok());
  ASSERT_THAT(warnings_, SizeIs(1));
  EXPECT_THAT(warnings_[0], HasSubstr(a + "/shard.bin at offset"));
  EXPECT_THAT(warnings_[0], HasSubstr("device " + a));
  EXPECT_THAT(warnings_[0], HasSubstr("is not read again"));
  const std::vector<DeviceReport> devices = router->devices();
  EXPECT_EQ(devices[1].failovers, 1);
}

TEST_F(ReadRouterTest, ACopyThatVanishesMidRunIsReadAgainElsewhere) {
  const std::string b = Volume("b", /*link=*/false);
  auto router = Open(Options({b + "@bw=2GB/s"}));
  ASSERT_NE(router, nullptr);
  ASSERT_TRUE(ReadAndCheck(*router, 0, kReadBytes).ok());
  ASSERT_EQ(::truncate((b + "/shard.bin").c_str(), 0), 0);
  std::filesystem::remove(b + "/shard.bin");
  EXPECT_TRUE(ReadAndCheck(*router, 0, kReadBytes).ok());
  EXPECT_TRUE(ReadAndCheck(*router, kReadBytes, kReadBytes).ok());
  ASSERT_THAT(warnings_, SizeIs(1));
  EXPECT_THAT(warnings_[0], HasSubstr(b + "/shard.bin"));
}

TEST_F(ReadRouterTest, TheOnlyCopyFailingIsAnErrorNamingTheFileAndOffset) {
  faults_->FailAtOffset(1 << 20, EIO);
  auto router = Open(Options({}));
  ASSERT_NE(router, nullptr);
  absl::Status s = ReadAndCheck(*router, 0, 4 << 20);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(file_.path + " at offset 1048576"));
  EXPECT_THAT(warnings_, SizeIs(0));
}

TEST_F(ReadRouterTest, AStripedRangeIsReadFromItsStripeNotFromTheFile) {
  // The stripe holds the true bytes of [1 MiB + 100, 3 MiB); the model's file has given that
  // range back (zeros), as after k3 stripe --punch.
  const std::string s = dir_ / "s";
  std::filesystem::create_directories(s);
  const uint64_t begin = (1 << 20) + 100, end = 3 << 20;
  std::string stripe(4096 + (end - begin), '\0');
  std::copy(file_.bytes.begin() + begin, file_.bytes.begin() + end, stripe.begin() + 100);
  ASSERT_TRUE(WriteFileAtomically(s + "/shard.bin.stripe", stripe).ok());
  TestFile punched = file_;
  std::fill(punched.bytes.begin() + begin, punched.bytes.begin() + end, 0);
  ASSERT_TRUE(
      WriteFileAtomically(file_.path, std::string(punched.bytes.begin(), punched.bytes.end()))
          .ok());
  auto router =
      Open(Options({s + "@bw=2GB/s"}),
           {{.offset = begin, .length = end - begin, .path = s + "/shard.bin.stripe", .at = 100}});
  ASSERT_NE(router, nullptr);
  EXPECT_TRUE(ReadAndCheck(*router, begin, end - begin).ok());
  EXPECT_TRUE(ReadAndCheck(*router, begin + 5000, 300000).ok());
  EXPECT_EQ(router->devices()[1].bytes, end - begin + 300000);
  // A stripe whose bytes sit at another offset modulo 4096 is refused.
  auto bad = ReadRouter::Create(Options({}));
  ASSERT_TRUE(bad.ok());
  auto id = (*bad)->OpenFile(
      file_.path, {{.offset = begin, .length = 10, .path = s + "/shard.bin.stripe", .at = 0}});
  EXPECT_FALSE(id.ok());
}

TEST_F(ReadRouterTest, AReadOverSlicesOnThreeDrivesTakesEachPieceFromItsDrive) {
  // A sliced layout: the range [100, 6 MiB + 100) cut at 4 KiB boundaries into three pieces, each
  // in its own drive's stripe file; the model's file has given the range back (zeros).
  const uint64_t begin = 100, end = (6 << 20) + 100;
  const std::vector<uint64_t> cuts = {begin, 3 << 20, (5 << 20) + 4096, end};
  TestFile punched = file_;
  std::fill(punched.bytes.begin() + begin, punched.bytes.begin() + end, 0);
  std::vector<Extent> stripes;
  std::vector<std::string> specs;
  for (int d = 0; d < 3; ++d) {
    const std::string s = dir_ / ("s" + std::to_string(d));
    std::filesystem::create_directories(s);
    const uint64_t at = cuts[d] % 4096;  // the piece's offset in its file: same modulo 4096
    std::string piece(at + (cuts[d + 1] - cuts[d]), '\0');
    std::copy(file_.bytes.begin() + cuts[d], file_.bytes.begin() + cuts[d + 1], piece.begin() + at);
    ASSERT_TRUE(WriteFileAtomically(s + "/pieces", piece).ok());
    stripes.push_back(
        {.offset = cuts[d], .length = cuts[d + 1] - cuts[d], .path = s + "/pieces", .at = at});
    specs.push_back(s + "@bw=2GB/s");
  }
  ASSERT_TRUE(
      WriteFileAtomically(file_.path, std::string(punched.bytes.begin(), punched.bytes.end()))
          .ok());
  auto router = Open(Options(specs), stripes);
  ASSERT_NE(router, nullptr);
  EXPECT_TRUE(ReadAndCheck(*router, begin, end - begin).ok());
  // Every piece from its own drive, none from the model's file.
  const std::vector<DeviceReport> devices = router->devices();
  ASSERT_THAT(devices, SizeIs(4));
  EXPECT_EQ(devices[0].bytes, 0u);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(devices[d + 1].bytes, cuts[d + 1] - cuts[d]) << d;
  // Reads inside one piece and across one cut, at odd offsets.
  EXPECT_TRUE(ReadAndCheck(*router, (3 << 20) - 5000, 12345).ok());
  EXPECT_TRUE(ReadAndCheck(*router, 4096 + 7, 70000).ok());
  EXPECT_TRUE(ReadAndCheck(*router, (5 << 20) + 4096, end - (5 << 20) - 4096).ok());
}

TEST_F(ReadRouterTest, CancelsWaitsAndLogsAsTheEngineDoes) {
  const std::string a = Volume("a");
  auto router = Open(Options({a + "@bw=200MB/s"}));
  ASSERT_NE(router, nullptr);
  router->StartLog();
  auto id = router->Submit(MakeRequest(file_id_, 0, kReadBytes, arena_->Slice(0, arena_->size()),
                                       Priority::kPrefetch, 7));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(router->CancelPrefetches([](uint64_t u) { return u == 7; }), 1);
  const ReadResult r = router->Wait(*id);
  EXPECT_TRUE(absl::IsCancelled(r.status)) << r.status;
  ASSERT_TRUE(ReadAndCheck(*router, 4096, 1000).ok());
  const std::vector<LoggedRead> log = router->TakeLog();
  ASSERT_THAT(log, SizeIs(1));
  EXPECT_EQ(log[0].offset, 4096u);
  EXPECT_EQ(log[0].length, 1000u);
  EXPECT_GE(router->stats().completed, 1u);
}

}  // namespace
}  // namespace k3::io
