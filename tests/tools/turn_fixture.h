// The tool-calling tests' tokenizer (the synthetic demo checkpoint's, with the K3 special block)
// and model outputs written as XTML text: each of the four markers is its special id, the text
// between them ordinary tokens, split as BPE does or a byte a token.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/synth/synth_tokenizer.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/output_spec.h"
#include "core/text/tools/turn_parser.h"

namespace k3::testing {

class TurnFixture : public ::testing::Test {
 protected:
  enum class Split { kBpe, kBytes };

  static void SetUpTestSuite() {
    auto tok = MakeSynthTokenizerInMemory(kVocabSize);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = new Tokenizer(*std::move(tok));
    byte_ids_.fill(-1);
    for (TokenId id = 0; id < tok_->num_base_tokens(); ++id) {
      auto bytes = tok_->TokenBytes(id);
      if (bytes.ok() && bytes->size() == 1) byte_ids_[static_cast<uint8_t>((*bytes)[0])] = id;
    }
  }
  static void TearDownTestSuite() { delete tok_; }

  static TokenId Special(std::string_view name) { return *tok_->SpecialTokenId(name); }

  // `xtml` as the model would emit it: <|open|>, <|close|>, <|sep|> and <|end_of_msg|> are
  // special ids; every other byte is text.
  static std::vector<TokenId> Ids(std::string_view xtml, Split split = Split::kBpe) {
    static constexpr std::string_view kMarkers[] = {"<|open|>", "<|close|>", "<|sep|>",
                                                    "<|end_of_msg|>"};
    std::vector<TokenId> ids;
    std::string text;
    auto flush = [&] {
      AppendText(text, split, ids);
      text.clear();
    };
    size_t i = 0;
    while (i < xtml.size()) {
      bool marker = false;
      for (std::string_view m : kMarkers) {
        if (xtml.substr(i, m.size()) == m) {
          flush();
          ids.push_back(Special(m));
          i += m.size();
          marker = true;
          break;
        }
      }
      if (!marker) text += xtml[i++];
    }
    flush();
    return ids;
  }

  static void AppendText(std::string_view text, Split split, std::vector<TokenId>& ids) {
    if (split == Split::kBpe) {
      const std::vector<TokenId> t = tok_->Encode(text, /*allow_special=*/false);
      ids.insert(ids.end(), t.begin(), t.end());
      return;
    }
    for (char c : text) ids.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  }

  static OutputSpec Weather() {
    OutputSpec spec;
    spec.tools.push_back({.name = "get_weather"});
    spec.tools.push_back({.name = "get_time"});
    return spec;
  }

  // A parse fed one id at a time, with every delta kept.
  struct Run {
    ParsedTurn turn;
    std::vector<TurnDelta> deltas;
    std::string reasoning, content;  // the deltas' concatenation
    std::vector<ToolCall> calls;
  };
  static Run Parse(const std::vector<TokenId>& ids, const OutputSpec& spec) {
    TurnParser parser(*tok_, spec, /*id_seed=*/7);
    Run run;
    for (TokenId id : ids) run.deltas.push_back(parser.Feed(id));
    run.deltas.push_back(parser.Finish());
    for (const TurnDelta& d : run.deltas) {
      run.reasoning += d.reasoning;
      run.content += d.content;
      run.calls.insert(run.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    }
    run.turn = parser.result();
    return run;
  }

  static constexpr int64_t kVocabSize = 4096;  // the demo preset's
  static Tokenizer* tok_;
  static std::array<TokenId, 256> byte_ids_;
};

inline Tokenizer* TurnFixture::tok_ = nullptr;
inline std::array<TokenId, 256> TurnFixture::byte_ids_;

}  // namespace k3::testing
