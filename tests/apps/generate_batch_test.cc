// k3 generate --prompts: JSON lines in, results in input order, each equal to `k3 generate` of
// its prompt alone; malformed lines named by number; a batch beyond the budget refused naming
// the maximum; Ctrl-C keeps what finished.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunK3;
using json = nlohmann::json;

std::vector<json> Lines(const std::string& text) {
  std::vector<json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

class GenerateBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::LinkK3Model(
        dir_ / "m",
        {"--preset", "demo", "--set", "num_hidden_layers=2", "--set", "full_attn_layers=2"}));
  }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }
  // generate alone: its generated ids.
  json Alone(std::vector<std::string> args) {
    args.insert(args.begin(),
                {"generate", "-m", dir_ / "m", "--quiet", "--report-json", dir_ / "alone.json"});
    auto r = RunK3(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(testing::ReadAll(dir_ / "alone.json"))["generated_ids"];
  }
  testing::TempDir dir_;
};

TEST_F(GenerateBatchTest, ResultsInInputOrderEachEqualToItsPromptAlone) {
  const std::string prompts =
      Write("p.jsonl",
            R"({"id": "first", "prompt": "The capital of France is", "n_predict": 9}
{"ids": [5, 6, 7], "n_predict": 2}

{"id": 42, "prompt": "Once upon a time", "n_predict": 6, "temperature": 0.8, "seed": 7}
{"ids": [9], "n_predict": 12, "greedy": true}
{"prompt": "Hello", "n_predict": 0}
)");
  for (const char* batch : {"1", "2", "0"}) {
    auto r = RunK3({"generate", "-m", dir_ / "m", "--prompts", prompts, "--batch", batch,
                    "--report-json", dir_ / "batch.json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<json> out = Lines(r.out);
    ASSERT_EQ(out.size(), 5u) << r.out;
    EXPECT_EQ(out[0]["id"], "first");
    EXPECT_EQ(out[1]["id"], 2);  // the line number when a line has no id
    EXPECT_EQ(out[2]["id"], 42);
    EXPECT_EQ(out[2]["line"], 4);
    EXPECT_EQ(out[0]["ids"], Alone({"-p", "The capital of France is", "-n", "9"})) << batch;
    EXPECT_EQ(out[1]["ids"], Alone({"--ids", "5,6,7", "-n", "2"})) << batch;
    EXPECT_EQ(out[2]["ids"],
              Alone({"-p", "Once upon a time", "-n", "6", "--temp", "0.8", "--seed", "7"}))
        << batch;
    EXPECT_EQ(out[3]["ids"], Alone({"--ids", "9", "-n", "12"})) << batch;
    EXPECT_EQ(out[4]["ids"], json::array());
    EXPECT_EQ(out[0]["finish_reason"], "length");
    EXPECT_TRUE(out[0]["text"].is_string());
    EXPECT_GT(out[0]["timings"]["finished_s"].get<double>(), 0);
    EXPECT_THAT(r.err, HasSubstr("tokens/s over the batch"));
    EXPECT_THAT(r.err, HasSubstr("read per emitted token"));
    const json report = json::parse(testing::ReadAll(dir_ / "batch.json"));
    EXPECT_EQ(report["sampled_tokens"], 9 + 2 + 6 + 12);
    if (std::string(batch) == "0") {
      EXPECT_EQ(report["batch"], 5);  // what the budget holds, at most 8, no more than prompts
      EXPECT_THAT(r.err, HasSubstr("(5 sequences of"));
    }
  }
}

TEST_F(GenerateBatchTest, MalformedLinesAreNamedAndRefuseOrAreSkipped) {
  const std::string prompts = Write("bad.jsonl", R"({"ids": [1, 2], "n_predict": 3}
{"ids": [1, 2}
{"ids": [3], "n_predict": 2, "colour": "blue"}
{"prompt": 5}
{"ids": [4], "n_predict": -1}
{"ids": [4], "top_p": 7, "greedy": false}
{"ids": [3, 1], "n_predict": 2}
)");
  auto refused = RunK3({"generate", "-m", dir_ / "m", "--prompts", prompts});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_EQ(refused.out, "");  // nothing generated
  EXPECT_THAT(refused.err, HasSubstr(prompts + ":2: not valid JSON"));
  EXPECT_THAT(refused.err, HasSubstr(prompts + ":3: unknown field \"colour\""));
  EXPECT_THAT(refused.err, HasSubstr(prompts + ":4: \"prompt\": not a string"));
  EXPECT_THAT(refused.err, HasSubstr(prompts + ":5: \"n_predict\" must be >= 0"));
  EXPECT_THAT(refused.err, HasSubstr(prompts + ":6: "));
  EXPECT_THAT(refused.err, HasSubstr("5 malformed line(s)"));
  auto skipped = RunK3({"generate", "-m", dir_ / "m", "--prompts", prompts, "--bad-lines", "skip"});
  ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_THAT(skipped.err, HasSubstr(":2: not valid JSON (skipped)"));
  const std::vector<json> out = Lines(skipped.out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["line"], 1);
  EXPECT_EQ(out[1]["line"], 7);
  EXPECT_EQ(out[1]["ids"], Alone({"--ids", "3,1", "-n", "2"}));
}

TEST_F(GenerateBatchTest, ABatchBeyondTheBudgetExitsTwoNamingTheMaximum) {
  const std::string prompts = Write("p.jsonl", "{\"ids\": [1]}\n{\"ids\": [2]}\n");
  // The minimum for one sequence, from the refusal of a budget below it.
  auto low = RunK3({"generate", "-m", dir_ / "m", "--prompts", prompts, "--ram-gb", "0.001",
                    "--batch", "1", "--max-context", "4096"});
  ASSERT_EQ(low.exit_code, 2) << low.err;
  const std::string marker = "minimum of ";
  const size_t at = low.err.find(marker);
  ASSERT_NE(at, std::string::npos) << low.err;
  ASSERT_NE(low.err.find(" MB", at), std::string::npos) << low.err;
  const double minimum_mb = std::stod(low.err.substr(at + marker.size()));
  // Room for one sequence, not two (each holds a 1.39 MB state here). ("ultra" is the minimum
  // of the batch asked for, so it always holds it.)
  const std::string budget = std::to_string((minimum_mb + 0.3) / 1000);
  auto r = RunK3({"generate", "-m", dir_ / "m", "--prompts", prompts, "--ram-gb", budget, "--batch",
                  "64", "--max-context", "4096"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--batch 64: the budget holds at most 1 sequence"));
  // With the automatic context the context shrinks for the batch asked for, down to one token;
  // below that the refusal names no smaller context as a way out.
  auto least = RunK3(
      {"generate", "-m", dir_ / "m", "--prompts", prompts, "--ram-gb", budget, "--batch", "64"});
  EXPECT_EQ(least.exit_code, 2) << least.err;
  EXPECT_THAT(least.err, HasSubstr("state at the least context, 1 token); use --batch "));
  EXPECT_THAT(least.err, Not(HasSubstr("--max-context")));
  auto shrunk = RunK3(
      {"generate", "-m", dir_ / "m", "--prompts", prompts, "--ram-gb", budget, "--batch", "4"});
  EXPECT_EQ(shrunk.exit_code, 0) << shrunk.err;
  EXPECT_THAT(shrunk.err, HasSubstr("holds a context of only"));
  EXPECT_THAT(shrunk.err, HasSubstr("lower --batch"));
}

TEST_F(GenerateBatchTest, CtrlCWritesWhatFinished) {
  // The first prompt ends after one token and is written; the second never ends on its own.
  const std::string prompts =
      Write("p.jsonl", "{\"ids\": [1], \"n_predict\": 1}\n{\"ids\": [2], \"n_predict\": 200000}\n");
  const std::string out = testing::ShellQuote(dir_ / "out.jsonl");
  auto r = testing::RunShell("\"$K3\" generate -m " + testing::ShellQuote(dir_ / "m") +
                             " --prompts " + testing::ShellQuote(prompts) +
                             " --batch 2 --max-context 250000 --ignore-eos --out " + out +
                             " & pid=$!; i=0; while [ ! -s " + out +
                             " ] && [ $i -lt 12000 ]; do sleep 0.005; i=$((i+1)); done;"
                             " kill -INT $pid; wait $pid");
  EXPECT_EQ(r.exit_code, 130) << r.err;
  const std::vector<json> lines = Lines(testing::ReadAll(dir_ / "out.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["finish_reason"], "length");
  EXPECT_EQ(lines[1]["finish_reason"], "interrupted");
  EXPECT_GE(lines[1]["ids"].size(), 1u);
}

}  // namespace
}  // namespace k3
