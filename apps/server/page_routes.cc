// k3 serve's own page: GET / the chat, GET /pipeline the engine live, GET
// /assets/NAME their scripts and styles, and GET /k3/info what the page needs to know of the
// server. All public (the page asks the user for the API key and sends it on the API calls);
// every answer carries a Content-Security-Policy that lets the page run only its own files.
#include <string>
#include <string_view>

#include "apps/server/http_internal.h"
#include "apps/server/page_assets.h"
#include "apps/server/route_handlers.h"
#include "apps/server/server_context.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace k3::server {
namespace {

// The policy of every page answer: the page's own scripts and styles, no inline code, no
// plugins, no frames, requests only to this server.
constexpr std::string_view kPagePolicy =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

const PageAsset* FindAsset(std::string_view name) {
  for (const PageAsset& a : PageAssets()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

void Secure(httplib::Response& res) {
  res.set_header("Content-Security-Policy", std::string(kPagePolicy));
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
}

void SendAsset(const PageAsset& a, httplib::Response& res) {
  Secure(res);
  // The assets change only with the binary: a browser checks again on each load.
  res.set_header("Cache-Control", "no-cache");
  res.set_content(std::string(a.bytes), std::string(a.content_type));
}

}  // namespace

void Page(ServerContext&, const httplib::Request&, httplib::Response& res) {
  if (const PageAsset* a = FindAsset("index.html")) SendAsset(*a, res);
}

void Asset(ServerContext&, const httplib::Request& req, httplib::Response& res) {
  const PageAsset* a = FindAsset(req.matches[1].str());
  if (a == nullptr || a->name == "index.html") {
    res.status = 404;  // the error handler answers in the API's shape
    return;
  }
  SendAsset(*a, res);
}

void Info(ServerContext& server, const httplib::Request&, httplib::Response& res) {
  const ServerOptions& o = server.options();
  Secure(res);
  res.set_content(Dump({{"model", o.model_id},
                        {"api_key_required", !o.api_key.empty()},
                        {"context", server.service().max_context()},
                        {"max_tokens_default", o.default_max_tokens}}),
                  "application/json");
}

}  // namespace k3::server
