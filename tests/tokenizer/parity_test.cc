// Parity with the reference tokenizer: the npm package `tiktoken`, a WebAssembly build of
// OpenAI's Rust tokenizer, driven by oracle.cjs. Both sides use the o200k_base ranks that ship
// with the package (no Kimi vocabulary is available, MODEL.md 4.5) and the same pat_str:
// o200k's own, Kimi's, and two more OpenAI patterns. The corpora are parity_corpus.json and a
// sweep over every assigned code point.
//
// The oracle is found in $K3_BUILD_DIR/oracle (scripts/setup-deps.sh installs it; the test main
// sets K3_BUILD_DIR). Without it the tests are skipped, or fail when K3_REQUIRE_ORACLE=1.
// K3_PARITY_CORPUS=<file> runs another corpus of the same shape.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/text/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/test_vocab.h"
#include "tests/util/source_path.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<TokenId>;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

const char* EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

// Runs the oracle script; returns an error message or "".
std::string RunOracle(const std::vector<std::string>& args) {
  std::string command = ShellQuote(EnvOr("K3_NODE", "node")) + " " +
                        ShellQuote(testing::SourcePath("tests/tokenizer/oracle.cjs"));
  for (const std::string& a : args) {
    command += ' ';
    command += ShellQuote(a);
  }
  const int rc = std::system(command.c_str());
  if (rc == 0) return "";
  std::string message = "oracle failed (";
  message += std::to_string(rc);
  message += "): ";
  message += command;
  return message;
}

// Shows a string with its control characters escaped, for mismatch reports.
std::string Printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 160)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02x", u);
      out += buffer;
    } else {
      out.push_back(c);
    }
  }
  return s.size() > 160 ? out + "..." : out;
}

std::string IdsText(const Ids& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) {
    if (i > 0) out += ' ';
    out += std::to_string(ids[i]);
  }
  return ids.size() > 40 ? out + " ..." : out;
}

std::string HexToBytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

class ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    oracle_dir_ = new fs::path(fs::path(EnvOr("K3_BUILD_DIR", ".")) / "oracle");
    if (!fs::exists(*oracle_dir_ / "node_modules" / "tiktoken" / "package.json")) {
      setup_problem_ = new std::string(
          "the npm package tiktoken is not in " + oracle_dir_->string() +
          "; run scripts/setup-deps.sh <build dir> (or npm install --prefix <build dir>/oracle "
          "tiktoken@1)");
      return;
    }
    dir_ = new tokenizer_testing::TempDir();
    const std::string error = RunOracle({"export", oracle_dir_->string(), dir_->path().string()});
    if (!error.empty()) setup_problem_ = new std::string(error);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete oracle_dir_;
    delete setup_problem_;
    dir_ = nullptr;
    oracle_dir_ = nullptr;
    setup_problem_ = nullptr;
  }

  void SetUp() override {
    if (setup_problem_ == nullptr) return;
    if (std::string(EnvOr("K3_REQUIRE_ORACLE", "0")) == "1") FAIL() << *setup_problem_;
    GTEST_SKIP() << *setup_problem_;
  }

  static fs::path* oracle_dir_;
  static tokenizer_testing::TempDir* dir_;
  static std::string* setup_problem_;
};
fs::path* ParityTest::oracle_dir_ = nullptr;
tokenizer_testing::TempDir* ParityTest::dir_ = nullptr;
std::string* ParityTest::setup_problem_ = nullptr;

// Encodes the corpus at `corpus_path` (a JSON object with "strings" and "invalid_utf8_hex")
// with k3 and with the reference under the pattern `pattern_name`, with and without special
// tokens, and reports every difference (the first ten in detail).
void CompareWithReference(const fs::path& dir, const fs::path& oracle_dir,
                          const std::string& pattern_name, const fs::path& corpus_path) {
  const nlohmann::json patterns = nlohmann::json::parse(ReadFile(dir / "patterns.json"));
  const std::string pat_str = pattern_name == "kimi" ? std::string(kKimiPatStr)
                                                     : patterns.at(pattern_name).get<std::string>();
  TokenizerOptions options;
  options.pat_str = pat_str;
  absl::StatusOr<Tokenizer> tok = Tokenizer::LoadFiles(
      (dir / "tiktoken.model").string(), (dir / "tokenizer_config.json").string(), options);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->num_base_tokens(), 199998);

  // The oracle gets exactly our special tokens: o200k's two plus the reserved names.
  nlohmann::json specials = nlohmann::json::object();
  for (const auto& [content, id] : tok->SpecialTokens()) specials[content] = id;
  const nlohmann::json request = {{"model", (dir / "tiktoken.model").string()},
                                  {"pat_str", pat_str},
                                  {"special_tokens", specials},
                                  {"corpus", corpus_path.string()}};
  const std::string stem = corpus_path.stem().string() + "-" + pattern_name;
  const fs::path request_path = dir / ("request-" + stem + ".json");
  const fs::path out_path = dir / ("out-" + stem + ".json");
  tokenizer_testing::WriteFile(request_path, request.dump());
  const std::string error =
      RunOracle({"encode", oracle_dir.string(), request_path.string(), out_path.string()});
  ASSERT_EQ(error, "");
  const nlohmann::json reference = nlohmann::json::parse(ReadFile(out_path));
  const nlohmann::json corpus = nlohmann::json::parse(ReadFile(corpus_path));

  struct Case {
    std::string label;
    std::vector<std::string> inputs;
    const char* ordinary_key;
    const char* special_key;
  };
  std::vector<std::string> invalid;
  for (const auto& hex : corpus.at("invalid_utf8_hex")) invalid.push_back(HexToBytes(hex));
  const std::vector<Case> cases = {
      {"string", corpus.at("strings").get<std::vector<std::string>>(), "ordinary", "all_special"},
      {"invalid UTF-8", invalid, "invalid_ordinary", "invalid_all_special"}};

  int compared = 0, mismatches = 0;
  for (const Case& c : cases) {
    for (const bool allow_special : {false, true}) {
      const nlohmann::json& expected_all =
          reference.at(allow_special ? c.special_key : c.ordinary_key);
      ASSERT_EQ(expected_all.size(), c.inputs.size());
      for (size_t i = 0; i < c.inputs.size(); ++i) {
        const Ids expected = expected_all[i].get<Ids>();
        const Ids actual = tok->Encode(c.inputs[i], allow_special);
        ++compared;
        if (actual != expected && ++mismatches <= 10) {
          ADD_FAILURE() << pattern_name << ", " << c.label << " " << i
                        << (allow_special ? " (specials allowed)" : "") << ": \""
                        << Printable(c.inputs[i]) << "\"\n  k3:        " << IdsText(actual)
                        << "\n  reference: " << IdsText(expected);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  std::cout << "parity " << pattern_name << " on " << corpus_path.filename().string() << ": "
            << corpus.at("strings").size() << " strings + " << invalid.size() << " invalid UTF-8, "
            << compared << " encodings compared, " << mismatches << " mismatches\n";
}

TEST_P(ParityTest, SameIdsAsTheReference) {
  const fs::path corpus_path =
      EnvOr("K3_PARITY_CORPUS", testing::SourcePath("tests/tokenizer/parity_corpus.json").c_str());
  CompareWithReference(dir_->path(), *oracle_dir_, GetParam(), corpus_path);
}

// Every code point that PCRE2 10.42 knows as assigned (Unicode 14; private use and surrogates
// excluded), each twice between context characters that exercise every alternative of the
// patterns. Code points assigned later are left out: the reference's tables are newer, so
// their categories differ (a Unicode-version difference, not a translation one).
class SweepParityTest : public ParityTest {};

TEST_P(SweepParityTest, EveryAssignedCodePoint) {
  int error;
  PCRE2_SIZE offset;
  const std::string unassigned = R"(^[\p{Cn}\p{Co}\p{Cs}]$)";
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(unassigned.data()), unassigned.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  ASSERT_NE(code, nullptr);
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
  const std::vector<std::string> context = {" ",  "a",  "A", "1",      "'s",
                                            "\n", "中", "!", "\u0301", "  "};
  std::vector<std::string> strings;
  std::string current;
  int in_current = 0;
  uint32_t state = 1;
  for (char32_t c = 0x20; c < 0x110000; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const std::string ch = tokenizer_testing::Utf8(c);
    if (pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(ch.data()), ch.size(), 0, 0, match,
                    nullptr) >= 0) {
      continue;
    }
    state = state * 1103515245u + 12345u;
    current += context[(state >> 16) % context.size()] + ch + ch;
    if (++in_current == 200) {
      strings.push_back(std::move(current));
      current.clear();
      in_current = 0;
    }
  }
  if (!current.empty()) strings.push_back(current);
  pcre2_match_data_free(match);
  pcre2_code_free(code);
  EXPECT_GT(strings.size(), 700u);  // about 144,700 code points

  const fs::path corpus_path = dir_->path() / "sweep.json";
  tokenizer_testing::WriteFile(
      corpus_path,
      nlohmann::json{{"strings", strings}, {"invalid_utf8_hex", nlohmann::json::array()}}.dump());
  CompareWithReference(dir_->path(), *oracle_dir_, GetParam(), corpus_path);
}

INSTANTIATE_TEST_SUITE_P(Patterns, ParityTest,
                         ::testing::Values("o200k_base", "kimi", "cl100k_base", "gpt2"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });
INSTANTIATE_TEST_SUITE_P(Patterns, SweepParityTest, ::testing::Values("o200k_base", "kimi"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace k3
