#include "core/text/tools/turn_parser.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

// A header is a tag and a few short attributes. A marker followed by pages of text without
// <|sep|> is no header, and must not be held in memory whole.
constexpr size_t kMaxHeader = 4096;
// A model stuck emitting stray markers must not grow the result without bound.
constexpr size_t kMaxWarnings = 16;

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// JSON text of a string: non-ASCII raw, as Python's json.dumps(ensure_ascii=False) writes it.
// Bytes that are not UTF-8 become U+FFFD, so that the text is always valid JSON.
std::string JsonString(std::string_view s) {
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string_view TrimJsonWhitespace(std::string_view s) {
  constexpr std::string_view kWhitespace = " \t\n\r";
  const size_t begin = s.find_first_not_of(kWhitespace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kWhitespace) - begin + 1);
}

// An argument's value as JSON text. A non-string value keeps the model's own literal (`1e2`,
// `[1,2]`, `1.50`), so that echoed back it renders the same ids (TOOLS.md section 10).
std::string ValueJson(std::string_view type, const std::string& body) {
  if (type == "string") return JsonString(body);
  if (type == "null") return "null";
  const std::string_view trimmed = TrimJsonWhitespace(body);
  // nlohmann skips a leading byte-order mark and stops at a NUL byte, neither of which would be
  // valid inside the object. No JSON value starts with the mark's first byte or holds a raw
  // NUL, so refusing them refuses nothing else.
  if (!trimmed.empty() && trimmed.front() != '\xEF' && trimmed.find('\0') == trimmed.npos &&
      nlohmann::json::accept(trimmed.begin(), trimmed.end())) {
    return std::string(trimmed);
  }
  return JsonString(body);
}

}  // namespace

size_t CompleteUtf8Prefix(std::string_view bytes) {
  // Only the last three bytes can start an unfinished character.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    // 0xF8 and above lead nothing: whole, like any other invalid byte.
    const size_t need = c >= 0xF8 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

std::vector<std::pair<std::string, std::string>> ParseHeaderAttributes(std::string_view attrs) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  while (i < attrs.size()) {
    if (!IsWordChar(attrs[i])) {
      ++i;
      continue;
    }
    // \w+ is greedy and '=' is no word character, so a match from inside this word would end
    // where this one does: a word that fails fails from every start within it.
    size_t end = i;
    while (end < attrs.size() && IsWordChar(attrs[end])) ++end;
    const size_t quote = end + 1;
    if (attrs.substr(end, 2) == "=\"") {
      const size_t close = attrs.find('"', quote + 1);
      if (close != std::string_view::npos) {
        const std::string raw(attrs.substr(quote + 1, close - quote - 1));
        const std::string value = absl::StrReplaceAll(raw, {{"&quot;", "\""}});
        out.emplace_back(attrs.substr(i, end - i), absl::StrReplaceAll(value, {{"&amp;", "&"}}));
        i = close + 1;
        continue;
      }
    }
    i = end;
  }
  return out;
}

std::string ParsedTurn::FinishReason(bool cut_at_max_tokens) const {
  if (!tool_calls.empty()) return "tool_calls";
  return cut_at_max_tokens ? "length" : "stop";
}

TurnParser::TurnParser(const Tokenizer& tokenizer, OutputSpec spec, std::optional<uint64_t> id_seed)
    : tok_(&tokenizer),
      spec_(std::move(spec)),
      open_(tokenizer.SpecialTokenId("<|open|>").value_or(-1)),
      close_(tokenizer.SpecialTokenId("<|close|>").value_or(-1)),
      sep_(tokenizer.SpecialTokenId("<|sep|>").value_or(-1)),
      end_(tokenizer.SpecialTokenId("<|end_of_msg|>").value_or(-1)),
      state_(spec_.thinking ? State::kThink : State::kResponse) {
  if (id_seed) {
    ids_.seed(*id_seed);
  } else {
    std::random_device device;
    ids_.seed((static_cast<uint64_t>(device()) << 32) ^ device());
  }
  result_.content.emplace();
}

TurnDelta TurnParser::Feed(int32_t id) {
  TurnDelta delta;
  if (finished_ || state_ == State::kEnded || id < 0) return delta;
  if (id == open_ || id == close_) {
    if (in_header_) Warn("a marker without <|sep|> dropped");
    in_header_ = true;
    closing_ = id == close_;
    header_overflow_ = false;
    header_.clear();
  } else if (id == sep_) {
    if (in_header_) {
      Header(delta);
    } else {
      Warn("a stray <|sep|> dropped");
    }
  } else if (id == end_) {
    if (in_header_) Warn("a marker without <|sep|> dropped at <|end_of_msg|>");
    in_header_ = false;
    DropPartialCall("a call still open at <|end_of_msg|> dropped");
    SetState(State::kEnded, delta);
    result_.ended = true;
  } else if (!tok_->IsSpecial(id)) {  // other special tokens ([EOS], reserved) carry no text
    auto bytes = tok_->TokenBytes(id);
    if (!bytes.ok()) return delta;
    if (!in_header_) {
      Text(*bytes, delta);
    } else if (header_.size() + bytes->size() > kMaxHeader) {
      header_overflow_ = true;
    } else if (!header_overflow_) {
      header_.append(bytes->data(), bytes->size());
    }
  }
  Settle();
  return delta;
}

TurnDelta TurnParser::Finish() {
  TurnDelta delta;
  if (finished_) return delta;
  finished_ = true;
  // An unfinished header adds nothing; it stays open for ClosingIds, which must end it.
  if (in_header_) Warn("an unfinished header dropped at the end of the reply");
  DropPartialCall("a call still open at the end of the reply dropped");
  Release(delta, /*all=*/true);
  Settle();
  return delta;
}

void TurnParser::Settle() {
  const bool null_content =
      result_.content && result_.content->empty() && !result_.tool_calls.empty();
  if (null_content) result_.content.reset();
}

TurnParser::Channel TurnParser::ChannelOf(State s) {
  switch (s) {
    case State::kThink:
      return Channel::kReasoning;
    case State::kAfterThink:
    case State::kResponse:
    case State::kAfterResponse:
      return Channel::kContent;
    default:
      return Channel::kNone;
  }
}

void TurnParser::SetState(State s, TurnDelta& delta) {
  // A character still unfinished when its channel ends never completes: it goes out as it is.
  if (ChannelOf(s) != ChannelOf(state_)) Release(delta, /*all=*/true);
  if (state_ == State::kThink && s != State::kThink) delta.reasoning_ended = true;
  state_ = s;
}

void TurnParser::Release(TurnDelta& delta, bool all) {
  const size_t n = all ? pending_.size() : CompleteUtf8Prefix(pending_);
  if (n == 0) return;
  const std::string_view out(pending_.data(), n);
  switch (ChannelOf(state_)) {
    case Channel::kReasoning:
      delta.reasoning.append(out);
      result_.reasoning_content.append(out);
      break;
    case Channel::kContent:
      delta.content.append(out);
      if (!result_.content) result_.content.emplace();
      result_.content->append(out);
      break;
    case Channel::kNone:
      break;
  }
  pending_.erase(0, n);
}

void TurnParser::Text(std::string_view bytes, TurnDelta& delta) {
  switch (state_) {
    case State::kAfterThink:
      // Text after the think close is the response, its open tag missing.
      SetState(State::kResponse, delta);
      [[fallthrough]];
    case State::kThink:
    case State::kResponse:
    case State::kAfterResponse:
      pending_.append(bytes);
      Release(delta, /*all=*/false);
      break;
    case State::kArgument:
    case State::kJson:
      body_.append(bytes);
      break;
    default:
      break;  // between tags of the tools block, or after the message: never content
  }
}

void TurnParser::Header(TurnDelta& delta) {
  in_header_ = false;
  if (header_overflow_) {
    Warn(absl::StrCat("a header longer than ", kMaxHeader, " bytes dropped"));
    return;
  }
  const std::string header = std::move(header_);
  header_.clear();
  const size_t space = header.find(' ');
  const std::string_view tag = std::string_view(header).substr(0, space);
  const std::string_view attrs =
      space == std::string::npos ? std::string_view() : std::string_view(header).substr(space + 1);
  if (closing_) {
    Close(tag, delta);
  } else {
    Open(tag, attrs, delta);
  }
}

bool TurnParser::InChannels() const { return ChannelOf(state_) != Channel::kNone; }

bool TurnParser::InToolsBlock() const {
  return state_ == State::kTools || state_ == State::kCall || state_ == State::kArgument ||
         state_ == State::kJson;
}

void TurnParser::Open(std::string_view tag, std::string_view attrs, TurnDelta& delta) {
  if (tag == "response" && InChannels()) {
    // Also ends an unclosed think channel (the model omits its close now and then).
    SetState(State::kResponse, delta);
  } else if ((tag == "tools" || tag == "call") && (InChannels() || state_ == State::kAfterTools)) {
    OpenTools(delta);  // a call without its tools block opens one: it is no content
    if (tag == "call") OpenCall(attrs);
  } else if (tag == "call" && InToolsBlock()) {
    DropPartialCall("a call opened inside an unclosed call: the first dropped");
    state_ = State::kTools;
    OpenCall(attrs);
  } else if ((tag == "argument" || tag == "json") &&
             (state_ == State::kCall || state_ == State::kArgument || state_ == State::kJson)) {
    if (state_ != State::kCall)
      Warn("an argument opened inside an unclosed one: the first dropped");
    body_.clear();
    state_ = tag == "json" ? State::kJson : State::kArgument;
    argument_ = {};
    for (auto& [key, value] : ParseHeaderAttributes(attrs)) {
      if (key == "key") argument_.key = std::move(value);
      if (key == "type") argument_.value = std::move(value);
    }
  } else {
    Warn(absl::StrCat("<|open|>", std::string(tag.substr(0, 64)), " dropped here"));
  }
}

void TurnParser::Close(std::string_view tag, TurnDelta& delta) {
  if (tag == "think" && state_ == State::kThink) {
    SetState(State::kAfterThink, delta);
  } else if (tag == "response" && InChannels()) {
    SetState(State::kAfterResponse, delta);
  } else if (tag == "argument" && state_ == State::kArgument) {
    EndArgument();
  } else if (tag == "json" && state_ == State::kJson) {
    EndArgument();
  } else if (tag == "call" &&
             (state_ == State::kCall || state_ == State::kArgument || state_ == State::kJson)) {
    // The call's close also closes a body the model left open.
    if (state_ != State::kCall) EndArgument();
    EndCall(delta);
  } else if (tag == "tools" && InToolsBlock()) {
    DropPartialCall("a call still open at <|close|>tools dropped");
    state_ = State::kAfterTools;
  } else if (tag == "message" && state_ != State::kMessageClosed) {
    DropPartialCall("a call still open at <|close|>message dropped");
    SetState(State::kMessageClosed, delta);
  } else {
    Warn(absl::StrCat("<|close|>", std::string(tag.substr(0, 64)), " dropped here"));
  }
}

void TurnParser::OpenTools(TurnDelta& delta) {
  SetState(State::kTools, delta);
  const bool none = spec_.tool_choice == ToolChoice::kNone;
  dropping_tools_ = spec_.tools.empty() || none;
  if (dropping_tools_) {
    result_.tools_block_dropped = true;
    Warn(none ? "a tools block under tool_choice none dropped"
              : "a tools block with no tools declared dropped");
  }
}

void TurnParser::OpenCall(std::string_view attrs) {
  call_.emplace();
  for (auto& [key, value] : ParseHeaderAttributes(attrs)) {
    if (key == "tool") call_->name = std::move(value);
  }
  state_ = State::kCall;
}

void TurnParser::EndArgument() {
  if (call_ && state_ == State::kJson) {
    call_->json = std::move(body_);
  } else if (call_) {
    std::string value = ValueJson(argument_.value, body_);
    auto& args = call_->arguments;
    auto same = std::find_if(args.begin(), args.end(),
                             [&](const Argument& a) { return a.key == argument_.key; });
    if (same != args.end()) {
      same->value = std::move(value);  // a repeated key replaces the value where it first was
    } else {
      args.push_back({argument_.key, std::move(value)});
    }
  }
  body_.clear();
  state_ = State::kCall;
}

void TurnParser::EndCall(TurnDelta& delta) {
  state_ = State::kTools;
  if (!call_) return;  // dropped already, at Finish
  PendingCall call = std::move(*call_);
  call_.reset();
  if (dropping_tools_) return;
  if (!Declared(call.name)) {
    ++result_.dropped_calls;
    Warn(absl::StrCat("a call to the undeclared tool \"", call.name.substr(0, 64), "\" dropped"));
    return;
  }
  ToolCall out;
  out.index = static_cast<int>(result_.tool_calls.size());
  out.id = NewCallId();
  out.name = std::move(call.name);
  if (call.json) {
    out.arguments = std::move(*call.json);
    out.raw_arguments = true;
  } else {
    out.arguments = "{";
    for (size_t i = 0; i < call.arguments.size(); ++i) {
      absl::StrAppend(&out.arguments, i > 0 ? "," : "", JsonString(call.arguments[i].key), ":",
                      call.arguments[i].value);
    }
    out.arguments += "}";
  }
  delta.tool_calls.push_back(out);
  result_.tool_calls.push_back(std::move(out));
}

void TurnParser::DropPartialCall(std::string_view why) {
  if (!call_) return;
  call_.reset();
  body_.clear();
  if (dropping_tools_) return;
  ++result_.dropped_calls;
  Warn(std::string(why));
}

bool TurnParser::Declared(std::string_view name) const {
  return std::any_of(spec_.tools.begin(), spec_.tools.end(),
                     [&](const ToolSpec& t) { return t.name == name; });
}

void TurnParser::Warn(std::string message) {
  if (result_.warnings.size() < kMaxWarnings) {
    result_.warnings.push_back(std::move(message));
  } else if (result_.warnings.size() == kMaxWarnings) {
    result_.warnings.push_back("further warnings left out");
  }
}

std::string TurnParser::NewCallId() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int word = 0; word < 2; ++word) {
    const uint64_t bits = ids_();
    for (int i = 0; i < (word == 0 ? 16 : 8); ++i) id += kHex[(bits >> (60 - 4 * i)) & 15];
  }
  return id;
}

std::vector<int32_t> TurnParser::ClosingIds() const {
  if (in_header_) {
    // The header the model began is finished first, then closed like any other state.
    TurnParser rest(*this);
    rest.finished_ = false;
    rest.Feed(sep_);
    std::vector<int32_t> ids = {sep_};
    const std::vector<int32_t> more = rest.ClosingIds();
    ids.insert(ids.end(), more.begin(), more.end());
    return ids;
  }
  std::vector<int32_t> ids;
  auto tag = [&](int32_t marker, std::string_view name) {
    ids.push_back(marker);
    const std::vector<TokenId> text = tok_->Encode(name, /*allow_special=*/false);
    ids.insert(ids.end(), text.begin(), text.end());
    ids.push_back(sep_);
  };
  switch (state_) {
    case State::kEnded:
      return ids;
    case State::kMessageClosed:
      ids.push_back(end_);
      return ids;
    case State::kThink:
      tag(close_, "think");
      [[fallthrough]];
    case State::kAfterThink:
      tag(open_, "response");
      [[fallthrough]];
    case State::kResponse:
      tag(close_, "response");
      break;
    case State::kArgument:
      tag(close_, "argument");
      break;
    case State::kJson:
      tag(close_, "json");
      break;
    default:
      break;
  }
  if (state_ == State::kArgument || state_ == State::kJson || state_ == State::kCall) {
    tag(close_, "call");
  }
  if (InToolsBlock()) tag(close_, "tools");
  tag(close_, "message");
  ids.push_back(end_);
  return ids;
}

}  // namespace k3
