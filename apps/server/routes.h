// The routes of `k3 serve`, in one table: each one's method, path, handler, the label
// /metrics counts its requests under, who may call it, and the line `k3 serve --help` gives it.
// The HTTP server registers its handlers from the table and labels what it answers by it.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace httplib {
class Request;
class Response;
}  // namespace httplib

namespace k3::server {

class ServerContext;

using RouteHandler = void (*)(ServerContext& server, const httplib::Request& req,
                              httplib::Response& res);

enum class Access {
  kKey,         // the API key, when the server has one
  kKeyOrQuery,  // the same, or as ?key= (a browser's EventSource sets no headers)
  kPublic,      // none: the probes, the gateway's scrapes and the page
};

struct Route {
  std::string_view method;   // "GET" or "POST"
  std::string_view pattern;  // the path, or an httplib pattern (a regular expression)
  std::string_view label;    // the path label of k3_http_requests_total
  Access access;
  RouteHandler handler;
  std::string_view help;  // one line
};

std::span<const Route> RouteTable();

// The route whose pattern `path` matches (whatever the method), or null.
const Route* FindRoute(std::string_view path);
// The label /metrics counts a request for `path` under: its route's, else kOtherLabel, so that
// a client cannot grow the table.
inline constexpr std::string_view kOtherLabel = "other";
std::string_view RouteLabel(std::string_view path);

// The table as `k3 serve --help` lists it, a line a route (no newline after the last).
std::string RoutesHelp();

}  // namespace k3::server
