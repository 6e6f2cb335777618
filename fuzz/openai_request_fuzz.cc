// The request parser of `k3 serve` on arbitrary bodies: the first byte picks the endpoint
// (even: chat, odd: completions), the rest is the body. Whatever comes in ends as a request or
// as a 400 naming what is wrong, never an exception; an accepted request is one the engine can
// run (a prompt, sampler settings ValidateSamplerOptions accepts, at most four stop strings),
// and parsing is deterministic. An accepted chat's messages render (or are refused by the
// renderer with a status, which the server answers with a 400), and its tools, tool choice and
// response format build the turn's grammar.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "apps/server/openai_request.h"
#include "core/text/chat_template.h"
#include "core/text/grammar/output_grammar.h"
#include "core/model/sampler.h"

using k3::server::Endpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Endpoint endpoint = data[0] % 2 == 0 ? Endpoint::kChat : Endpoint::kCompletion;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const k3::server::ParseResult r = k3::server::ParseCompletionRequest(body, endpoint);
  if (r.request.has_value() == r.error.has_value()) std::abort();
  if (r.error) {
    if (r.error->http_status != 400 || r.error->message.empty()) std::abort();
    // Messages quote what the client sent: the answer must still serialise.
    (void)r.error->ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return 0;
  }
  const k3::server::CompletionRequest& c = *r.request;
  if (endpoint == Endpoint::kChat) {
    if (c.messages.empty()) std::abort();
    for (const k3::ChatMessage& m : c.messages) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
        std::abort();
      }
    }
    (void)k3::RenderChatSegments(c.messages, c.chat);
    // The parser checked every schema: the grammar builds.
    if (c.output.constrained() && !k3::grammar::BuildOutputGrammar(c.output).ok()) std::abort();
  } else if (c.prompt_text.has_value() == !c.prompt_ids.empty() ||
             (c.prompt_text && c.prompt_text->empty())) {
    std::abort();
  }
  for (const int32_t id : c.prompt_ids) {
    if (id < 0) std::abort();
  }
  if (!k3::ValidateSamplerOptions(c.sampler).ok()) std::abort();
  if (c.stop.size() > 4) std::abort();
  for (const std::string& s : c.stop) {
    if (s.empty()) std::abort();
  }
  if (c.max_tokens && *c.max_tokens < 0) std::abort();
  const k3::server::ParseResult again = k3::server::ParseCompletionRequest(body, endpoint);
  if (!again.request || again.request->prompt_ids != c.prompt_ids ||
      again.request->messages.size() != c.messages.size() || again.request->stop != c.stop) {
    std::abort();
  }
  return 0;
}
