// The output parser (core/text/tools/turn_parser.h) on arbitrary replies, under four output specs
// (thinking on and off, no tools, tool_choice none). The input bytes are token ids: mostly the
// four markers and pieces of the tags, some other specials and any text token, so that the
// markup comes out nearly right, which is where the parser's states are. Invariants: nothing
// throws or crashes; the deltas add up to the result; every call is to a declared tool, indexed
// 0, 1, ... with a fresh id, and its arguments are a JSON object (unless a `json` block gave
// them verbatim); no marker id ever shows up as text; the ClosingIds end the message and add
// no text.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/synth/synth_tokenizer.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/output_spec.h"
#include "core/text/tools/turn_parser.h"
#include "nlohmann/json.hpp"

namespace {

using k3::TokenId;

void Check(bool ok) {
  if (!ok) std::abort();
}

// Text the model emits around and inside the markup. Byte 72 + i of the input feeds piece i.
constexpr const char* kPieces[] = {"think",
                                   "response",
                                   "tools",
                                   "call tool=\"get_weather\" index=\"1\"",
                                   "call",
                                   "argument key=\"city\" type=\"string\"",
                                   "argument key=\"days\" type=\"number\"",
                                   "argument",
                                   "json type=\"object\"",
                                   "json",
                                   "message",
                                   "Check.",
                                   "Paris",
                                   "2",
                                   "1e2",
                                   "[1,2]",
                                   "{\"x\": 1",
                                   "call tool=\"undeclared\"",
                                   "argument key=\"city\" type=\"null\"",
                                   "&amp;&quot;\"",
                                   " ",
                                   "d\xC3\xA9j\xC3",
                                   "\xA0 \xE2\x82\xAC",
                                   "<|open|>tools<|sep|>",
                                   "foo",
                                   "call tool=\"get_time\""};
constexpr int kFirstPiece = 72;
constexpr int kFirstAnyToken = kFirstPiece + sizeof(kPieces) / sizeof(kPieces[0]);

struct Setup {
  k3::Tokenizer tok;
  TokenId markers[4];           // <|open|>, <|close|>, <|sep|>, <|end_of_msg|>
  std::vector<TokenId> others;  // a few other specials
  std::vector<std::vector<TokenId>> pieces;
  std::vector<k3::OutputSpec> specs;
};

const Setup& GetSetup() {
  static const Setup* setup = [] {
    auto tok = k3::MakeSynthTokenizerInMemory(4096);
    Check(tok.ok());
    auto* s = new Setup{*std::move(tok), {}, {}, {}, {}};
    const char* names[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
    for (int i = 0; i < 4; ++i) s->markers[i] = s->tok.SpecialTokenId(names[i]).value_or(0);
    const auto specials = s->tok.SpecialTokens();
    for (size_t i = 0; i < 8; ++i) s->others.push_back(specials[(i * 37) % specials.size()].second);
    for (const char* p : kPieces) s->pieces.push_back(s->tok.Encode(p, /*allow_special=*/false));
    k3::OutputSpec tools;
    tools.tools.push_back({.name = "get_weather"});
    tools.tools.push_back({.name = "get_time"});
    k3::OutputSpec off = tools;
    off.thinking = false;
    k3::OutputSpec none = tools;
    none.tool_choice = k3::ToolChoice::kNone;
    s->specs = {tools, off, k3::OutputSpec{}, none};
    return s;
  }();
  return *setup;
}

std::vector<TokenId> ToIds(const Setup& s, const uint8_t* data, size_t size) {
  std::vector<TokenId> ids;
  for (size_t i = 0; i < size; ++i) {
    const int b = data[i];
    if (b < 64) {
      ids.push_back(s.markers[b % 4]);
    } else if (b < kFirstPiece) {
      ids.push_back(s.others[b - 64]);
    } else if (b < kFirstAnyToken) {
      const auto& piece = s.pieces[b - kFirstPiece];
      ids.insert(ids.end(), piece.begin(), piece.end());
    } else {
      const int next = i + 1 < size ? data[++i] : 0;
      ids.push_back(((b - kFirstAnyToken) * 256 + next) % s.tok.num_base_tokens());
    }
  }
  return ids;
}

void CheckCalls(const std::vector<k3::ToolCall>& calls, const k3::OutputSpec& spec) {
  for (size_t i = 0; i < calls.size(); ++i) {
    const k3::ToolCall& c = calls[i];
    Check(c.index == static_cast<int>(i));
    Check(c.id.size() == 29 && c.id.rfind("call_", 0) == 0);
    Check(c.id.find_first_not_of("0123456789abcdef", 5) == std::string::npos);
    Check(c.name == "get_weather" || c.name == "get_time");
    Check(!spec.tools.empty() && spec.tool_choice != k3::ToolChoice::kNone);
    if (!c.raw_arguments) {
      const auto parsed = nlohmann::json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
      Check(parsed.is_object());
    }
  }
}

void Run(const Setup& s, const std::vector<TokenId>& ids, const k3::OutputSpec& spec,
         bool text_has_pipe, size_t text_bytes) {
  k3::TurnParser parser(s.tok, spec, /*id_seed=*/1);
  std::string reasoning, content;
  std::vector<k3::ToolCall> calls;
  auto take = [&](const k3::TurnDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    calls.insert(calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  for (TokenId id : ids) take(parser.Feed(id));

  // Closing the reply from wherever it stopped ends the message and adds no text: at most it
  // releases what the end of the reply would (an unfinished character).
  k3::TurnParser closed(parser);
  for (TokenId id : closed.ClosingIds()) closed.Feed(id);
  Check(closed.result().ended && closed.ClosingIds().empty());
  const std::vector<TokenId> closing = parser.ClosingIds();
  take(parser.Finish());
  Check(parser.ClosingIds() == closing);
  const k3::ParsedTurn& turn = parser.result();
  Check(turn.reasoning_content == reasoning);
  Check(turn.content.value_or("") == content);
  Check(!turn.content.has_value() == (content.empty() && !calls.empty()));
  Check(turn.tool_calls.size() == calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    Check(turn.tool_calls[i].id == calls[i].id &&
          turn.tool_calls[i].arguments == calls[i].arguments);
  }
  CheckCalls(turn.tool_calls, spec);
  Check(closed.result().reasoning_content == turn.reasoning_content);
  Check(closed.result().content.value_or("") == content);
  Check((turn.FinishReason(true) == "tool_calls") == !calls.empty());
  // Text comes only from text tokens: every marker has a '|', so without one in the text no
  // marker can have leaked into it.
  Check(reasoning.size() + content.size() <= text_bytes);
  if (!text_has_pipe)
    Check(reasoning.find('|') == std::string::npos && content.find('|') == std::string::npos);
  Check(turn.warnings.size() <= 17);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Setup& s = GetSetup();
  const std::vector<TokenId> ids = ToIds(s, data, size);
  bool text_has_pipe = false;
  size_t text_bytes = 0;
  for (TokenId id : ids) {
    if (s.tok.IsSpecial(id)) continue;
    auto bytes = s.tok.TokenBytes(id);
    if (!bytes.ok()) continue;
    text_bytes += bytes->size();
    text_has_pipe = text_has_pipe || bytes->find('|') != std::string_view::npos;
  }
  for (const k3::OutputSpec& spec : s.specs) Run(s, ids, spec, text_has_pipe, text_bytes);
  return 0;
}
