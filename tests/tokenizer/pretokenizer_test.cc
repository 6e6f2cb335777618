#include "core/text/tokenizer/pretokenizer.h"

#include <chrono>
#include <string>
#include <vector>

#include "core/text/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/test_vocab.h"

namespace k3::tokenizer_internal {
namespace {

using Pieces = std::vector<std::string>;

Pieces Split(const PreTokenizer& p, std::string_view text) {
  std::vector<std::string_view> pieces;
  p.Split(text, &pieces);
  return Pieces(pieces.begin(), pieces.end());
}

class KimiPatternTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<PreTokenizer> p = PreTokenizer::Create(kKimiPatStr);
    ASSERT_TRUE(p.ok()) << p.status();
    kimi_ = new PreTokenizer(*std::move(p));
  }
  static void TearDownTestSuite() { delete kimi_; }
  static PreTokenizer* kimi_;
};
PreTokenizer* KimiPatternTest::kimi_ = nullptr;

TEST_F(KimiPatternTest, IntersectionsBecomeSingleClasses) {
  const std::string& pattern = kimi_->pcre2_pattern();
  EXPECT_NE(pattern.find(R"([^\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}]*)"), std::string::npos)
      << pattern;
  EXPECT_NE(pattern.find(R"([^\p{Lt}\p{Lu}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}]+)"),
            std::string::npos)
      << pattern;
  EXPECT_EQ(pattern.find("&&"), std::string::npos);
  EXPECT_EQ(pattern.find("\\s"), std::string::npos);  // explicit White_Space instead
}

TEST_F(KimiPatternTest, SplitsLikeTheReference) {
  EXPECT_EQ(Split(*kimi_, "Hello, world!"), Pieces({"Hello", ",", " world", "!"}));
  EXPECT_EQ(Split(*kimi_, "1234567890"), Pieces({"123", "456", "789", "0"}));
  EXPECT_EQ(Split(*kimi_, "中文测试：你好世界"), Pieces({"中文测试", "：", "你好世界"}));
  EXPECT_EQ(Split(*kimi_, "  <|end_of_msg|>  "),
            Pieces({" ", " <|", "end", "_of", "_msg", "|>", "  "}));
  EXPECT_EQ(Split(*kimi_, "a   b\r\n\r\nc\t\td"),
            Pieces({"a", "  ", " b", "\r\n\r\n", "c", "\t", "\td"}));
  EXPECT_EQ(Split(*kimi_, "x\n\n\ny"), Pieces({"x", "\n\n\n", "y"}));
}

TEST_F(KimiPatternTest, HanRunsAreSeparateFromOtherLetters) {
  EXPECT_EQ(Split(*kimi_, "abc中文def"), Pieces({"abc", "中文", "def"}));
  EXPECT_EQ(Split(*kimi_, "日本語のテキスト"), Pieces({"日本語", "のテキスト"}));
  EXPECT_EQ(Split(*kimi_, "한국어中文"), Pieces({"한국어", "中文"}));
  // U+3002 and U+3001 are Common script, Han only by Script_Extensions.
  EXPECT_EQ(Split(*kimi_, "中。文、"), Pieces({"中", "。", "文", "、"}));
}

TEST_F(KimiPatternTest, ContractionsInAnyCase) {
  EXPECT_EQ(Split(*kimi_, "I'M we'LL they'Re it's"),
            Pieces({"I'M", " we'LL", " they'Re", " it's"}));
  // Simple case folding: U+017F (long s) folds to 's' in both engines.
  EXPECT_EQ(Split(*kimi_, "it'\u017f"), Pieces({"it'\u017f"}));
  EXPECT_EQ(Split(*kimi_, "don'tx"), Pieces({"don't", "x"}));
}

TEST_F(KimiPatternTest, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+180E is Cf since Unicode 6.3: not \s in Rust, though PCRE2's own \s still matches it.
  EXPECT_EQ(Split(*kimi_, "a\u180e b"), Pieces({"a", "\u180e", " b"}));
  EXPECT_EQ(Split(*kimi_, "a\u3000b"), Pieces({"a", "\u3000b"}));
  EXPECT_EQ(Split(*kimi_, "a\u00a0\u00a0b"), Pieces({"a", "\u00a0", "\u00a0b"}));
}

TEST_F(KimiPatternTest, LongRunsAreFastAndWhole) {
  const auto seconds = [](auto&& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::string upper;
  for (int i = 0; i < 100'000; ++i) upper.push_back(static_cast<char>('A' + i % 26));
  std::string marks;
  for (int i = 0; i < 50'000; ++i) marks += "\u0301";
  const std::vector<std::string> inputs = {std::string(100'000, 'a'), upper,
                                           std::string(100'000, ' '), marks};
  for (const std::string& text : inputs) {
    Pieces pieces;
    EXPECT_LT(seconds([&] { pieces = Split(*kimi_, text); }), tokenizer_testing::SlowBuildFactor());
    ASSERT_EQ(pieces.size(), 1u);
    EXPECT_EQ(pieces[0].size(), text.size());
  }
  Pieces digits = Split(*kimi_, std::string(100'000, '7'));
  EXPECT_EQ(digits.size(), 33'334u);
}

TEST(TranslatePatternTest, RefusesConstructsThatDifferBetweenEngines) {
  EXPECT_FALSE(TranslatePattern(R"(\w+)").ok());
  EXPECT_FALSE(TranslatePattern(R"(\bfoo)").ok());
  EXPECT_FALSE(TranslatePattern(R"([a-z--[aeiou]])").ok());
  EXPECT_FALSE(TranslatePattern(R"([abc)").ok());
  EXPECT_FALSE(PreTokenizer::Create(R"(\p{NoSuchProperty})").ok());
  const absl::Status status = PreTokenizer::Create(R"((unbalanced)").status();
  EXPECT_NE(status.message().find("PCRE2"), std::string_view::npos) << status;
}

TEST(TranslatePatternTest, GeneralIntersectionsAndNestedClasses) {
  absl::StatusOr<PreTokenizer> consonants = PreTokenizer::Create(R"([a-z&&[^aeiou]]+)");
  ASSERT_TRUE(consonants.ok()) << consonants.status();
  EXPECT_EQ(Split(*consonants, "bcdaefgo"), Pieces({"bcd", "fg"}));

  absl::StatusOr<PreTokenizer> nested = PreTokenizer::Create(R"([a[0-9]]+|[^\sa0-9]+)");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(Split(*nested, "a1b2 -a"), Pieces({"a1", "b", "2", "-", "a"}));

  absl::StatusOr<PreTokenizer> negated = PreTokenizer::Create(R"([^\p{L}&&\p{Han}]+)");
  ASSERT_TRUE(negated.ok()) << negated.status();  // everything but Han letters
  EXPECT_EQ(Split(*negated, "ab中文cd"), Pieces({"ab", "cd"}));

  // Literal punctuation stays literal after the rewrite.
  absl::StatusOr<PreTokenizer> punct = PreTokenizer::Create(R"([-^\]a]+)");
  ASSERT_TRUE(punct.ok()) << punct.status();
  EXPECT_EQ(Split(*punct, "x-^]ay"), Pieces({"-^]a"}));

  absl::StatusOr<PreTokenizer> escapes = PreTokenizer::Create(R"(\x41\u{42}[\x{43}-\x{44}]\v)");
  ASSERT_TRUE(escapes.ok()) << escapes.status();
  EXPECT_EQ(Split(*escapes, "ABD\x0b ABC\n"), Pieces({"ABD\x0b"}));
}

TEST(TranslatePatternTest, ScriptNamesMeanScript) {
  absl::StatusOr<PreTokenizer> greek = PreTokenizer::Create(R"(\p{Greek}+|\p{sc=Latin}+)");
  ASSERT_TRUE(greek.ok()) << greek.status();
  EXPECT_EQ(Split(*greek, "αβγabc"), Pieces({"αβγ", "abc"}));
  EXPECT_NE(greek->pcre2_pattern().find(R"(\p{sc:Greek})"), std::string::npos);
}

}  // namespace
}  // namespace k3::tokenizer_internal
