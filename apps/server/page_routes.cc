#include "apps/server/page_routes.h"

#include <string>

#include "apps/server/http_internal.h"
#include "apps/server/page_assets.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace k3::server {
namespace {

constexpr std::string_view kAssetPrefix = "/assets/";

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

bool IsPagePath(std::string_view path) {
  return path == "/" || path == "/pipeline" || path == "/k3/info" || path.starts_with(kAssetPrefix);
}

void AddPageRoutes(httplib::Server& s, const PageInfo& info) {
  // The chat and the pipeline view are one page: its script opens the tab the path names.
  const auto page = [](const httplib::Request&, httplib::Response& res) {
    if (const PageAsset* a = FindAsset("index.html")) SendAsset(*a, res);
  };
  s.Get("/", page);
  s.Get("/pipeline", page);
  s.Get("/assets/([A-Za-z0-9._-]+)", [](const httplib::Request& req, httplib::Response& res) {
    const PageAsset* a = FindAsset(req.matches[1].str());
    if (a == nullptr || a->name == "index.html") {
      res.status = 404;  // the error handler answers in the API's shape
      return;
    }
    SendAsset(*a, res);
  });
  const std::string body = Dump({{"model", info.model_id},
                                 {"api_key_required", info.api_key_required},
                                 {"context", info.context},
                                 {"max_tokens_default", info.max_tokens_default}});
  s.Get("/k3/info", [body](const httplib::Request&, httplib::Response& res) {
    Secure(res);
    res.set_content(body, "application/json");
  });
}

}  // namespace k3::server
