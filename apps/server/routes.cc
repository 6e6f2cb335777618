#include "apps/server/routes.h"

#include <regex>
#include <vector>

#include "absl/strings/str_format.h"
#include "apps/server/route_handlers.h"

namespace k3::server {
namespace {

constexpr Route kRoutes[] = {
    {"POST", "/v1/chat/completions", "/v1/chat/completions", Access::kKey, ChatCompletions,
     "OpenAI's chat completions (stream: server-sent events ending 'data: [DONE]')"},
    {"POST", "/v1/completions", "/v1/completions", Access::kKey, Completions,
     "OpenAI's completions: a prompt as text or token ids"},
    {"GET", "/v1/models", "/v1/models", Access::kKey, Models, "the model served, and its context"},
    {"POST", "/v1/messages", "/v1/messages", Access::kKey, Messages,
     "Anthropic's Messages (stream: its server-sent events)"},
    {"POST", "/v1/messages/count_tokens", "/v1/messages/count_tokens", Access::kKey, CountTokens,
     "Anthropic's token count of a Messages request"},
    {"GET", "/health", "/health", Access::kPublic, Health,
     "200 once the model is open, 503 while draining"},
    {"GET", "/metrics", "/metrics", Access::kPublic, Metrics,
     "Prometheus text, the gateway's vLLM-named gauges among it (docs/SCALE.md)"},
    {"GET", "/k3/events", "/k3/events", Access::kKeyOrQuery, Events,
     "the engine step by step as server-sent events, at most 4 a second (docs/EVENTS.md)"},
    {"GET", "/", "/", Access::kPublic, Page, "the page: a chat with the model"},
    {"GET", "/pipeline", "/pipeline", Access::kPublic, Page, "the page: the engine live"},
    {"GET", "/assets/(.*)", "/assets/*", Access::kPublic, Asset, "the page's scripts and styles"},
    {"GET", "/k3/info", "/k3/info", Access::kPublic, Info, "what the page needs of the server"},
};

// A pattern with a group is a regular expression; the others are plain paths.
bool IsRegex(std::string_view pattern) { return pattern.find('(') != std::string_view::npos; }

bool Matches(const Route& route, size_t index, std::string_view path) {
  if (!IsRegex(route.pattern)) return path == route.pattern;
  static const std::vector<std::regex> compiled = [] {
    std::vector<std::regex> out;
    for (const Route& r : kRoutes)
      out.emplace_back(std::string(IsRegex(r.pattern) ? r.pattern : ""));
    return out;
  }();
  return std::regex_match(path.begin(), path.end(), compiled[index]);
}

}  // namespace

std::span<const Route> RouteTable() { return kRoutes; }

const Route* FindRoute(std::string_view path) {
  for (size_t i = 0; i < std::size(kRoutes); ++i) {
    if (Matches(kRoutes[i], i, path)) return &kRoutes[i];
  }
  return nullptr;
}

std::string_view RouteLabel(std::string_view path) {
  const Route* route = FindRoute(path);
  return route != nullptr ? route->label : kOtherLabel;
}

std::string RoutesHelp() {
  std::string out;
  for (const Route& r : kRoutes) {
    const std::string_view who = r.access == Access::kPublic ? " (no key)" : "";
    if (!out.empty()) out += "\n";
    absl::StrAppendFormat(&out, "  %-5s %-26s %s%s", r.method, r.label, r.help, who);
  }
  return out;
}

}  // namespace k3::server
