// k3 generate end to end on the external fixture and on synthetic models.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;

std::string Fixture() { return testing::SharedDir() + "/fixtures/reference-tiny"; }

TEST(GenerateTest, ReproducesTheExternalFixtureThroughDumpLogitsAndReport) {
  testing::TempDir dir;
  auto r = RunK3({"generate", "--model", Fixture(), "--ids", "3,7,11,5,9", "--n-predict", "8",
                  "--dump-logits", dir / "logits.f32", "--report-json", dir / "report.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto report = nlohmann::json::parse(testing::ReadAll(dir / "report.json"));
  EXPECT_EQ(report["prompt_ids"], nlohmann::json({3, 7, 11, 5, 9}));
  EXPECT_EQ(report["generated_ids"], nlohmann::json({92, 168, 13, 3, 49, 208, 214, 208}));
  EXPECT_GT(report["peak_rss_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(report["per_token"].size(), 8u);
  EXPECT_THAT(r.out, HasSubstr("92 168 13 3 49 208 214 208"));  // ids: the fixture has no tokenizer

  auto ref = nlohmann::json::parse(testing::ReadAll(Fixture() + "/ref_logits.json"));
  std::string bytes = testing::ReadAll(dir / "logits.f32");
  ASSERT_EQ(bytes.size(), 256u * 4);
  double diff = 0, scale = 0;
  const auto bits = ref["logits_bits"].get<std::vector<uint32_t>>();
  for (size_t i = 0; i < bits.size(); ++i) {
    float got;
    std::memcpy(&got, bytes.data() + 4 * i, 4);
    const float want = std::bit_cast<float>(bits[i]);
    diff = std::max(diff, std::abs(double{got} - want));
    scale = std::max(scale, std::abs(double{want}));
  }
  EXPECT_LE(diff, 5e-4 * scale);
}

TEST(GenerateTest, StreamsTextFromATokenizedPromptAndStopsAtAStopId) {
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--preset", "demo", "--set", "num_hidden_layers=2", "--set",
                   "full_attn_layers=2", "--out", dir / "m", "--quiet"})
                .exit_code,
            0);
  auto free_run = RunK3({"generate", "-m", dir / "m", "-p", "The capital of France is", "-n", "6",
                         "--report-json", dir / "a.json"});
  ASSERT_EQ(free_run.exit_code, 0) << free_run.err;
  auto a = nlohmann::json::parse(testing::ReadAll(dir / "a.json"));
  ASSERT_EQ(a["generated_ids"].size(), 6u);
  EXPECT_GT(a["prompt_ids"].size(), 1u);
  // Make the third generated token a stop id: generation ends there.
  const int stop = a["generated_ids"][2];
  auto stopped = RunK3({"generate", "-m", dir / "m", "-p", "The capital of France is", "-n", "6",
                        "--stop-id", std::to_string(stop), "--report-json", dir / "b.json"});
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  auto b = nlohmann::json::parse(testing::ReadAll(dir / "b.json"));
  EXPECT_EQ(b["generated_ids"].size(), 3u);
  EXPECT_EQ(b["generated_ids"][2], stop);
}

TEST(GenerateTest, SamplingIsReproducibleForASeed) {
  testing::TempDir dir;
  auto run = [&](const std::string& seed, const std::string& out) {
    return RunK3({"generate", "-m", Fixture(), "--ids", "3,7,11", "-n", "12", "--temp", "1.5",
                  "--top-k", "50", "--top-p", "0.9", "--seed", seed, "--report-json", dir / out});
  };
  ASSERT_EQ(run("1", "a.json").exit_code, 0);
  ASSERT_EQ(run("1", "b.json").exit_code, 0);
  ASSERT_EQ(run("2", "c.json").exit_code, 0);
  auto ids = [&](const std::string& f) {
    return nlohmann::json::parse(testing::ReadAll(dir / f))["generated_ids"];
  };
  EXPECT_EQ(ids("a.json"), ids("b.json"));
  EXPECT_NE(ids("a.json"), ids("c.json"));
}

TEST(GenerateTest, PrefillChunkAndThreadCountDoNotChangeABit) {
  testing::TempDir dir;
  std::vector<std::string> outputs;
  for (auto [chunk, threads] : {std::pair{"64", "2"}, {"1", "1"}, {"3", "2"}, {"auto", "1"}}) {
    const std::string tag = std::string(chunk) + "_" + threads;
    auto r = RunK3({"generate", "-m", Fixture(), "--ids", "3,7,11,5,9,2,40,41", "-n", "6",
                    "--prefill-chunk", chunk, "-t", threads, "--dump-logits", dir / tag});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    outputs.push_back(r.out + testing::ReadAll(dir / tag));
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[0], outputs[2]);
  EXPECT_EQ(outputs[0], outputs[3]);
}

// --prompt-cache: a second run of a prompt resumes the state one token short of its end, a
// longer prompt the longest cached prefix, a damaged file is a warning naming it and a cold
// run; the tokens and logits are the cold run's every time.
TEST(GenerateTest, APromptCacheResumesWithTheColdRunsTokensAndLogits) {
  testing::TempDir dir;
  const std::string cache = dir / "cache";
  auto run = [&](const std::string& ids, const std::string& tag, bool cached) {
    std::vector<std::string> args = {"generate",
                                     "-m",
                                     Fixture(),
                                     "--ids",
                                     ids,
                                     "-n",
                                     "5",
                                     "--dump-logits",
                                     dir / (tag + ".f32"),
                                     "--report-json",
                                     dir / (tag + ".json")};
    if (cached) args.insert(args.end(), {"--prompt-cache", cache});
    auto r = RunK3(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto report = nlohmann::json::parse(testing::ReadAll(dir / (tag + ".json")));
    return std::tuple{r, report, r.out + testing::ReadAll(dir / (tag + ".f32"))};
  };
  const std::string prompt = "3,7,11,5,9,2,40,41", longer = "3,7,11,5,9,2,40,41,8,8,1";
  const auto [cold_run, cold_report, cold] = run(prompt, "cold", false);
  const auto [first_run, first_report, first] = run(prompt, "first", true);
  EXPECT_EQ(first, cold);
  EXPECT_EQ(first_report["prompt_cache"]["cached_tokens"], 0);
  EXPECT_EQ(first_report["prompt_cache"]["stored"], 1);
  const auto [warm_run, warm_report, warm] = run(prompt, "warm", true);
  EXPECT_EQ(warm, cold);
  EXPECT_EQ(warm_report["prompt_cache"]["cached_tokens"], 7);
  EXPECT_EQ(warm_report["prompt_cache"]["disk_hits"], 1);
  const auto [long_cold_run, long_cold_report, long_cold] = run(longer, "long_cold", false);
  const auto [long_run, long_report, long_warm] = run(longer, "long", true);
  EXPECT_EQ(long_warm, long_cold);
  EXPECT_EQ(long_report["prompt_cache"]["cached_tokens"], 7);
  // Damage every state file: one flipped byte in the middle of each.
  const std::string where = first_report["prompt_cache"]["directory"];
  const std::string flip = R"sh(for f in "$D"/*.k3pc; do
      o=$(( $(stat -c %s "$f") / 2 )); b=$(dd if="$f" bs=1 skip=$o count=1 status=none | od -An -tu1)
      printf "\\$(printf %o $(( b ^ 255 )))" | dd of="$f" bs=1 seek=$o conv=notrunc status=none
    done)sh";
  ASSERT_EQ(testing::RunShell("D=" + testing::ShellQuote(where) + "; " + flip).exit_code, 0);
  const auto [damaged_run, damaged_report, damaged] = run(longer, "damaged", true);
  EXPECT_EQ(damaged, long_cold);
  EXPECT_EQ(damaged_report["prompt_cache"]["cached_tokens"], 0);
  EXPECT_GE(damaged_report["prompt_cache"]["damaged"], 1);
  EXPECT_THAT(damaged_run.err, HasSubstr(".k3pc"));
}

// A full disk under --prompt-cache: one warning, and the run goes on with the same tokens.
TEST(GenerateTest, APromptCacheOnAFullDiskWarnsAndTheRunGoesOn) {
  testing::TempDir dir;
  const std::string mount = dir / "full";
  if (testing::RunShell("mkdir -p " + testing::ShellQuote(mount) +
                        " && mount -t tmpfs -o size=4k tmpfs " + testing::ShellQuote(mount))
          .exit_code != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs (needs root)";
  }
  const std::vector<std::string> args = {"generate",     "-m", Fixture(), "--ids",
                                         "3,7,11,5,9,2", "-n", "4"};
  auto cold = RunK3(args);
  std::vector<std::string> cached = args;
  cached.insert(cached.end(), {"--prompt-cache", mount + "/cache"});
  auto full = RunK3(cached);
  testing::RunShell("umount " + testing::ShellQuote(mount));
  ASSERT_EQ(cold.exit_code, 0) << cold.err;
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_EQ(full.out, cold.out);
  EXPECT_THAT(full.err, HasSubstr("k3 generate: prompt cache: no room"));
}

// On a terminal (stdout and stderr the same tty) the text comes whole, and the per-step table
// after it: no row cuts into the text. `script` gives the run a pseudo-terminal.
TEST(GenerateTest, OnATerminalTheTextComesWholeAndTheTableAfterIt) {
  if (testing::RunShell("command -v script >/dev/null").exit_code != 0) {
    GTEST_SKIP() << "script (util-linux) is not installed";
  }
  testing::TempDir dir;
  ASSERT_EQ(RunK3({"synth", "--preset", "tiny", "--out", dir / "m", "--quiet"}).exit_code, 0);
  auto piped = RunK3({"generate", "-m", dir / "m", "--ids", "1,2,3", "-n", "12", "--ignore-eos"});
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  ASSERT_GT(piped.out.size(), 1u);
  const std::string text = piped.out.substr(0, piped.out.size() - 1);  // the final newline
  auto tty = testing::RunShell("script -qec \"$K3 generate -m " + (dir / "m") +
                               " --ids 1,2,3 -n 12 --ignore-eos\" /dev/null");
  ASSERT_EQ(tty.exit_code, 0) << tty.out << tty.err;
  const size_t at = tty.out.find(text);
  const size_t table = tty.out.find(" step    token");
  ASSERT_NE(at, std::string::npos) << tty.out;
  ASSERT_NE(table, std::string::npos) << tty.out;
  EXPECT_LT(at, table);
}

struct GenerateError {
  const char* name;
  std::vector<std::string> args;
  int exit_code;
  const char* message;
};
void PrintTo(const GenerateError& c, std::ostream* os) { *os << c.name; }

class GenerateErrorTest : public ::testing::TestWithParam<GenerateError> {};

TEST_P(GenerateErrorTest, IsRefusedWithAClearMessage) {
  std::vector<std::string> args = {"generate", "--model", Fixture()};
  args.insert(args.end(), GetParam().args.begin(), GetParam().args.end());
  auto r = RunK3(args);
  EXPECT_EQ(r.exit_code, GetParam().exit_code) << r.err;
  EXPECT_THAT(r.err, HasSubstr(GetParam().message));
}

const GenerateError kErrors[] = {
    {"no_prompt", {}, 2, "give the prompt with --prompt, --prompt-file or --ids"},
    {"two_prompts", {"--ids", "1", "--prompt", "x"}, 2, "exclude each other"},
    {"bad_id", {"--ids", "3,x"}, 2, "--ids: 'x' is not a token id"},
    {"id_beyond_vocab", {"--ids", "3,256"}, 2, "token id 256 at position 1"},
    {"prompt_without_tokenizer", {"--prompt", "hello"}, 2, "no tokenizer"},
    {"negative_temp", {"--ids", "3", "--temp", "-1"}, 2, "--temp must be >= 0"},
    {"bad_top_p", {"--ids", "3", "--temp", "1", "--top-p", "1.5"}, 2, "--top-p must be in (0, 1]"},
    {"greedy_and_temp", {"--ids", "3", "--greedy", "--temp", "1"}, 2, "exclude each other"},
    {"bad_stop_id", {"--ids", "3", "--stop-id", "999"}, 2, "--stop-id 999"},
    {"missing_prompt_file", {"--prompt-file", "/nonexistent/p.txt"}, 2, "/nonexistent/p.txt"},
    {"negative_n_predict", {"--ids", "3", "-n", "-2"}, 2, "--n-predict must be >= 0"},
    {"out_without_prompts", {"--ids", "3", "--out", "r.jsonl"}, 2, "--out is the results file"},
};

INSTANTIATE_TEST_SUITE_P(All, GenerateErrorTest, ::testing::ValuesIn(kErrors),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace k3
