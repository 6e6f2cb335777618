// The tokenizer end to end, on a generated vocabulary with Kimi's layout (163,584 ranks, the K3
// special tokens at 163584..163839) so that MODEL.md 4.4's special-token vectors apply verbatim.
#include "core/text/tokenizer/tokenizer.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/test_vocab.h"
#include "tests/util/source_path.h"

namespace k3 {
namespace {

using tokenizer_testing::kKimiNumBase;
using Ids = std::vector<TokenId>;

class KimiShapedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_testing::TempDir dir;
    vocab_ = new std::vector<std::string>(
        tokenizer_testing::MakeVocab(tokenizer_testing::TestMerges(), kKimiNumBase));
    tokenizer_testing::WriteFile(dir.path() / "tiktoken.model",
                                 tokenizer_testing::TiktokenModelText(*vocab_));
    tokenizer_testing::WriteFile(
        dir.path() / "tokenizer_config.json",
        tokenizer_testing::TokenizerConfigText(tokenizer_testing::K3SpecialTokens()));
    absl::StatusOr<Tokenizer> tok = Tokenizer::Load(dir.path().string());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = new Tokenizer(*std::move(tok));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete vocab_;
  }

  // The rank of a token of the generated vocabulary.
  static TokenId Id(std::string_view bytes) {
    for (size_t i = 0; i < vocab_->size(); ++i) {
      if ((*vocab_)[i] == bytes) return static_cast<TokenId>(i);
    }
    ADD_FAILURE() << "no token " << bytes;
    return -1;
  }
  static std::string Decode(const Ids& ids) {
    absl::StatusOr<std::string> text = tok_->Decode(ids);
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? *text : "";
  }

  static std::vector<std::string>* vocab_;
  static Tokenizer* tok_;
};
std::vector<std::string>* KimiShapedTest::vocab_ = nullptr;
Tokenizer* KimiShapedTest::tok_ = nullptr;

TEST_F(KimiShapedTest, Layout) {
  EXPECT_EQ(tok_->num_base_tokens(), 163584);
  EXPECT_EQ(tok_->vocab_size(), 163840);
  EXPECT_EQ(tok_->SpecialTokenId("[BOS]"), 163584);
  EXPECT_EQ(tok_->SpecialTokenId("<|end_of_msg|>"), 163586);
  EXPECT_EQ(tok_->SpecialTokenId("<|media_pad|>"), 163605);
  EXPECT_EQ(tok_->SpecialTokenId("[PAD]"), 163839);
  EXPECT_FALSE(tok_->SpecialTokenId("hello").has_value());
  EXPECT_TRUE(tok_->IsSpecial(163584));
  EXPECT_TRUE(tok_->IsSpecial(163594));
  EXPECT_FALSE(tok_->IsSpecial(256));
  EXPECT_FALSE(tok_->IsSpecial(163840));
  EXPECT_EQ(tok_->SpecialTokens().size(), 256u);
  EXPECT_EQ(Decode({163594}), "<|reserved_token_163594|>");
  EXPECT_EQ(Decode({163649, 163838}), "<osagent_mode>[UNK]");
}

TEST_F(KimiShapedTest, SpecVectorsForSpecialTokens) {
  // MODEL.md 4.4; "  " is rank 256 in this vocabulary as in Kimi's.
  EXPECT_EQ(tok_->Encode("[BOS][EOS]", true), Ids({163584, 163585}));
  EXPECT_EQ(tok_->Encode("  <|end_of_msg|>  ", true), Ids({256, 163586, 256}));
  EXPECT_EQ(tok_->Encode(" ", true), Ids({' '}));
  EXPECT_EQ(tok_->Encode("\n\n\n", true), Ids({Id("\n\n\n")}));
}

TEST_F(KimiShapedTest, SpecialTokensAsTextWhenNotAllowed) {
  for (const std::string text : {"[BOS][EOS]", "  <|end_of_msg|>  ", "<|open|>x<|sep|>"}) {
    const Ids ids = tok_->Encode(text, false);
    for (TokenId id : ids) EXPECT_LT(id, kKimiNumBase) << text;
    EXPECT_EQ(Decode(ids), text);
  }
  EXPECT_EQ(tok_->Encode("[BOS]", false), Ids({'[', 'B', 'O', 'S', ']'}));
}

TEST_F(KimiShapedTest, MergesFollowRanks) {
  EXPECT_EQ(tok_->Encode("hello world", false), Ids({Id("hello"), Id(" world")}));
  EXPECT_EQ(tok_->Encode("Hello", false), Ids({Id("Hello")}));
  EXPECT_EQ(tok_->Encode("1234", false), Ids({Id("123"), '4'}));
  EXPECT_EQ(tok_->Encode("中文中", false), Ids({Id("中文"), Id("中")}));
  // "the": "he" outranks "th", and "the" is no token.
  EXPECT_EQ(tok_->Encode("the thing", false), Ids({'t', Id("he"), Id(" th"), Id("ing")}));
}

TEST_F(KimiShapedTest, SpecialSplitsPiecesAroundIt) {
  // "hello<|sep|>world": the special cuts "hello" off from "world".
  EXPECT_EQ(tok_->Encode("hello<|sep|>world", true),
            Ids({Id("hello"), 163589, 'w', Id("or"), Id("ld")}));
  // Adjacent and at the ends.
  EXPECT_EQ(tok_->Encode("<|open|><|close|>", true), Ids({163587, 163588}));
  EXPECT_EQ(tok_->Encode("<|open|", true).size(), 7u);
}

TEST(SpecialTokensTest, LongestMatchWins) {
  std::vector<std::pair<std::string, TokenId>> ranks;
  for (int b = 0; b < 256; ++b) ranks.emplace_back(std::string(1, static_cast<char>(b)), b);
  absl::StatusOr<Tokenizer> tok =
      Tokenizer::Create(ranks, {{256, "<|x|>"}, {257, "<|x|>y"}, {258, "<|x"}, {259, "|>"}});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->Encode("a<|x|>yb<|x|>c<|xz", true), Ids({'a', 257, 'b', 256, 'c', 258, 'z'}));
  // The longest at the leftmost position, not "<|x" followed by "|>".
  EXPECT_EQ(tok->Encode("<|x|>", true), Ids({256}));
  EXPECT_EQ(tok->Encode("y|>", true), Ids({'y', 259}));
}

TEST_F(KimiShapedTest, ReservedNamesAreSpecialTokensToo) {
  // As in the official tokenizer, which registers every slot's name with tiktoken.
  EXPECT_EQ(tok_->Encode("<|reserved_token_163594|>", true), Ids({163594}));
  EXPECT_GT(tok_->Encode("<|reserved_token_163594|>", false).size(), 1u);
}

TEST_F(KimiShapedTest, DecodeErrors) {
  EXPECT_EQ(tok_->Decode(Ids({163840})).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(tok_->Decode(Ids({-1})).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(tok_->Decode(Ids({1, 163840})).status().message().find("163840"), std::string::npos);
  EXPECT_EQ(Decode({}), "");
  EXPECT_EQ(tok_->TokenBytes(256).value(), "  ");
}

TEST(DecodeTest, GapInRanksIsAnError) {
  std::vector<std::pair<std::string, TokenId>> ranks;
  for (int b = 0; b < 256; ++b) ranks.emplace_back(std::string(1, static_cast<char>(b)), b);
  ranks.emplace_back("ab", 300);  // ranks 256..299 unused
  absl::StatusOr<Tokenizer> tok = Tokenizer::Create(ranks, {});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->num_base_tokens(), 301);
  EXPECT_EQ(tok->Encode("ab", false), Ids({300}));
  EXPECT_EQ(tok->Decode(Ids({280})).status().code(), absl::StatusCode::kNotFound);
}

std::vector<std::string> CorpusStrings() {
  std::ifstream in(testing::SourcePath("tests/tokenizer/parity_corpus.json"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const nlohmann::json corpus = nlohmann::json::parse(buffer.str());
  return corpus.at("strings").get<std::vector<std::string>>();
}

TEST_F(KimiShapedTest, RoundTripsTheCorpus) {
  const std::vector<std::string> corpus = CorpusStrings();
  ASSERT_GE(corpus.size(), 300u);
  for (const std::string& text : corpus) {
    EXPECT_EQ(Decode(tok_->Encode(text, false)), text);
    EXPECT_EQ(Decode(tok_->Encode(text, true)), text);
  }
}

TEST_F(KimiShapedTest, InvalidUtf8IsReplacedNotFatal) {
  const std::string fffd = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ab\xFF"
       "cd",
       "ab" + fffd + "cd"},
      {"\xC3", fffd},
      {"中\xE4\xB8", "中" + fffd},
      {"\xED\xA0\x80<|sep|>", fffd + fffd + fffd + "<|sep|>"},
      {std::string("\0\x80", 2), std::string("\0", 1) + fffd},
  };
  for (const auto& [input, repaired] : cases) {
    EXPECT_EQ(Decode(tok_->Encode(input, true)), repaired);
    EXPECT_EQ(tok_->Encode(input, true), tok_->Encode(repaired, true));
  }
}

TEST_F(KimiShapedTest, ChunkingCutsLongRunsAsUpstream) {
  // "c" + "dc" x 12500 is one run of 25,001 letters: the official encode cuts it after 25,000
  // characters, so the final "c" is encoded alone and the "d" before it cannot merge.
  std::string run = "c";
  for (int i = 0; i < 12500; ++i) run += "dc";
  Ids expected = {'c'};
  expected.insert(expected.end(), 12499, Id("dc"));
  expected.push_back('d');
  expected.push_back('c');
  EXPECT_EQ(tok_->Encode(run, false), expected);

  // Slices of 400,000 characters: the final " t" (a token) loses its space to the slice before.
  std::string text;
  for (int i = 0; i < 200'000; ++i) text += "a ";
  text += "t";
  const Ids ids = tok_->Encode(text, false);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(Ids(ids.end() - 2, ids.end()), Ids({' ', 't'}));
  EXPECT_EQ(tok_->Encode("a t", false), Ids({'a', Id(" t")}));
  EXPECT_EQ(Decode(ids), text);
}

TEST_F(KimiShapedTest, LongInputsAreFast) {
  const auto seconds = [](auto&& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::string no_spaces;
  for (int i = 0; i < 100'000; ++i) no_spaces.push_back("abcdefgh"[i * 7 % 8]);
  Ids ids;
  EXPECT_LT(seconds([&] { ids = tok_->Encode(no_spaces, false); }),
            tokenizer_testing::SlowBuildFactor());
  EXPECT_EQ(Decode(ids), no_spaces);

  std::string han;
  for (int i = 0; i < 40'000; ++i) han += "中文";
  EXPECT_LT(seconds([&] { ids = tok_->Encode(han, false); }), tokenizer_testing::SlowBuildFactor());
  EXPECT_EQ(Decode(ids), han);
}

TEST_F(KimiShapedTest, ConcurrentEncodesAgree) {
  const std::vector<std::string> corpus = CorpusStrings();
  std::vector<Ids> expected;
  for (const std::string& text : corpus) expected.push_back(tok_->Encode(text, true));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  const Tokenizer copy = *tok_;  // copies share the tables
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < corpus.size(); ++i) {
          mismatches[t] += copy.Encode(corpus[i], true) != expected[i];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

}  // namespace
}  // namespace k3
