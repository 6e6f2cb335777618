// Storage profiles: parsing (named, custom, lists, errors naming the bad part), the emulator's
// schedule, and the emulation measured through the engine: never faster than the profile.
#include "io/storage_profile.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/read_engine.h"
#include "tests/io/io_test_util.h"
#include "tests/util/temp_dir.h"

namespace k3::io {
namespace {

using ::testing::HasSubstr;
using testing::MakeArena;
using testing::MakeFile;
using testing::MakeRequest;
using testing::TestFile;

TEST(StorageProfileTest, NamedProfiles) {
  auto direct = ParseStorageProfile("direct");
  ASSERT_TRUE(direct.ok());
  EXPECT_FALSE(direct->emulated());
  EXPECT_EQ(direct->Describe(), "direct");

  auto network = ParseStorageProfile("network");
  ASSERT_TRUE(network.ok());
  EXPECT_EQ(network->latency, absl::Microseconds(1500));
  EXPECT_DOUBLE_EQ(network->bytes_per_second, 400e6);
  EXPECT_DOUBLE_EQ(network->iops, 6000);
  EXPECT_EQ(network->max_in_flight, 32);
  EXPECT_EQ(network->Describe(), "lat=1.5ms,bw=400MB/s,iops=6000,qd=32");

  auto sata = ParseStorageProfile("sata");
  ASSERT_TRUE(sata.ok());
  EXPECT_EQ(sata->latency, absl::Microseconds(100));
  EXPECT_DOUBLE_EQ(sata->bytes_per_second, 550e6);

  auto nvme = ParseStorageProfile("nvme");
  ASSERT_TRUE(nvme.ok());
  EXPECT_EQ(nvme->latency, absl::Microseconds(80));
  EXPECT_DOUBLE_EQ(nvme->bytes_per_second, 7000e6);
}

TEST(StorageProfileTest, CustomSettingsAnySubset) {
  auto all = ParseStorageProfile("lat=2ms,bw=500MB/s,iops=5000,qd=32");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->name, "lat=2ms,bw=500MB/s,iops=5000,qd=32");
  EXPECT_EQ(all->latency, absl::Milliseconds(2));
  EXPECT_DOUBLE_EQ(all->bytes_per_second, 500e6);
  EXPECT_DOUBLE_EQ(all->iops, 5000);
  EXPECT_EQ(all->max_in_flight, 32);

  auto some = ParseStorageProfile("bw=1.5GiB/s");
  ASSERT_TRUE(some.ok());
  EXPECT_DOUBLE_EQ(some->bytes_per_second, 1.5 * 1073741824.0);
  EXPECT_EQ(some->latency, absl::ZeroDuration());
  EXPECT_EQ(some->max_in_flight, 0);

  auto spelled = ParseStorageProfile("latency=500us,iops=16k,bandwidth=250MB");
  ASSERT_TRUE(spelled.ok());
  EXPECT_EQ(spelled->latency, absl::Microseconds(500));
  EXPECT_DOUBLE_EQ(spelled->iops, 16000);
  EXPECT_DOUBLE_EQ(spelled->bytes_per_second, 250e6);

  auto based = ParseStorageProfile("network,lat=3ms");
  ASSERT_TRUE(based.ok());
  EXPECT_EQ(based->latency, absl::Milliseconds(3));
  EXPECT_DOUBLE_EQ(based->bytes_per_second, 400e6);
}

TEST(StorageProfileTest, ErrorsNameTheBadPart) {
  struct Case {
    const char* spec;
    const char* part;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {"lat=2x,bw=5MB/s", "'lat=2x'", "unknown unit 'x'"},
           {"lat=2ms,bw=fast", "'bw=fast'", "expected a rate"},
           {"lat=2", "'lat=2'", "missing unit"},
           {"iops=5q", "'iops=5q'", "unknown suffix"},
           {"qd=0", "'qd=0'", "at least 1"},
           {"speed=9", "'speed=9'", "unknown setting 'speed'"},
           {"nvme2", "'nvme2'", "unknown profile"},
           {"lat=1ms,network", "'network'", "must come first"},
           {"lat=1ms,,qd=2", "''", "empty part"},
       }) {
    auto p = ParseStorageProfile(c.spec);
    ASSERT_FALSE(p.ok()) << c.spec;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(p.status().message());
    EXPECT_THAT(msg, HasSubstr(std::string("bad part ") + c.part)) << c.spec;
    EXPECT_THAT(msg, HasSubstr(c.why)) << c.spec;
  }
}

TEST(StorageProfileTest, ListFlagValuesGroupIntoProfiles) {
  // What --storage-profile direct,lat=2ms,bw=1GB/s,lat=5ms,network,sata arrives as: a name
  // stands alone, settings gather until one repeats.
  auto list =
      ParseStorageProfileList({"direct", "lat=2ms", "bw=1GB/s", "lat=5ms", "network", "sata"});
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 5u);
  EXPECT_EQ((*list)[0].name, "direct");
  EXPECT_EQ((*list)[1].name, "lat=2ms,bw=1GB/s");
  EXPECT_EQ((*list)[2].name, "lat=5ms");
  EXPECT_EQ((*list)[3].name, "network");
  EXPECT_EQ((*list)[4].name, "sata");
  EXPECT_FALSE(ParseStorageProfileList({"sata", "bw=x"}).ok());
}

TEST(StorageEmulatorTest, ScheduleFollowsIopsBandwidthAndLatency) {
  StorageProfile p;
  p.latency = absl::Milliseconds(1);
  p.bytes_per_second = 100e6;
  p.iops = 1000;
  StorageEmulator emu(p);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto us_after = [](absl::Time t, absl::Time base) {
    return absl::ToDoubleMicroseconds(t - base);
  };
  // 1 MB at 100 MB/s: 10 ms of transfer, then 1 ms of latency.
  EXPECT_NEAR(us_after(emu.Schedule(t0, 1000000), t0), 11000, 0.01);
  // Issued at the same time: waits for the pipe (bandwidth), not only for its IOPS slot.
  EXPECT_NEAR(us_after(emu.Schedule(t0, 1000000), t0), 21000, 0.01);
  // Small reads after an idle second: limited by IOPS (1 ms apart), plus latency.
  const absl::Time t1 = t0 + absl::Seconds(1);
  EXPECT_NEAR(us_after(emu.Schedule(t1, 100), t1), 1001, 0.01);
  EXPECT_NEAR(us_after(emu.Schedule(t1, 100), t1), 2001, 0.01);
}

// The emulation measured end to end through the engine. Buffered reads of a cached file make
// the real device much faster than the profile, so the profile is what is measured.
//
// Each figure has two sides. The engine holds every completion until the profile's schedule
// releases it, and the schedule starts at the moment of issue, after this test has read the
// clock: so the profile is never beaten, and that side is checked exactly, however the threads
// run. Falling short of the profile is another matter: each hand-off between threads adds its
// wake-up time, which a loaded machine stretches to milliseconds. Idle, every figure comes
// within 10 % of its profile (latency measured at 4 ms); under ASan on a 2-core machine with
// both cores busy and two compilers running beside, a 4 ms latency took 7.4 ms even in the best
// of 25 reads, and rates fell to a third of the profile. So that side asks only for what
// survives such load: the best of ten reads of a 20 ms latency below 35 ms (a hold counted
// twice would make every read 40 ms or more), rates of a tenth of the profile (a stream that
// stalls).
class ProfileAccuracyTest : public ::testing::Test {
 protected:
  void SetUp() override { file_ = MakeFile(dir_ / "cached.bin", kFileBytes, 2); }

  std::unique_ptr<ReadEngine> Engine(const std::string& spec, int depth) {
    auto profile = ParseStorageProfile(spec);
    EXPECT_TRUE(profile.ok());
    ReadEngineOptions o;
    o.profile = *profile;
    o.queue_depth = depth;
    o.direct = false;
    o.notices = false;
    o.chunk_bytes = 1 << 20;
    auto engine = ReadEngine::Create(o);
    EXPECT_TRUE(engine.ok());
    return *std::move(engine);
  }

  struct Rates {
    double overall;  // requests per second, from before the first submission to the last result
    double steady;   // over the middle of the stream, without ramp-up and tail
  };

  // Reads `count` one-chunk requests of `bytes`, keeping `depth` in flight.
  Rates Measure(ReadEngine& engine, int count, uint64_t bytes, int depth) {
    auto f = engine.OpenFile(file_.path);
    EXPECT_TRUE(f.ok());
    auto arena = MakeArena(depth * bytes);
    int submitted = 0;
    auto submit = [&](int slot) {
      const uint64_t offset = (submitted++ * bytes) % (kFileBytes - bytes);
      EXPECT_TRUE(
          engine
              .Submit(MakeRequest(*f, offset / 4096 * 4096, bytes,
                                  arena->Slice(slot * bytes, bytes), Priority::kDemand, slot))
              .ok());
    };
    const absl::Time start = absl::Now();
    for (int slot = 0; slot < depth; ++slot) submit(slot);
    std::vector<absl::Time> done;
    for (int i = 0; i < count; ++i) {
      auto r = engine.WaitAny();
      EXPECT_TRUE(r && r->status.ok());
      done.push_back(absl::Now());
      if (submitted < count) submit(static_cast<int>(r->user_data));
    }
    const int first = count / 6, last = count - count / 6;
    return {.overall = count / absl::ToDoubleSeconds(done.back() - start),
            .steady = (last - first) / absl::ToDoubleSeconds(done[last] - done[first])};
  }

  static constexpr size_t kFileBytes = 8 << 20;
  k3::testing::TempDir dir_;
  TestFile file_;
};

TEST_F(ProfileAccuracyTest, LatencyIsNeverBelowTheProfile) {
  auto engine = Engine("lat=20ms", 1);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(8192);
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    const absl::Time start = absl::Now();
    ASSERT_TRUE(engine->Read(MakeRequest(*f, i * 8192, 4096, arena->Slice(0, 8192))).ok());
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    EXPECT_GE(ms.back(), 20.0) << "read " << i;
  }
  EXPECT_LT(*std::min_element(ms.begin(), ms.end()), 35.0);
}

TEST_F(ProfileAccuracyTest, BandwidthIsNeverAboveTheProfile) {
  // 60 MiB through a pipe of 200 MB/s take 315 ms at least.
  auto engine = Engine("bw=200MB/s", 8);
  const Rates r = Measure(*engine, 60, 1 << 20, 8);
  const double mb = (1 << 20) / 1e6;
  EXPECT_LE(r.overall * mb, 200);
  EXPECT_GE(r.steady * mb, 200 * 0.1);
}

TEST_F(ProfileAccuracyTest, IopsAreNeverAboveTheProfile) {
  // One IOPS slot per request: the last of 480 starts 479 slots of 0.5 ms after the first.
  auto engine = Engine("iops=2000", 16);
  const Rates r = Measure(*engine, 480, 4096, 16);
  EXPECT_LE(r.overall, 2000 * 480.0 / 479);
  EXPECT_GE(r.steady, 2000 * 0.1);
}

TEST_F(ProfileAccuracyTest, InFlightCapMakesThroughputLatencyBound) {
  // At most 4 requests in flight (the profile's qd, below the engine's 32), 5 ms each: by
  // Little's law 800 requests per second, whatever the device could do; 80 requests take 20
  // rounds of 5 ms at least.
  auto engine = Engine("lat=5ms,qd=4", 32);
  auto f = engine->OpenFile(file_.path);
  ASSERT_TRUE(f.ok());
  auto arena = MakeArena(80 * 65536);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 80; ++i) {
    ASSERT_TRUE(
        engine->Submit(MakeRequest(*f, (i % 64) * 65536, 65536, arena->Slice(i * 65536, 65536)))
            .ok());
  }
  for (int done = 0; done < 80; ++done) {
    auto r = engine->WaitAny();
    ASSERT_TRUE(r && r->status.ok());
  }
  EXPECT_EQ(engine->stats().peak_requests_in_flight, 4);
  const double rate = 80 / absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_LE(rate, 800);
  EXPECT_GE(rate, 800 * 0.1);
}

}  // namespace
}  // namespace k3::io
