// k3 stripe end to end on a synthetic tiny model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunK3;

constexpr int kStripeFailure = 1;
constexpr int kStripeUsage = 2;

class StripeCommandTest : public testing::K3TinyModelSuite {
 protected:
  std::string Dir(int d) const { return out_ / ("drive" + std::to_string(d)); }
  std::string Dirs(int n) const {
    std::string list;
    for (int d = 0; d < n; ++d) list += (d > 0 ? "," : "") + Dir(d);
    return list;
  }

  testing::TempDir out_;
};

TEST_F(StripeCommandTest, StripesPrintsTheSharesAndVerifies) {
  auto r = RunK3({"stripe", "--model", Model(), "--out", Dirs(3), "--weights", "2,1,0.2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The default layout: every expert sliced over the three (the tiny model's experts of a few
  // KiB are cut at 4 KiB, so its shares are rough; a released expert's are within 4 KiB).
  EXPECT_THAT(r.out, AllOf(HasSubstr("layer share min"), HasSubstr(Dir(0)), HasSubstr(Dir(2)),
                           HasSubstr("62.5 %"), HasSubstr("one piece per directory")));
  EXPECT_THAT(r.err, AllOf(HasSubstr("wrote 96 experts"), HasSubstr("3 directories"),
                           HasSubstr("verified")));
  for (int d = 0; d < 3; ++d) {
    auto manifest = nlohmann::json::parse(testing::ReadAll(Dir(d) + "/k3-stripe.json"));
    EXPECT_EQ(manifest["format"], "k3-stripe");
    EXPECT_EQ(manifest["directory"], d);
    EXPECT_EQ(manifest["layout"], "slices");
    EXPECT_EQ(manifest["files"][0]["bytes"].get<uint64_t>(),
              std::filesystem::file_size(Dir(d) + "/k3-experts.stripe"));
  }
  auto again = RunK3({"stripe", "--model", Model(), "--out", Dirs(3), "--verify-only"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.err, AllOf(HasSubstr(" extents"), HasSubstr("CRC-32C verified")));
}

TEST_F(StripeCommandTest, CopiesWriteEachExpertToKDirectories) {
  auto r = RunK3(
      {"stripe", "--model", Model(), "--out", Dirs(3), "--weights", "2,1,1", "--copies", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("target"), HasSubstr("100.0 %"), HasSubstr("50.0 %"),
                           HasSubstr("each expert in 2 directories")));
  EXPECT_THAT(r.err, HasSubstr("wrote 96 experts x 2"));
  for (int d = 0; d < 3; ++d) {
    auto manifest = nlohmann::json::parse(testing::ReadAll(Dir(d) + "/k3-stripe.json"));
    EXPECT_EQ(manifest["copies"], 2);
  }
  auto again = RunK3({"stripe", "--model", Model(), "--out", Dirs(3), "--verify-only"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.err, HasSubstr("192 extents"));
}

TEST_F(StripeCommandTest, RefusesExistingStripesWithoutForce) {
  ASSERT_EQ(
      RunK3({"stripe", "-m", Model(), "--out", Dirs(2), "--weights", "1,1", "--quiet"}).exit_code,
      0);
  auto r = RunK3({"stripe", "-m", Model(), "--out", Dirs(2), "--weights", "1,1"});
  EXPECT_EQ(r.exit_code, kStripeUsage);
  EXPECT_THAT(r.err, AllOf(HasSubstr("already holds stripes"), HasSubstr("--force")));
  auto forced =
      RunK3({"stripe", "-m", Model(), "--out", Dirs(2), "--weights", "1,3", "--force", "--quiet"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(forced.err, "");  // --quiet
  EXPECT_EQ(forced.out, "");
}

TEST_F(StripeCommandTest, VerifyOnlyFindsACorruptedByteNamingTheFileAndOffset) {
  ASSERT_EQ(
      RunK3({"stripe", "-m", Model(), "--out", Dirs(2), "--weights", "1,1", "--quiet"}).exit_code,
      0);
  auto manifest = nlohmann::json::parse(testing::ReadAll(Dir(1) + "/k3-stripe.json"));
  const uint64_t at = manifest["shards"][2]["extents"][1]["at"].get<uint64_t>();
  {
    std::fstream f(Dir(1) + "/k3-experts.stripe", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at + 9));
    const char c = static_cast<char>(f.get() ^ 0x01);
    f.seekp(static_cast<std::streamoff>(at + 9));
    f.put(c);
  }
  auto r = RunK3({"stripe", "-m", Model(), "--out", Dirs(2), "--verify-only"});
  EXPECT_EQ(r.exit_code, kStripeFailure);
  EXPECT_THAT(r.err, AllOf(HasSubstr(Dir(1) + "/k3-experts.stripe"),
                           HasSubstr("offset " + std::to_string(at))));
}

TEST_F(StripeCommandTest, VerifyOnlyWithoutStripesIsAUsageError) {
  auto r = RunK3({"stripe", "-m", Model(), "--out", Dirs(2), "--verify-only"});
  EXPECT_EQ(r.exit_code, kStripeUsage);
  EXPECT_THAT(r.err, HasSubstr("holds stripes"));
}

TEST_F(StripeCommandTest, BadFlagsAreUsageErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--out", Dirs(2), "--weights", "1,1,1"}, "3 weights for 2 --out directories"},
      {{"--out", Dirs(2), "--weights", "1,0"}, "'0' is not a positive number"},
      {{"--out", Dirs(2), "--weights", "1,1", "--measure"}, "exclude each other"},
      {{"--out", Dirs(2), "--weights", "1,1", "--verify-only"}, "writes nothing"},
      {{"--out", Dir(0) + ",," + Dir(1), "--weights", "1,1"}, "empty directory name"},
      {{"--out", Dir(0) + "," + Dir(0), "--weights", "1,1"}, "listed twice"},
      {{"--weights", "1,1"}, "--out DIR1,DIR2,... is required"},
      {{"--out", Dirs(2), "--weights", "1,1", "--copies", "3"}, "--copies 3"},
      {{"--out", Dirs(2), "--weights", "1,1", "--copies", "0"}, "1 to 2"},
      {{"--out", Dirs(2), "--weights", "1,1", "--layout", "rows"}, "\"rows\" is not"},
      {{"--out", Dirs(2), "--weights", "1,1", "--layout", "slices", "--copies", "2"},
       "needs --layout experts"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"stripe", "-m", Model()};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = RunK3(args);
    EXPECT_EQ(r.exit_code, kStripeUsage) << message << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(message));
  }
}

TEST_F(StripeCommandTest, WithoutWeightsMeasuresEachDirectory) {
  auto r = RunK3({"stripe", "-m", Model(), "--out", Dirs(2)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("read rate"), HasSubstr("/s"), HasSubstr("layer share")));
  EXPECT_THAT(r.err, AllOf(HasSubstr("measuring " + Dir(0)), HasSubstr("measuring " + Dir(1))));
  for (int d = 0; d < 2; ++d) {  // the scratch files are gone
    for (const auto& entry : std::filesystem::directory_iterator(Dir(d))) {
      EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr("measure"))) << entry.path();
    }
  }
}

}  // namespace
}  // namespace k3
