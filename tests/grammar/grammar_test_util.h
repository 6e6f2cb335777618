// Shared by the grammar tests: the demo tokenizer (the K3 special block at the top of a 4,096
// vocabulary), text with XTML markers as symbols or token ids, and the tools of TOOLS.md's
// examples.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/grammar/grammar.h"
#include "core/text/grammar/matcher.h"
#include "core/text/grammar/output_grammar.h"
#include "core/text/grammar/token_mask.h"
#include "core/synth/synth.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/output_spec.h"
#include "tests/util/temp_dir.h"

namespace k3::grammar::testing {

inline constexpr std::string_view kMarkers[] = {"<|end_of_msg|>", "<|open|>", "<|close|>",
                                                "<|sep|>"};

// A piece of `text`: a marker (its symbol, kEndOfMsg..kSep) or plain text.
struct Piece {
  int symbol = -1;
  std::string text;
};

inline std::vector<Piece> Pieces(std::string_view text) {
  std::vector<Piece> out;
  while (!text.empty()) {
    size_t at = std::string_view::npos;
    int which = -1;
    for (int m = 0; m < 4; ++m) {
      const size_t p = text.find(kMarkers[m]);
      if (p < at) at = p, which = m;
    }
    if (at > 0) out.push_back({-1, std::string(text.substr(0, std::min(at, text.size())))});
    if (which < 0) break;
    out.push_back({kEndOfMsg + which, ""});
    text.remove_prefix(at + kMarkers[which].size());
  }
  return out;
}

// `text` as symbols: markers are specials, everything else bytes.
inline std::vector<int> Symbols(std::string_view text) {
  std::vector<int> out;
  for (const Piece& p : Pieces(text)) {
    if (p.symbol >= 0) out.push_back(p.symbol);
    for (const char c : p.text) out.push_back(static_cast<unsigned char>(c));
  }
  return out;
}

// Whether the grammar accepts exactly `text` (markers as specials).
inline bool Accepts(const Grammar& g, std::string_view text) {
  Matcher m(std::make_shared<Grammar>(g));
  Matcher::State s = m.start();
  for (const int symbol : Symbols(text)) {
    s = m.Next(s, symbol);
    if (s == Matcher::kDead) return false;
  }
  return m.Accepting(s);
}

inline Grammar MustBuild(const OutputSpec& spec) {
  absl::StatusOr<Grammar> g = BuildOutputGrammar(spec);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Grammar{};
}

// TOOLS.md example C's get_weather (city string required, days integer) and get_time.
inline ToolSpec GetWeather() {
  return {"get_weather", nlohmann::ordered_json::parse(R"({"type":"object","properties":{
              "city":{"type":"string","description":"a city"},"days":{"type":"integer"}},
              "required":["city"]})"),
          true};
}
inline ToolSpec GetTime() {
  return {"get_time", nlohmann::ordered_json::parse(R"({"type":"object","properties":{}})"), true};
}

// The demo checkpoint's tokenizer and its trie, built once per test program (the directory is
// removed at exit).
struct Demo {
  Demo() {
    SynthOptions opt;
    opt.preset = "demo";
    opt.out_dir = dir.path();
    // Two layers: the first is dense, so the second gives the engine experts to stream.
    opt.overrides = {{"num_hidden_layers", "2"}, {"full_attn_layers", "2"}};
    const auto synth = Synthesize(opt);
    EXPECT_TRUE(synth.ok()) << synth.status();
    auto loaded = Tokenizer::Load(dir.path());
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    tok = std::make_unique<Tokenizer>(*std::move(loaded));
    auto built = TokenTrie::Build(*tok);
    EXPECT_TRUE(built.ok()) << built.status();
    trie = *std::move(built);
  }
  k3::testing::TempDir dir;
  std::unique_ptr<Tokenizer> tok;
  std::shared_ptr<const TokenTrie> trie;
};

class DemoVocab : public ::testing::Test {
 protected:
  static Demo& demo() {
    static Demo d;
    return d;
  }
  static const Tokenizer& tok() { return *demo().tok; }
  static const std::shared_ptr<const TokenTrie>& trie() { return demo().trie; }
  static TokenId Special(int symbol) { return trie()->special_id(symbol); }

  // `text` as token ids: markers as their special ids, the rest encoded with specials off.
  static std::vector<TokenId> Ids(std::string_view text) {
    std::vector<TokenId> out;
    for (const Piece& p : Pieces(text)) {
      if (p.symbol >= 0) out.push_back(Special(p.symbol));
      for (const TokenId id : tok().Encode(p.text, false)) out.push_back(id);
    }
    return out;
  }
};

}  // namespace k3::grammar::testing
