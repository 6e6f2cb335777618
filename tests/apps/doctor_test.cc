// k3 doctor and the memory presets of k3 inspect, through the binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;

std::string Fixture() { return testing::SharedDir() + "/fixtures/reference-tiny"; }

TEST(DoctorTest, ChecksTheMachineAndRecommendsAPresetForTheModel) {
  testing::TempDir dir;
  auto r = RunK3({"doctor", "--model", Fixture(), "--out-json", dir / "doctor.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  for (const char* check : {"io_uring", "O_DIRECT", "disk read", "RAM", "CPU", "preset"}) {
    EXPECT_THAT(r.out, HasSubstr(check));
  }
  const auto report = nlohmann::json::parse(testing::ReadAll(dir / "doctor.json"));
  EXPECT_TRUE(report["ok"].get<bool>());
  EXPECT_GT(report["read_bytes_per_second"].get<double>(), 0);
  EXPECT_GT(report["ram_available_bytes"].get<uint64_t>(), 0u);
  EXPECT_GE(report["cores"].get<int>(), 1);
  const std::string preset = report["recommended_preset"];
  // The fixture has no tokenizer: the next command takes ids.
  EXPECT_THAT(r.out, HasSubstr("next: k3 generate --model " + Fixture() + " --preset " + preset +
                               " --ids "));
  EXPECT_EQ(r.err, "");
}

TEST(DoctorTest, ACheckpointThatCannotBeOpenedIsAnEssentialFailure) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--out", dir.path(), "--quiet"}).exit_code, 0);
  const std::string shard = dir / "model-00003-of-00014.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 1);
  auto r = RunK3({"doctor", "--model", dir.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("FAIL  model"));
  EXPECT_THAT(r.err, HasSubstr(shard));
  EXPECT_THAT(r.out, HasSubstr("next: fix the FAIL above"));
}

// A sparse checkpoint reads at the speed of memory: doctor measures it, and says so.
TEST(DoctorTest, ASparseCheckpointsRateIsCalledMemoryNotDisk) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--preset", "full", "--sparse", "--out", dir.path(), "--quiet", "--set",
                   "num_hidden_layers=2", "--set", "full_attn_layers=2", "--set", "num_experts=16"})
                .exit_code,
            0);
  auto r = RunK3({"doctor", "--model", dir.path()});
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("WARN +disk read .* mostly holes"));
  EXPECT_THAT(r.out, HasSubstr("not of a disk"));
}

TEST(InspectTest, ShowsWhatEveryMemoryPresetGivesTheModel) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--out", dir.path(), "--quiet"}).exit_code, 0);
  auto r = RunK3({"inspect", "--model", dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("pinned layers"));
  EXPECT_THAT(r.out, HasSubstr("cache experts"));
  for (const char* preset : {"ultra", "laptop", "desktop", "workstation", "server", "max"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("\n") + preset + " "));
  }
  EXPECT_THAT(r.out, HasSubstr("(auto: 70% of the"));
  // max holds the whole model: every layer pinned, every expert cached.
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\nmax .* 13 of 13 .* 100.0%"));
}

}  // namespace
}  // namespace k3
