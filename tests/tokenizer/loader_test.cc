// The loader's handling of tiktoken.model and tokenizer_config.json, valid and malformed.
#include <string>
#include <vector>

#include "core/text/tokenizer/tiktoken_file.h"
#include "core/text/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/test_vocab.h"

namespace k3 {
namespace {

using tokenizer_testing::Base64Encode;
using tokenizer_testing::MakeVocab;
using tokenizer_testing::TempDir;
using tokenizer_testing::TiktokenModelText;
using tokenizer_testing::TokenizerConfigText;
using tokenizer_testing::WriteFile;

// The 256 byte tokens plus "ab", as tiktoken.model lines.
std::string SmallModel() { return TiktokenModelText(MakeVocab({"ab"}, 257)); }

// Loads `model` and `config` through files; returns the status.
absl::Status LoadStatus(const std::string& model, const std::string& config = "{}") {
  TempDir dir;
  WriteFile(dir.path() / "tiktoken.model", model);
  WriteFile(dir.path() / "tokenizer_config.json", config);
  return Tokenizer::Load(dir.path().string()).status();
}

void ExpectError(const absl::Status& status, const std::vector<std::string>& fragments) {
  ASSERT_FALSE(status.ok());
  for (const std::string& f : fragments) {
    EXPECT_NE(status.message().find(f), std::string_view::npos)
        << "missing \"" << f << "\" in: " << status.message();
  }
}

TEST(Base64Test, StrictDecoding) {
  std::string out;
  EXPECT_TRUE(tokenizer_internal::DecodeBase64("IQ==", &out));
  EXPECT_EQ(out, "!");
  EXPECT_TRUE(tokenizer_internal::DecodeBase64("ICA=", &out));
  EXPECT_EQ(out, "  ");
  EXPECT_TRUE(tokenizer_internal::DecodeBase64("5Lit5paH", &out));
  EXPECT_EQ(out, "中文");
  for (const char* bad : {"", "IQ", "IQ=", "I===", "====", "IR==", "I!==", "IQ==IQ==", "IQ=A"}) {
    EXPECT_FALSE(tokenizer_internal::DecodeBase64(bad, &out)) << bad;
  }
  for (int len = 0; len < 40; ++len) {
    std::string bytes;
    for (int i = 0; i < len; ++i) bytes.push_back(static_cast<char>(i * 37 + 11));
    if (len == 0) continue;
    ASSERT_TRUE(tokenizer_internal::DecodeBase64(Base64Encode(bytes), &out));
    EXPECT_EQ(out, bytes);
  }
}

TEST(LoaderTest, LoadsADirectory) {
  TempDir dir;
  WriteFile(dir.path() / "tiktoken.model", SmallModel());
  WriteFile(dir.path() / "tokenizer_config.json", TokenizerConfigText({{257, "[BOS]"}}));
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(dir.path().string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->num_base_tokens(), 257);
  EXPECT_EQ(tok->vocab_size(), 257 + 256);
  EXPECT_EQ(tok->SpecialTokenId("[BOS]"), 257);
  EXPECT_EQ(tok->Encode("ab", false), std::vector<TokenId>({256}));
}

TEST(LoaderTest, AcceptsCrlfAndEmptyLinesInAnyOrder) {
  std::string model;
  const std::vector<std::string> tokens = MakeVocab({"ab"}, 257);
  for (size_t r = tokens.size(); r-- > 0;) {
    model += Base64Encode(tokens[r]) + " " + std::to_string(r) + "\r\n\n";
  }
  EXPECT_TRUE(LoadStatus(model).ok()) << LoadStatus(model);
}

TEST(LoaderTest, MalformedModelLinesNameFileAndLine) {
  const std::string good = SmallModel();  // 257 lines
  ExpectError(LoadStatus(good + "!!!! 300\n"), {"tiktoken.model:258:", "invalid base64", "!!!!"});
  ExpectError(LoadStatus(good + "eHl6 12a\n"),
              {"tiktoken.model:258:", "rank \"12a\" is not a non-negative decimal integer"});
  ExpectError(LoadStatus(good + "eHl6 -5\n"), {"tiktoken.model:258:", "rank \"-5\""});
  ExpectError(LoadStatus(good + "eHl6\n"), {"tiktoken.model:258:", "expected"});
  ExpectError(LoadStatus(good + "eHl6 300 1\n"), {"tiktoken.model:258:", "two fields"});
  ExpectError(LoadStatus(good + " 300\n"), {"tiktoken.model:258:", "empty token"});
  ExpectError(LoadStatus(good + "eHl6 99999999999\n"), {"tiktoken.model:258:"});
  ExpectError(LoadStatus(good + "eHl6 16777216\n"), {"tiktoken.model:258:", "exceeds"});
}

TEST(LoaderTest, DuplicatesNameBothLines) {
  const std::string good = SmallModel();
  // "eHl6" is "xyz"; rank 10 is on line 11.
  ExpectError(LoadStatus(good + "eHl6 10\n"),
              {"tiktoken.model:258:", "rank 10 already given on line 11"});
  ExpectError(LoadStatus(good + Base64Encode("ab") + " 300\n"),
              {"tiktoken.model:258:", "already given on line 257"});
}

TEST(LoaderTest, EveryByteNeedsAToken) {
  std::vector<std::string> tokens = MakeVocab({"ab"}, 257);
  tokens[10] = "cd";  // byte 0x0A now has no token
  ExpectError(LoadStatus(TiktokenModelText(tokens)), {"tiktoken.model", "byte 0x0A"});
  ExpectError(LoadStatus(""), {"tiktoken.model", "no tokens"});
}

TEST(LoaderTest, MissingFilesAreNamed) {
  TempDir dir;
  ExpectError(Tokenizer::Load(dir.path().string()).status(), {"tiktoken.model"});
  WriteFile(dir.path() / "tiktoken.model", SmallModel());
  ExpectError(Tokenizer::Load(dir.path().string()).status(), {"tokenizer_config.json"});
  EXPECT_TRUE(Tokenizer::LoadFiles((dir.path() / "tiktoken.model").string(), "").ok());
}

TEST(LoaderTest, MalformedConfig) {
  const std::string model = SmallModel();
  ExpectError(LoadStatus(model, "{\n  \"added_tokens_decoder\": {\n    \"257\": {,}\n  }\n}"),
              {"tokenizer_config.json:3:", "invalid JSON"});
  ExpectError(LoadStatus(model, "[]"), {"tokenizer_config.json", "not an object"});
  ExpectError(LoadStatus(model, R"({"added_tokens_decoder": []})"),
              {"tokenizer_config.json", "added_tokens_decoder is not an object"});
  ExpectError(LoadStatus(model, R"({"added_tokens_decoder": {"bos": {"content": "[BOS]"}}})"),
              {"tokenizer_config.json", "\"bos\"", "not a decimal token id"});
  ExpectError(LoadStatus(model, R"({"added_tokens_decoder": {"257": {"special": true}}})"),
              {"tokenizer_config.json", "\"257\"", "content"});
  ExpectError(LoadStatus(model, R"({"added_tokens_decoder": {"257": {"content": 5}}})"),
              {"\"257\"", "content"});
  ExpectError(LoadStatus(model, R"({"added_tokens_decoder": {"257": {"content": ""}}})"),
              {"\"257\"", "empty"});
  ExpectError(LoadStatus(model, TokenizerConfigText({{257, "[X]"}, {258, "[X]"}})),
              {"special tokens 257 and 258", "[X]"});
  ExpectError(LoadStatus(model, TokenizerConfigText({{258, "<|reserved_token_257|>"}})),
              {"special tokens 257 and 258"});
}

TEST(LoaderTest, ConfigWithoutAddedTokensKeepsReservedNames) {
  TempDir dir;
  WriteFile(dir.path() / "tiktoken.model", SmallModel());
  WriteFile(dir.path() / "tokenizer_config.json", R"({"model_max_length": 1000})");
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(dir.path().string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->Decode(std::vector<TokenId>{257, 512}).value(),
            "<|reserved_token_257|><|reserved_token_512|>");
}

TEST(LoaderTest, AddedTokensOutsideTheSlotsAreIgnored) {
  // As upstream: only ids num_base .. num_base+255 are special-token slots.
  absl::StatusOr<Tokenizer> tok = Tokenizer::Create({{"a", 0}, {"b", 1}}, {}, TokenizerOptions{});
  EXPECT_FALSE(tok.ok());  // not every byte
  std::vector<std::pair<std::string, TokenId>> ranks;
  for (int b = 0; b < 256; ++b) ranks.emplace_back(std::string(1, static_cast<char>(b)), b);
  tok = Tokenizer::Create(ranks, {{3, "[LOW]"}, {600, "[HIGH]"}, {300, "[OK]"}});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE(tok->SpecialTokenId("[LOW]").has_value());
  EXPECT_FALSE(tok->SpecialTokenId("[HIGH]").has_value());
  EXPECT_EQ(tok->SpecialTokenId("[OK]"), 300);
  EXPECT_EQ(tok->vocab_size(), 512);
}

}  // namespace
}  // namespace k3
