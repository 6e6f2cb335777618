// Usage errors across the subcommands (CLI.md): each exits 2 with one line on stderr that
// names the flag or the file at fault, before any work is done.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;

struct UsageCase {
  const char* name;
  // Placeholders: FIXTURE is a model without a tokenizer, EMPTY an existing directory without
  // config.json, OUT a path that does not exist yet.
  std::vector<std::string> args;
  const char* message;  // a part of the one line, with the flag or file it names
};

void PrintTo(const UsageCase& c, std::ostream* os) { *os << c.name; }

class UsageErrorsTest : public ::testing::TestWithParam<UsageCase> {};

TEST_P(UsageErrorsTest, ExitsTwoWithOneLineNamingTheFlagOrFile) {
  testing::TempDir dir;
  std::filesystem::create_directory(dir / "empty");
  std::vector<std::string> args = GetParam().args;
  std::string message = GetParam().message;
  const std::pair<std::string, std::string> placeholders[] = {
      {"FIXTURE", testing::SharedDir() + "/fixtures/reference-tiny"},
      {"EMPTY", dir / "empty"},
      {"OUT", dir / "out"}};
  auto substitute = [&](std::string& s) {
    for (const auto& [key, value] : placeholders) {
      for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + value.size()))
        s.replace(at, key.size(), value);
    }
  };
  for (std::string& a : args) substitute(a);
  substitute(message);
  auto r = RunK3(args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(message));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

const UsageCase kCases[] = {
    // k3 generate
    {"generate_unknown_flag",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--bogus"},
     "unknown flag --bogus"},
    {"generate_flag_of_cache_sim",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--trace", "t.bin"},
     "flag --trace does not apply to 'k3 generate'"},
    {"generate_flag_of_chat",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--history", "h.json"},
     "flag --history does not apply to 'k3 generate'"},
    {"generate_prompt_with_ids",
     {"generate", "-m", "FIXTURE", "--prompt", "x", "--ids", "3"},
     "--prompt, --prompt-file and --ids exclude each other"},
    {"generate_ram_gb_with_preset",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--ram-gb", "1", "--preset", "laptop"},
     "--ram-gb, --preset and --trunk-gb/--cache-gb exclude each other"},
    {"generate_trunk_gb_alone",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--trunk-gb", "1"},
     "--trunk-gb and --cache-gb go together"},
    {"generate_queue_depth_zero",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--queue-depth", "0"},
     "--queue-depth 0: expected an integer in 1..4096"},
    {"generate_queue_depth_list",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--queue-depth", "1,2"},
     "--queue-depth: give one value here"},
    {"generate_threads_negative",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--threads", "-1"},
     "--threads must be in 0..1024"},
    {"generate_top_p_two",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--temp", "1", "--top-p", "2"},
     "--top-p must be in (0, 1]"},
    {"generate_n_predict_negative",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--n-predict", "-1"},
     "--n-predict must be >= 0"},
    {"generate_n_predict_not_a_number",
     {"generate", "-m", "FIXTURE", "--ids", "3", "-n", "many"},
     "invalid value 'many' for --n-predict"},
    {"generate_prefetch_distance_not_a_number",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--prefetch-distance", "x"},
     "--prefetch-distance x: expected an integer in 0..64"},
    {"generate_prefill_chunk_zero",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--prefill-chunk", "0"},
     "--prefill-chunk 0: must be auto or a number >= 1"},
    {"generate_missing_model_dir",
     {"generate", "-m", "OUT", "--ids", "3"},
     "--model OUT: no config.json there"},
    {"generate_model_dir_without_config",
     {"generate", "-m", "EMPTY", "--ids", "3"},
     "--model EMPTY: no config.json there"},
    {"generate_budget_below_minimum",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--ram-gb", "0.000001"},
     "is below this model's minimum"},
    {"generate_unknown_memory_preset",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--preset", "huge"},
     "--preset huge: unknown memory preset"},
    {"generate_prefetch_width_negative",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--prefetch-width", "-1"},
     "--prefetch-width must be >= 0"},
    {"generate_prefill_prefetch_distance_out_of_range",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--prefill-prefetch-distance", "65"},
     "--prefill-prefetch-distance must be in 0..64"},
    {"generate_max_context_zero",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--max-context", "0"},
     "--max-context 0: must be auto or a number >= 1"},
    {"generate_cache_gb_below_one_layer",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--trunk-gb", "1", "--cache-gb", "0.0000001"},
     "--cache-gb 1e-07: the expert cache needs at least"},
    {"generate_missing_trunk_pack",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--trunk", "OUT"},
     "--trunk OUT: no trunk.json there"},
    {"generate_missing_value",
     {"generate", "-m", "FIXTURE", "--ids", "3", "--n-predict"},
     "flag --n-predict needs a value"},
    // k3 chat
    {"chat_unknown_flag", {"chat", "-m", "FIXTURE", "--frob"}, "unknown flag --frob"},
    {"chat_flag_of_generate",
     {"chat", "-m", "FIXTURE", "--ids", "3"},
     "flag --ids does not apply to 'k3 chat'"},
    {"chat_n_predict_negative",
     {"chat", "-m", "FIXTURE", "--n-predict", "-1"},
     "--n-predict must be >= 0"},
    {"chat_negative_temp", {"chat", "-m", "FIXTURE", "--temp", "-1"}, "--temp must be >= 0"},
    {"chat_greedy_with_temp",
     {"chat", "-m", "FIXTURE", "--greedy", "--temp", "0.5"},
     "--greedy and --temp exclude each other"},
    {"chat_history_in_missing_dir",
     {"chat", "-m", "FIXTURE", "--history", "OUT/h.json"},
     "--history OUT/h.json: directory OUT does not exist"},
    {"chat_queue_depth_list",
     {"chat", "-m", "FIXTURE", "--queue-depth", "1,2"},
     "--queue-depth: give one value here"},
    {"chat_model_dir_without_config",
     {"chat", "-m", "EMPTY"},
     "--model EMPTY: no config.json there"},
    {"chat_model_without_tokenizer",
     {"chat", "-m", "FIXTURE"},
     "FIXTURE/tiktoken.model does not exist"},
    // k3 doctor
    {"doctor_missing_model_dir", {"doctor", "--model", "OUT"}, "--model OUT: no config.json there"},
    {"doctor_flag_of_generate",
     {"doctor", "--ram-gb", "4"},
     "flag --ram-gb does not apply to 'k3 doctor'"},
    {"doctor_stray_argument", {"doctor", "extra"}, "unexpected argument extra"},
    // k3 synth, pack, inspect
    {"synth_without_out", {"synth", "--preset", "demo"}, "--out DIR is required"},
    {"synth_flag_of_generate",
     {"synth", "--out", "OUT", "--ram-gb", "2"},
     "flag --ram-gb does not apply to 'k3 synth'"},
    {"pack_without_out", {"pack", "--model", "FIXTURE"}, "--out DIR is required"},
    {"pack_without_model", {"pack", "--out", "OUT"}, "--model DIR is required"},
    {"inspect_model_dir_without_config", {"inspect", "--model", "EMPTY"}, "EMPTY"},
    // k3 cache-sim, bench
    {"cache_sim_without_trace", {"cache-sim"}, "--trace FILE is required"},
    {"cache_sim_missing_trace_file", {"cache-sim", "--trace", "OUT"}, "opening OUT"},
    {"bench_without_model", {"bench"}, "--model DIR[,DIR...] is required"},
    {"bench_queue_depth_zero",
     {"bench", "--model", "FIXTURE", "--queue-depth", "0"},
     "--queue-depth 0: expected an integer in 1..4096"},
    {"bench_flag_of_chat",
     {"bench", "--system", "x"},
     "flag --system does not apply to 'k3 bench'"},
};

INSTANTIATE_TEST_SUITE_P(All, UsageErrorsTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace k3
