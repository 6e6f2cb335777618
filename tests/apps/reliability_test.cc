// Rows of docs/RELIABILITY.md that no other suite proves: k3 facing damaged inputs, a full disk
// and a kill in the middle of writing. Each case checks the exit code, the one-line message and
// that nothing half-written is left looking complete.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::K3Result;
using testing::ReadAll;
using testing::RunK3;
using testing::RunShell;
using testing::ShellQuote;

constexpr int kFailure = 1;
constexpr int kUsage = 2;

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
  return names;
}

// A corrupt config must not size anything by what it claims: the layer count used to size a
// vector before it was checked (found by fuzz/config_fuzz).
TEST(ReliabilityTest, AbsurdLayerCountIsAnInvalidConfigNotACrash) {
  testing::TempDir dir;
  std::ifstream in(testing::SharedDir() + "/fixtures/reference-tiny/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["num_hidden_layers"] = 1000000000000;
  std::ofstream(dir / "config.json") << config.dump();
  K3Result r = RunK3({"inspect", "--model", dir.path()});
  EXPECT_EQ(r.exit_code, kUsage) << r.err;
  EXPECT_THAT(r.err, HasSubstr("num_hidden_layers: 1000000000000 is absurd"));
}

// A --set value is raw bytes from the command line; quoting invalid UTF-8 in the message used
// to throw from the JSON library and abort k3 (found by fuzz/cli_fuzz).
TEST(ReliabilityTest, SetValueThatIsNotUtf8IsAUsageErrorNotACrash) {
  testing::TempDir dir;
  K3Result r = RunK3({"synth", "--out", dir / "m", "--set", "hidden_size=\xff\xfe", "--quiet"});
  EXPECT_EQ(r.exit_code, kUsage) << r.err;
  EXPECT_THAT(r.err, HasSubstr("hidden_size: must be an integer"));
  EXPECT_FALSE(fs::exists(dir / "m")) << "nothing may be written for an invalid config";
}

// A shard cut short after the model was written (a copy interrupted, a disk error) is refused
// when generating, naming the shard, before any token is produced.
TEST(ReliabilityTest, GenerateRefusesATruncatedShardNamingIt) {
  testing::TempDir dir;
  const std::string model = dir / "m";
  K3Result synth = RunK3({"synth", "--preset", "tiny", "--out", model, "--quiet"});
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  std::string shard;
  for (const std::string& name : FilesIn(model)) {
    if (name.ends_with(".safetensors") && (shard.empty() || name > shard)) shard = name;
  }
  ASSERT_FALSE(shard.empty());
  fs::resize_file(model + "/" + shard, fs::file_size(model + "/" + shard) / 2);
  K3Result r = RunK3({"generate", "--model", model, "--ids", "1,2", "-n", "2", "--quiet"});
  EXPECT_EQ(r.exit_code, kFailure) << r.err;
  EXPECT_THAT(r.err, HasSubstr(shard));
}

// A disk that fills up while synthesising (here: a file size limit, so that writes fail with
// EFBIG as they would with ENOSPC) is an I/O error naming the file, and leaves neither a
// config.json (the last file written, which makes a directory a model) nor partial files.
TEST(ReliabilityTest, SynthOnAFullDiskFailsAndLeavesNoModel) {
  testing::TempDir dir;
  const std::string out = dir / "m";
  K3Result r = RunShell("ulimit -f 64 && trap '' XFSZ && exec \"$K3\" synth --preset tiny --out " +
                        ShellQuote(out) + " --quiet");
  EXPECT_EQ(r.exit_code, kFailure) << r.err;
  EXPECT_THAT(r.err, HasSubstr(out));
  EXPECT_FALSE(fs::exists(out + "/config.json"));
  for (const std::string& name : FilesIn(out)) {
    EXPECT_FALSE(name.ends_with(".partial")) << name << " left behind";
  }
}

// A synth killed outright (no chance to clean up) may leave partial files, but never a
// directory that opens as a model: config.json is written last.
TEST(ReliabilityTest, KilledSynthNeverLeavesAModelThatOpens) {
  testing::TempDir dir;
  const std::string out = dir / "m";
  // Killed as soon as its first file appears: a fixed delay let a fast machine finish first.
  K3Result killed = RunShell("\"$K3\" synth --preset demo --out " + ShellQuote(out) +
                             " --quiet & pid=$!; i=0; while [ -z \"$(ls -A " + ShellQuote(out) +
                             " 2>/dev/null)\" ] && [ $i -lt 2000 ]; do sleep 0.005; i=$((i+1)); "
                             "done; kill -9 $pid; wait $pid");
  ASSERT_NE(killed.exit_code, 0) << "synth finished before the kill; the test proves nothing";
  K3Result r = RunK3({"inspect", "--model", out});
  if (fs::exists(out + "/config.json")) {
    // Killed after the last rename: the model is complete and must open.
    EXPECT_EQ(r.exit_code, 0) << r.err;
  } else {
    // No config.json (or, killed very early, no directory at all): not a model, said so.
    EXPECT_EQ(r.exit_code, kUsage) << r.err;
    EXPECT_THAT(r.err, HasSubstr(out));
  }
}

// Ctrl-C during generate: the run stops, the summary is printed and the exit code is 130.
TEST(ReliabilityTest, CtrlCDuringGenerateExits130WithTheSummary) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--preset", "tiny", "--out", dir / "m", "--quiet"}).exit_code, 0);
  // Interrupted once its first token is out, when its handler is in place: a fixed delay could
  // end before that on a loaded machine, and the shell starts a background job with SIGINT
  // ignored, so the run would go on to the end. (The poll's bound of a minute is for a broken
  // build only.)
  const std::string tokens = ShellQuote(dir / "tokens");
  K3Result r = RunShell("\"$K3\" generate -m " + ShellQuote(dir / "m") +
                        " --ids 3,7 -n 200000 --max-context 250000 --ignore-eos"
                        " --report-json " +
                        ShellQuote(dir / "r.json") + " > " + tokens +
                        " & pid=$!; i=0; while [ ! -s " + tokens +
                        " ] && [ $i -lt 12000 ]; do sleep 0.005; i=$((i+1)); done;"
                        " kill -INT $pid; wait $pid");
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_THAT(r.err, HasSubstr("interrupted"));
  EXPECT_TRUE(fs::exists(dir / "r.json")) << "the report of what was produced is written";
}

// A prompt that does not fit the context is refused before anything runs.
TEST(ReliabilityTest, PromptBeyondMaxContextIsAUsageError) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--preset", "tiny", "--out", dir / "m", "--quiet"}).exit_code, 0);
  K3Result r = RunK3({"generate", "-m", dir / "m", "--ids", "1,2,3,4,5", "--max-context", "4"});
  EXPECT_EQ(r.exit_code, kUsage) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--max-context"));
}

// Disk full while packing: an error naming the file, and no pack left that would open.
TEST(ReliabilityTest, PackOnAFullDiskFailsAndLeavesNoPack) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--preset", "tiny", "--out", dir / "m", "--quiet"}).exit_code, 0);
  const std::string out = dir / "p";
  K3Result r = RunShell("ulimit -f 64 && trap '' XFSZ && exec \"$K3\" pack --model " +
                        ShellQuote(dir / "m") + " --out " + ShellQuote(out) + " --quiet");
  EXPECT_EQ(r.exit_code, kFailure) << r.err;
  EXPECT_THAT(r.err, HasSubstr(out));
  EXPECT_FALSE(fs::exists(out + "/trunk.json"));
  for (const std::string& name : FilesIn(out)) {
    EXPECT_FALSE(name.ends_with(".partial")) << name << " left behind";
  }
}

// A chat turn that would pass --max-context is refused with a notice naming it; the chat goes
// on, and /reset makes room again.
TEST(ReliabilityTest, ChatTurnBeyondMaxContextIsRefusedAndResetRecovers) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--preset", "demo", "--set", "num_hidden_layers=2", "--set",
                   "full_attn_layers=2", "--out", dir / "m", "--quiet"})
                .exit_code,
            0);
  K3Result r = RunK3({"chat", "-m", dir / "m", "--max-context", "60", "-n", "8", "--quiet"},
                     "hello there\nand again with more words\n/reset\nhi\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("would pass --max-context 60"));
  EXPECT_THAT(r.err, HasSubstr("/reset"));
}

}  // namespace
}  // namespace k3
