// The k3 command as a user meets it: exit codes and one-line messages (CLI.md).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;

constexpr int kUsage = 2;

TEST(CliTest, HelpListsTheCommands) {
  auto r = RunK3({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("synth"));
  EXPECT_THAT(r.out, HasSubstr("inspect"));
}

TEST(CliTest, NoCommandIsAUsageError) {
  auto r = RunK3({});
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.out, HasSubstr("usage: k3 <command>"));
}

TEST(CliTest, SubcommandHelpShowsItsFlagsWithDefaults) {
  auto r = RunK3({"synth", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--preset"));
  EXPECT_THAT(r.out, HasSubstr("default tiny"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("--model")));  // not a synth flag
}

struct UsageCase {
  const char* name;
  std::vector<std::string> args;  // "OUT" is replaced by a fresh output directory
  const char* message;
};

void PrintTo(const UsageCase& c, std::ostream* os) { *os << c.name; }

class UsageErrorTest : public ::testing::TestWithParam<UsageCase> {};

TEST_P(UsageErrorTest, ExitsTwoWithAOneLineMessage) {
  testing::TempDir dir;
  std::vector<std::string> args = GetParam().args;
  for (std::string& a : args) {
    if (a == "OUT") a = dir / "model";
  }
  auto r = RunK3(args);
  EXPECT_EQ(r.exit_code, kUsage) << r.err;
  EXPECT_THAT(r.err, HasSubstr(GetParam().message));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "model/config.json"));
}

const UsageCase kUsageCases[] = {
    {"unknown_command", {"frobnicate"}, "unknown command 'frobnicate'"},
    {"synth_without_out", {"synth"}, "--out DIR is required"},
    {"unknown_flag", {"synth", "--out", "OUT", "--bogus"}, "unknown flag --bogus"},
    {"unknown_short_flag", {"synth", "-q", "--out", "OUT"}, "unknown flag -q"},
    {"flag_of_another_command",
     {"synth", "--out", "OUT", "--model", "x"},
     "flag --model does not apply to 'k3 synth'"},
    {"bad_number", {"synth", "--out", "OUT", "--seed", "abc"}, "invalid value 'abc' for --seed"},
    {"missing_value", {"synth", "--out", "OUT", "--seed"}, "flag --seed needs a value"},
    {"unknown_preset", {"synth", "--out", "OUT", "--preset", "huge"}, "unknown preset \"huge\""},
    {"set_without_equals",
     {"synth", "--out", "OUT", "--set", "hidden_size"},
     "--set hidden_size: expected key=value"},
    {"set_unknown_key",
     {"synth", "--out", "OUT", "--set", "hiden_size=3"},
     "unknown config key \"hiden_size\""},
    {"set_invalid_value",
     {"synth", "--out", "OUT", "--set", "num_experts_per_token=99"},
     "99 exceeds num_experts (8)"},
    {"bad_dtype",
     {"synth", "--out", "OUT", "--dtype", "f8"},
     "--dtype must be release, f16 or f32"},
    {"bad_weights",
     {"synth", "--out", "OUT", "--weights", "normal"},
     "--weights must be gaussian or uniform"},
    {"stray_argument", {"synth", "--out", "OUT", "extra"}, "unexpected argument extra"},
    {"inspect_without_model", {"inspect"}, "--model DIR is required"},
    {"inspect_missing_dir", {"inspect", "--model", "OUT"}, "does not exist"},
};

INSTANTIATE_TEST_SUITE_P(All, UsageErrorTest, ::testing::ValuesIn(kUsageCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CliTest, SynthThenInspect) {
  testing::TempDir dir;
  auto synth = RunK3({"synth", "--preset", "tiny", "-o", dir / "m", "--seed", "4"});
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  EXPECT_THAT(synth.err, HasSubstr("wrote tiny preset (seed 4)"));
  auto inspect = RunK3({"inspect", "-m", dir / "m"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_THAT(inspect.out, HasSubstr("13 (9 KDA, 4 MLA at one-based 4,8,12,13)"));
  EXPECT_THAT(inspect.out, HasSubstr("routed experts"));
  EXPECT_THAT(inspect.out, HasSubstr("one read per expert"));
}

// absl splits a list flag on commas: a list value of --set must reach the config whole, and
// the next --set must stay its own override.
TEST(CliTest, SynthSetTakesAListValue) {
  testing::TempDir dir;
  auto synth = RunK3({"synth", "--preset", "tiny", "-o", dir / "m", "--quiet", "--set",
                      "full_attn_layers=4,6", "--set", "num_experts_per_token=2"});
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  auto inspect = RunK3({"inspect", "-m", dir / "m"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_THAT(inspect.out, HasSubstr("13 (11 KDA, 2 MLA at one-based 4,6)"));
  EXPECT_THAT(inspect.out, HasSubstr("top-2"));
  auto help = RunK3({"synth", "--help"});
  EXPECT_THAT(help.out, HasSubstr("a list keeps its commas"));
}

// Real dimensions, few layers and experts, no data: the flags reach Synthesize and the
// result opens.
TEST(CliTest, SynthSparseFullPresetThenInspect) {
  testing::TempDir dir;
  for (const char* layout : {"--sparse", "--single-file"}) {
    const std::string out = dir / (layout + 2);
    auto synth =
        RunK3({"synth", "--preset", "full", "--sparse", layout, "-o", out, "--set",
               "num_hidden_layers=2", "--set", "full_attn_layers=2", "--set", "num_experts=16"});
    ASSERT_EQ(synth.exit_code, 0) << synth.err;
    EXPECT_THAT(synth.err, HasSubstr("apparent (sparse)"));
    auto inspect = RunK3({"inspect", "-m", out});
    ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
    EXPECT_THAT(inspect.out, HasSubstr("hidden      7168, vocab 163840"));
    if (std::string(layout) == "--sparse") {
      EXPECT_THAT(synth.err, HasSubstr("5 shards"));
      EXPECT_THAT(synth.err, HasSubstr("168 vision placeholders"));
      EXPECT_TRUE(std::filesystem::exists(out + "/model-00005-of-000005.safetensors"));
    } else {
      EXPECT_THAT(synth.err, HasSubstr("1 file"));
      EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors"));
    }
  }
}

// The slice, sparse (no disk): Kimi K3's dimensions in 6 layers of 128 experts.
TEST(CliTest, SynthSparseSlicePresetHasTheRealDimensions) {
  testing::TempDir dir;
  auto synth = RunK3({"synth", "--preset", "slice", "--sparse", "-o", dir / "m"});
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  EXPECT_THAT(synth.err, HasSubstr("7 shards, 23.71 GB apparent (sparse)"));
  auto inspect = RunK3({"inspect", "-m", dir / "m"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_THAT(inspect.out,
              HasSubstr("6 (4 KDA, 2 MLA at one-based 4,6), dense FFN in the first 1"));
  EXPECT_THAT(inspect.out, HasSubstr("hidden      7168, vocab 163840"));
  EXPECT_THAT(inspect.out,
              HasSubstr("128 per MoE layer, top-16, 2 shared; latent 3584, width 3072; "
                        "17.55 MB each"));
  EXPECT_THAT(inspect.out, HasSubstr("dense FFN                   1.45 GB"));  // 3 x 33792 x 7168
  EXPECT_THAT(inspect.out, HasSubstr("one read per expert"));
  // Written data reports its exponent entropy.
  auto tiny = RunK3({"synth", "--preset", "tiny", "--weights", "gaussian", "-o", dir / "t"});
  ASSERT_EQ(tiny.exit_code, 0) << tiny.err;
  EXPECT_THAT(tiny.err, HasSubstr("BF16 exponent entropy (gaussian weights): "));
  EXPECT_THAT(tiny.err, HasSubstr("trained LLMs: ~2.6"));
}

TEST(CliTest, SynthRefusesToOverwriteAModelWithoutForce) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--out", dir.path(), "--quiet"}).exit_code, 0);
  auto again = RunK3({"synth", "--out", dir.path()});
  EXPECT_EQ(again.exit_code, kUsage);
  EXPECT_THAT(again.err, HasSubstr("already holds a model"));
  auto forced = RunK3({"synth", "--out", dir.path(), "--force", "--quiet"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(forced.err, "");  // --quiet
}

TEST(CliTest, InspectOfACorruptCheckpointExitsOneAndNamesTheFile) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--out", dir.path(), "--quiet"}).exit_code, 0);
  const std::string shard = dir / "model-00003-of-00014.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 1);
  auto r = RunK3({"inspect", "--model", dir.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(shard));
}

TEST(CliTest, InspectOfAnInvalidConfigExitsTwoAndListsTheKeys) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--out", dir.path(), "--quiet"}).exit_code, 0);
  std::ofstream(dir / "config.json") << R"({"hidden_size": 128})";
  auto r = RunK3({"inspect", "--model", dir.path()});
  EXPECT_EQ(r.exit_code, kUsage);
  EXPECT_THAT(r.err, HasSubstr("num_hidden_layers: missing"));
  EXPECT_THAT(r.err, HasSubstr("vocab_size: missing"));
}

}  // namespace
}  // namespace k3
