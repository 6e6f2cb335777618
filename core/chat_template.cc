#include "core/chat_template.h"

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

// A piece of the rendered conversation: a structural marker (special token) or text.
struct Piece {
  bool special;
  std::string text;
};

class Builder {
 public:
  void Special(const char* name) { pieces_.push_back({true, name}); }
  void Text(std::string text) {
    if (!text.empty()) pieces_.push_back({false, std::move(text)});
  }
  // <|open|>tag attributes<|sep|>
  void Open(const std::string& tag_and_attributes) {
    Special("<|open|>");
    Text(tag_and_attributes);
    Special("<|sep|>");
  }
  // <|close|>tag<|sep|>
  void Close(const std::string& tag) {
    Special("<|close|>");
    Text(tag);
    Special("<|sep|>");
  }
  std::vector<Piece>& pieces() { return pieces_; }

 private:
  std::vector<Piece> pieces_;
};

absl::StatusOr<std::vector<Piece>> Render(std::span<const ChatMessage> messages,
                                          const ChatOptions& options) {
  Builder b;
  if (options.thinking_effort.has_value()) {
    b.Open("message role=\"system\" type=\"thinking-effort\"");
    b.Text(*options.thinking_effort);
    b.Special("<|end_of_msg|>");
  }
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("unknown chat role \"", m.role, "\""));
    }
    b.Open(absl::StrCat("message role=\"", m.role, "\""));
    if (m.role == "assistant") {
      b.Open("think");
      b.Text(m.thinking);
      b.Close("think");
      b.Open("response");
      b.Text(m.content);
      b.Close("response");
    } else {
      b.Text(m.content);
    }
    b.Special("<|end_of_msg|>");
  }
  if (options.add_generation_prompt) {
    b.Open("message role=\"assistant\"");
    b.Open("think");
  }
  return std::move(b.pieces());
}

}  // namespace

absl::StatusOr<std::vector<TokenId>> RenderChat(const Tokenizer& tokenizer,
                                                std::span<const ChatMessage> messages,
                                                const ChatOptions& options) {
  auto pieces = Render(messages, options);
  if (!pieces.ok()) return pieces.status();
  std::vector<TokenId> ids;
  for (const Piece& p : *pieces) {
    if (p.special) {
      auto id = tokenizer.SpecialTokenId(p.text);
      if (!id.has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the tokenizer has no special token ", p.text,
                         " (the chat template needs the Kimi K3 special tokens)"));
      }
      ids.push_back(*id);
    } else {
      std::vector<TokenId> text = tokenizer.Encode(p.text, /*allow_special=*/false);
      ids.insert(ids.end(), text.begin(), text.end());
    }
  }
  return ids;
}

absl::StatusOr<std::string> RenderChatText(std::span<const ChatMessage> messages,
                                           const ChatOptions& options) {
  auto pieces = Render(messages, options);
  if (!pieces.ok()) return pieces.status();
  std::string out;
  for (const Piece& p : *pieces) out += p.text;
  return out;
}

}  // namespace k3
