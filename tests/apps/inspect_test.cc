// k3 inspect's preset table says what a run would do: each row is the plan k3 generate makes
// with that preset (one planner, PlanRun), not a table of its own at a fixed context and chunk.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "core/util/progress.h"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using testing::RunK3;

struct PresetRow {
  std::string budget;
  int64_t context = 0;
  int64_t chunk = 0;
  int64_t pinned = 0;
  int64_t layers = 0;
};

// The row of `preset` in inspect's table: "NAME  1.23 MB  CONTEXT CHUNK  P of L ...".
bool FindRow(const std::string& out, const std::string& preset, PresetRow& row) {
  const std::regex line("^" + preset +
                        R"(\s+([0-9.]+ [KMGT]?B)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+) of ([0-9]+)\s)");
  std::istringstream in(out);
  for (std::string text; std::getline(in, text);) {
    std::smatch m;
    if (!std::regex_search(text, m, line)) continue;
    row = {m[1], std::stoll(m[2]), std::stoll(m[3]), std::stoll(m[4]), std::stoll(m[5])};
    return true;
  }
  return false;
}

// A model whose context limit (32,768) is above the 4,096 tokens inspect used to assume, so the
// auto context differs from it; the limit also makes the auto preset's context the model's
// limit whatever RAM is available at the moment each process asks.
TEST(InspectPlanTest, EachPresetRowIsThePlanGenerateMakes) {
  testing::TempDir dir;
  const std::string model = dir / "m";
  auto synth = RunK3({"synth", "--preset", "tiny", "-o", model, "--quiet", "--set",
                      "max_position_embeddings=32768"});
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  auto inspect = RunK3({"inspect", "-m", model, "--disk-gbps", "2"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  int compared = 0;
  for (const char* preset : {"auto", "ultra", "laptop", "desktop", "max"}) {
    SCOPED_TRACE(preset);
    PresetRow row;
    ASSERT_TRUE(FindRow(inspect.out, preset, row)) << inspect.out;
    const std::string report = dir / (std::string(preset) + ".json");
    auto run = RunK3({"generate", "-m", model, "--preset", preset, "-p", "hello", "-n", "1",
                      "--report-json", report});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto json = nlohmann::json::parse(testing::ReadAll(report));
    const auto& plan = json.at("memory_plan");
    const auto& settings = json.at("settings");
    EXPECT_EQ(row.context, settings.at("max_context").get<int64_t>());
    EXPECT_EQ(row.chunk, settings.at("prefill_chunk").get<int64_t>());
    EXPECT_EQ(row.pinned, row.layers - plan.at("streamed_layers").get<int64_t>());
    EXPECT_EQ(row.budget,
              FormatBytes(static_cast<double>(plan.at("budget_bytes").get<uint64_t>())));
    ++compared;
  }
  EXPECT_EQ(compared, 5);
  // The row that used to differ: auto planned a 4,096-token context where generate plans the
  // model's limit.
  PresetRow automatic;
  ASSERT_TRUE(FindRow(inspect.out, "auto", automatic));
  EXPECT_EQ(automatic.context, 32768);
}

}  // namespace
}  // namespace k3
