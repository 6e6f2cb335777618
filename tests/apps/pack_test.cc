// k3 pack end to end on a synthetic tiny model.
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
using testing::RunK3;

constexpr int kFailure = 1;
constexpr int kUsage = 2;

class PackCommandTest : public testing::K3TinyModelSuite {
 protected:
  std::string Out() const { return out_.path(); }

  testing::TempDir out_;
};

TEST_F(PackCommandTest, PacksVerifiesAndSummarises) {
  auto r = RunK3({"pack", "--model", Model(), "--out", Out()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("tensors"), HasSubstr("trunk.pack"), HasSubstr("/s"),
                           HasSubstr("verified byte-exact")));
  auto manifest = nlohmann::json::parse(testing::ReadAll(out_ / "trunk.json"));
  EXPECT_EQ(manifest["format"], "k3-trunk-pack");
  EXPECT_EQ(manifest["pack_bytes"].get<uint64_t>(),
            std::filesystem::file_size(out_ / "trunk.pack"));

  auto again = RunK3({"pack", "--model", Model(), "--out", Out(), "--verify-only"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.err, HasSubstr("verified byte-exact"));
}

TEST_F(PackCommandTest, RefusesAnExistingPackWithoutForce) {
  ASSERT_EQ(RunK3({"pack", "--model", Model(), "--out", Out(), "--quiet"}).exit_code, 0);
  auto r = RunK3({"pack", "--model", Model(), "--out", Out()});
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, AllOf(HasSubstr("already holds a trunk pack"), HasSubstr("--force")));
  auto forced = RunK3({"pack", "--model", Model(), "--out", Out(), "--force", "--quiet"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(forced.err, "");  // --quiet
}

TEST_F(PackCommandTest, VerifyOnlyFindsACorruptedByte) {
  ASSERT_EQ(RunK3({"pack", "--model", Model(), "--out", Out(), "--quiet"}).exit_code, 0);
  auto manifest = nlohmann::json::parse(testing::ReadAll(out_ / "trunk.json"));
  const auto& tensor = manifest["runs"][3]["tensors"][0];
  const uint64_t at = tensor["offset"].get<uint64_t>() + 5;
  {
    std::fstream f(out_ / "trunk.pack", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    const char c = static_cast<char>(f.get() ^ 0x01);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(c);
  }
  auto r = RunK3({"pack", "--model", Model(), "--out", Out(), "--verify-only"});
  EXPECT_EQ(r.exit_code, kFailure);
  EXPECT_THAT(r.err, AllOf(HasSubstr(tensor["name"].get<std::string>()),
                           HasSubstr("offset " + std::to_string(at))));
}

TEST_F(PackCommandTest, VerifyOnlyWithoutAPackIsAUsageError) {
  auto r = RunK3({"pack", "--model", Model(), "--out", Out(), "--verify-only"});
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, HasSubstr("no trunk pack"));
}

TEST_F(PackCommandTest, DamagedManifestIsAUsageErrorNamingIt) {
  ASSERT_EQ(RunK3({"pack", "--model", Model(), "--out", Out(), "--quiet"}).exit_code, 0);
  auto manifest = nlohmann::json::parse(testing::ReadAll(out_ / "trunk.json"));
  manifest["fingerprint"] = "feedfacefeedface";
  std::ofstream(out_ / "trunk.json") << manifest.dump();
  auto r = RunK3({"pack", "--model", Model(), "--out", Out(), "--verify-only"});
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, AllOf(HasSubstr("trunk.json"), HasSubstr("fingerprint")));
}

TEST_F(PackCommandTest, MissingModelIsAUsageError) {
  auto r = RunK3({"pack", "--out", Out()});
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, HasSubstr("--model"));
  auto absent = RunK3({"pack", "--model", out_ / "nothing", "--out", Out()});
  EXPECT_EQ(absent.exit_code, kUsage);
  EXPECT_THAT(absent.err, HasSubstr("does not exist"));
}

TEST_F(PackCommandTest, MissingOutIsAUsageError) {
  auto r = RunK3({"pack", "--model", Model()});
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, HasSubstr("--out"));
}

TEST(PackCommandHelpTest, HelpDescribesTheCommandAndItsFlags) {
  auto r = RunK3({"pack", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, AllOf(HasSubstr("usage: k3 pack"), HasSubstr("--verify-only"),
                           HasSubstr("--force"), HasSubstr("byte-exact")));
  EXPECT_THAT(RunK3({"--help"}).out, HasSubstr("pack"));
}

}  // namespace
}  // namespace k3
