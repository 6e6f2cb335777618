// k3 tune end to end on a tiny synthetic model (the recommendation, the settings file, the
// token check, the time budget), and --settings in the commands that take it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;

class TuneTest : public testing::K3TinyModelSuite {
 protected:
  // The engine settings `k3 generate` ran with, from its --report-json.
  static nlohmann::json GenerateSettings(std::vector<std::string> extra) {
    testing::TempDir out;
    std::vector<std::string> args = {"generate",      "--model",     Model(), "--ids",
                                     "1,2,3",         "--n-predict", "2",     "--quiet",
                                     "--report-json", out / "r.json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = RunK3(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return {};
    return nlohmann::json::parse(testing::ReadAll(out / "r.json"))["settings"];
  }

  static void Write(const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
};

TEST_F(TuneTest, RecommendsFlagsFromTheListsWritesThemAndChecksTheTokens) {
  testing::TempDir out;
  auto r = RunK3({"tune", "--model", Model(), "--tokens", "3", "--repeat", "1", "--queue-depth",
                  "1,4", "--prefetch-distance", "0,1", "--prefetch-widths", "0,4",
                  "--thread-counts", "0,1", "--out", out / "s.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("| setting | value | s/token (median) |"));
  EXPECT_THAT(r.out, HasSubstr("| queue-depth | 4 |"));
  EXPECT_THAT(r.out, HasSubstr("recommended (direct): --prefetch-distance "));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("tokens: all [0-9]+ runs decoded the same 3 tokens"));
  EXPECT_THAT(r.err, HasSubstr("k3 tune: direct[1] defaults (warm-up)"));  // progress per run

  const auto file = nlohmann::json::parse(testing::ReadAll(out / "s.json"));
  EXPECT_EQ(file["k3_settings"], 1);
  EXPECT_EQ(file["model"], Model());
  const auto& flags = file["flags"];
  ASSERT_EQ(flags.size(), 4u) << file.dump();
  EXPECT_TRUE(std::set<std::string>({"1", "4", "32"}).contains(flags["queue-depth"]));
  EXPECT_TRUE(std::set<std::string>({"0", "1"}).contains(flags["prefetch-distance"]));
  EXPECT_TRUE(std::set<std::string>({"0", "4"}).contains(flags["prefetch-width"]));
  EXPECT_TRUE(std::set<std::string>({"0", "1"}).contains(flags["threads"]));
  EXPECT_EQ(file["profiles"]["direct"]["flags"], flags);

  // What tune recommends is what generate then runs with.
  const auto settings = GenerateSettings({"--settings", out / "s.json"});
  EXPECT_EQ(std::to_string(settings["queue_depth"].get<int>()), flags["queue-depth"]);
  EXPECT_EQ(std::to_string(settings["prefetch_distance"].get<int>()), flags["prefetch-distance"]);
}

TEST_F(TuneTest, WhatDoesNotFitTheBudgetIsSkippedAndTheDefaultsStay) {
  auto r = RunK3({"tune", "--model", Model(), "--tokens", "2", "--repeat", "1", "--budget-s",
                  "0.000001", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("skipped: the time budget (--budget-s) ran out"));
  EXPECT_THAT(r.out, HasSubstr("these are the defaults"));
  EXPECT_THAT(r.out, HasSubstr("--queue-depth 32"));
  EXPECT_THAT(r.out, HasSubstr("tokens: all 1 runs decoded the same 2 tokens"));
}

TEST_F(TuneTest, ASettingsFileAppliesUnlessTheCommandLineGivesTheFlag) {
  testing::TempDir out;
  Write(out / "s.json", R"({"k3_settings": 1, "flags": {"queue-depth": "3", "threads": "1"},
      "profiles": {"lat=1ms,bw=1GB/s": {"flags": {"queue-depth": "7"}}}})");
  auto s = GenerateSettings({"--settings", out / "s.json"});
  EXPECT_EQ(s["queue_depth"], 3);
  EXPECT_EQ(s["threads"], 1);
  s = GenerateSettings({"--settings", out / "s.json", "--queue-depth", "5"});
  EXPECT_EQ(s["queue_depth"], 5);
  EXPECT_EQ(s["threads"], 1);
  s = GenerateSettings({"--queue-depth", "5", "--settings", out / "s.json"});  // order is free
  EXPECT_EQ(s["queue_depth"], 5);
  s = GenerateSettings({"--settings", out / "s.json", "--storage-profile", "lat=1ms,bw=1GB/s"});
  EXPECT_EQ(s["queue_depth"], 7);  // the profile's own entry
}

TEST_F(TuneTest, ABadSettingsFileIsRefusedNamingTheFileAndTheKey) {
  testing::TempDir out;
  const std::string path = out / "s.json";
  const struct {
    std::string text, message;
  } cases[] = {
      {R"({"k3_settings": 1, "flags": {"ram-gb": "64"}})", "key \"ram-gb\" is not a flag"},
      {R"({"k3_settings": 1, "flags": {"queue-depth": "many"}})", "key \"queue-depth\""},
      {R"({"k3_settings": 2, "flags": {}})", "\"k3_settings\" must be 1"},
      {"not json", "not a JSON object"},
  };
  for (const auto& c : cases) {
    Write(path, c.text);
    auto r = RunK3(
        {"generate", "--model", Model(), "--ids", "1", "--n-predict", "1", "--settings", path});
    EXPECT_EQ(r.exit_code, 2) << c.text;
    EXPECT_THAT(r.err, HasSubstr(path)) << c.text;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.text;
  }
  auto r = RunK3({"bench", "--model", Model(), "--settings", out / "missing.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing.json"));
}

}  // namespace
}  // namespace k3
