// k3 serve's own page: GET / the chat, GET /pipeline the engine live, GET
// /assets/NAME their scripts and styles, and GET /k3/info what the page needs to know of the
// server. All public (the page asks the user for the API key and sends it on the API calls);
// every answer carries a Content-Security-Policy that lets the page run only its own files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace httplib {
class Server;
}  // namespace httplib

namespace k3::server {

// The policy of every page answer: the page's own scripts and styles, no inline code, no
// plugins, no frames, requests only to this server.
inline constexpr std::string_view kPagePolicy =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

struct PageInfo {
  std::string model_id;
  bool api_key_required = false;
  int64_t context = 0;             // tokens a sequence
  int32_t max_tokens_default = 0;  // when a request gives none
};

// The routes above on `server`.
void AddPageRoutes(httplib::Server& server, const PageInfo& info);

// Whether `path` is one of the page's routes, which need no API key.
bool IsPagePath(std::string_view path);

}  // namespace k3::server
