// k3 doctor and the memory presets of k3 inspect, through the binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"
#include "tests/util/volume_dirs.h"

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

// With --volume: the drives the engine reads the model from, grouped as it groups them (a file
// system; a volume with a profile of its own), each with a rate, and what each directory holds.
// `same` is on the model's file system and lacks one shard's copy and has another cut short;
// `own` holds every shard and has a profile of its own.
TEST(DoctorTest, ListsEachDriveWithItsRateAndWhatEachVolumeHolds) {
  testing::TempDir dir;
  const std::string model = dir / "model", same = dir / "same", own = dir / "own";
  ASSERT_EQ(RunK3({"synth", "--out", model, "--quiet"}).exit_code, 0);
  const int shards = testing::LinkShards(model, own);
  testing::LinkShards(model, same);
  const std::string cut = "model-00003-of-00014.safetensors";
  std::filesystem::remove(same + "/" + cut);
  std::filesystem::copy_file(model + "/" + cut, same + "/" + cut);
  std::filesystem::resize_file(same + "/" + cut, 4096);
  std::filesystem::remove(same + "/model-00004-of-00014.safetensors");

  auto r = RunK3({"doctor", "--model", model, "--volume", same, "--volume", own + "@bw=2000MB/s",
                  "--report-json", dir / "doctor.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "WARN +volume +" + same + " on drive .*: " + std::to_string(shards - 2) +
                         " of " + std::to_string(shards) + " files.*1 copy differs"));
  EXPECT_THAT(r.out, HasSubstr(cut));
  EXPECT_THAT(r.out, HasSubstr("drive       " + own + " (bw=2000MB/s): "));

  const auto report = nlohmann::json::parse(testing::ReadAll(dir / "doctor.json"));
  const auto& drives = report["drives"];
  ASSERT_EQ(drives.size(), 2u) << report.dump(1);
  // The model's file system: its directory and `same`, measured once (the "disk read" check).
  ASSERT_EQ(drives[0]["dirs"].size(), 2u);
  EXPECT_EQ(drives[0]["dirs"][0]["dir"], model);
  EXPECT_TRUE(drives[0]["dirs"][0]["volume"].is_null());
  EXPECT_EQ(drives[0]["dirs"][0]["files"], shards);
  EXPECT_EQ(drives[0]["dirs"][1]["dir"], same);
  EXPECT_EQ(drives[0]["dirs"][1]["files"], shards - 2);
  EXPECT_EQ(drives[0]["dirs"][1]["model_files"], shards);
  ASSERT_EQ(drives[0]["dirs"][1]["differs"].size(), 1u);
  EXPECT_THAT(drives[0]["dirs"][1]["differs"][0].get<std::string>(), HasSubstr("4096 bytes"));
  EXPECT_EQ(drives[0]["read_bytes_per_second"], report["read_bytes_per_second"]);
  EXPECT_EQ(drives[0]["files"], shards);
  // `own`: a drive of its own, named by its directory, read through its profile.
  EXPECT_EQ(drives[1]["id"], own);
  EXPECT_EQ(drives[1]["profile"], "bw=2000MB/s");
  ASSERT_EQ(drives[1]["dirs"].size(), 1u);
  EXPECT_EQ(drives[1]["dirs"][0]["volume"], own + "@bw=2000MB/s");
  EXPECT_EQ(drives[1]["dirs"][0]["files"], shards);
  EXPECT_EQ(drives[1]["dirs"][0]["bytes"], drives[0]["dirs"][0]["bytes"]);
  EXPECT_GT(drives[1]["read_bytes_per_second"].get<double>(), 0);
  EXPECT_TRUE(drives[1]["o_direct"].get<bool>());

  // The volumes' copies are compared with the model's: no --model, no --volume.
  r = RunK3({"doctor", "--volume", own});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--volume needs --model"));
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
  EXPECT_THAT(r.out, HasSubstr("auto: 70% of the"));
  // max holds the whole model: every layer pinned, every expert cached.
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\nmax .* 13 of 13 .* 100.0%"));
}

}  // namespace
}  // namespace k3
