// Several drives through the whole command: copies of the shards in --volume directories (hard
// links, each directory with an emulated profile of its own, so its own drive) give the same
// tokens, and the report shows each drive; a copy that fails mid-run (EIO, or a file gone from
// its volume) is read again from the model's own file with one warning and the same tokens;
// when no other copy holds the bytes the run ends with exit 1 naming file and offset.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;
using ::testing::SizeIs;

class VolumesCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(RunK3({"synth", "--preset", "tiny", "--out", dir_ / "m", "--quiet"}).exit_code, 0);
    for (const char* v : {"a", "b"}) {
      std::filesystem::create_directories(dir_ / v);
      for (const auto& entry : std::filesystem::directory_iterator(dir_ / "m")) {
        if (entry.path().extension() != ".safetensors") continue;
        std::filesystem::create_hard_link(entry.path(), dir_ / v / entry.path().filename());
      }
    }
  }

  std::vector<std::string> Args(std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "-m", dir_ / "m", "--ids", "3,7,11",
                                     "-n",       "10", "--preset", "ultra", "--ignore-eos"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // The model's directory slow and the volumes fast: every read goes to a volume's copy.
  std::vector<std::string> Volumes() {
    return {"--storage-profile",         "bw=20MB/s", "--volume",
            dir_ / "a" + "@bw=4000MB/s", "--volume",  dir_ / "b" + "@bw=4000MB/s"};
  }

  // Warnings about copies (not the plan's about the short context of --preset ultra).
  static int Warnings(const std::string& err) {
    int n = 0;
    for (absl::string_view line : absl::StrSplit(err, '\n'))
      n += absl::StrContains(line, "warning") && !absl::StrContains(line, "context");
    return n;
  }

  k3::testing::TempDir dir_;
};

TEST_F(VolumesCliTest, CopiesOnThreeDrivesGiveTheSameTokensAndTheReportShowsEachDrive) {
  auto alone = RunK3(Args({}));
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  std::vector<std::string> extra = Volumes();
  extra.insert(extra.end(), {"--report-json", dir_ / "r.json"});
  auto spread = RunK3(Args(extra));
  ASSERT_EQ(spread.exit_code, 0) << spread.err;
  EXPECT_EQ(spread.out, alone.out);
  EXPECT_THAT(spread.err, HasSubstr("drives                3"));
  EXPECT_EQ(Warnings(spread.err), 0) << spread.err;
  std::ifstream in(dir_ / "r.json");
  const auto report = nlohmann::json::parse(in);
  ASSERT_THAT(report["devices"], SizeIs(3));
  uint64_t volumes = 0;
  for (size_t i = 1; i < 3; ++i) volumes += report["devices"][i]["bytes"].get<uint64_t>();
  EXPECT_GT(volumes, 0u);
  EXPECT_EQ(report["settings"]["volumes"].size(), 2u);
}

TEST_F(VolumesCliTest, ASettingsFileMayNameTheVolumesAndTheCommandLineWins) {
  {
    std::ofstream f(dir_ / "s.json");
    f << R"({"k3_settings": 1, "flags": {"volume": [")" << dir_ / "a"
      << R"(@bw=4000MB/s", ")" << dir_ / "b"
      << R"(@lat=1ms,bw=500MB/s"]}})";
  }
  auto devices = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--report-json", dir_ / "r.json"});
    auto r = RunK3(Args(extra));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(dir_ / "r.json");
    return nlohmann::json::parse(in)["devices"];
  };
  const auto both = devices({"--settings", dir_ / "s.json"});
  ASSERT_THAT(both, SizeIs(3));
  EXPECT_EQ(both[2]["profile"], "lat=1ms,bw=500MB/s");
  EXPECT_THAT(devices({"--settings", dir_ / "s.json", "--volume", dir_ / "a" + "@bw=1GB/s"}),
              SizeIs(2));
}

TEST_F(VolumesCliTest, ACopyFailingOrVanishingMidRunIsReadElsewhereWithOneWarning) {
  auto alone = RunK3(Args({}));
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  // Volume a's copy of one shard, after some reads; b stays whole.
  for (const char* fault : {"eio-file", "gone-file"}) {
    const std::string spec =
        std::string("from=3,") + fault + "=/a/model-00003-of-00014.safetensors";
    ::setenv("K3_FAULTS", spec.c_str(), 1);
    auto r = RunK3(Args(Volumes()));
    ::unsetenv("K3_FAULTS");
    ASSERT_EQ(r.exit_code, 0) << fault << "\n" << r.err;
    EXPECT_EQ(r.out, alone.out) << fault;
    EXPECT_EQ(Warnings(r.err), 1) << fault << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("/a/model-00003-of-00014.safetensors at offset")) << fault;
    EXPECT_THAT(r.err, HasSubstr("is not read again")) << fault;
  }
}

TEST_F(VolumesCliTest, WhenEveryCopyFailsTheRunExitsOneNamingFileAndOffset) {
  ::setenv("K3_FAULTS", "eio-file=model-00003-of-00014.safetensors", 1);
  auto r = RunK3(Args(Volumes()));
  ::unsetenv("K3_FAULTS");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("model-00003-of-00014.safetensors at offset"));
}

TEST_F(VolumesCliTest, ACopyThatDiffersIsRefusedByNameAndTheTokensStayTheSame) {
  auto alone = RunK3(Args({}));
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  const std::string copy = dir_ / "b/model-00004-of-00014.safetensors";
  std::filesystem::remove(copy);
  std::filesystem::copy_file(dir_ / "m/model-00004-of-00014.safetensors", copy);
  std::filesystem::resize_file(copy, std::filesystem::file_size(copy) - 1);
  auto r = RunK3(Args(Volumes()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, alone.out);
  EXPECT_THAT(r.err, HasSubstr(copy + " is "));
  EXPECT_THAT(r.err, HasSubstr(copy + " is not read"));
  auto verify = RunK3({"inspect", "-m", dir_ / "m", "--volume", dir_ / "b", "--verify-volumes"});
  EXPECT_EQ(verify.exit_code, 1) << verify.err;
  EXPECT_THAT(verify.err + verify.out, HasSubstr(copy));
}

TEST_F(VolumesCliTest, StripesInEitherLayoutGiveTheSameTokensReadFromTheStripeDrives) {
  auto alone = RunK3(Args({}));
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  for (const char* layout : {"slices", "experts"}) {
    SCOPED_TRACE(layout);
    const std::string s = dir_ / layout;
    const std::string dirs = s + "1," + s + "2," + s + "3";
    auto striped = RunK3({"stripe", "-m", dir_ / "m", "--out", dirs, "--weights", "2,1,1",
                          "--layout", layout, "--quiet"});
    ASSERT_EQ(striped.exit_code, 0) << striped.err;
    // The model's directory slow, the stripes' drives fast: striped experts come from them.
    auto r = RunK3(Args({"--storage-profile", "bw=20MB/s", "--volume", s + "1@bw=4000MB/s",
                         "--volume", s + "2@bw=4000MB/s", "--volume", s + "3@bw=4000MB/s",
                         "--report-json", dir_ / "r.json"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, alone.out);
    EXPECT_EQ(Warnings(r.err), 0) << r.err;
    std::ifstream in(dir_ / "r.json");
    const auto report = nlohmann::json::parse(in);
    ASSERT_THAT(report["devices"], SizeIs(4));
    for (size_t i = 1; i < 4; ++i) EXPECT_GT(report["devices"][i]["bytes"].get<uint64_t>(), 0u);
  }
}

}  // namespace
}  // namespace k3
